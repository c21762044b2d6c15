"""A worker's claim with psycopg2: read the first pending job, then mark it claimed.

``--skip-locked`` reads with ``FOR UPDATE SKIP LOCKED`` (the cure). Connects with ``DATABASE_URL``.
"""

import os
import sys

import psycopg2

lock = " FOR UPDATE SKIP LOCKED" if "--skip-locked" in sys.argv else ""
conn = psycopg2.connect(os.environ["DATABASE_URL"])
try:
    cur = conn.cursor()
    cur.execute("SELECT id FROM jobs WHERE status = 'pending' ORDER BY id LIMIT 1" + lock)
    row = cur.fetchone()
    if row is not None:
        cur.execute("UPDATE jobs SET status = 'claimed', claims = claims + 1 WHERE id = %s", (row[0],))
    conn.commit()
finally:
    conn.close()
