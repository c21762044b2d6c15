"""A worker's claim with psycopg 3 (sync): read the first pending job, then mark it claimed.

``--skip-locked`` reads with ``FOR UPDATE SKIP LOCKED`` (the cure). Connects with ``DATABASE_URL``.
"""

import os
import sys

import psycopg

lock = " FOR UPDATE SKIP LOCKED" if "--skip-locked" in sys.argv else ""
with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
    row = conn.execute("SELECT id FROM jobs WHERE status = 'pending' ORDER BY id LIMIT 1" + lock).fetchone()
    if row is not None:
        conn.execute("UPDATE jobs SET status = 'claimed', claims = claims + 1 WHERE id = %s", (row[0],))
    conn.commit()
