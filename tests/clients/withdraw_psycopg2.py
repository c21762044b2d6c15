"""The withdrawal with psycopg2 (libpq's own protocol use: simple queries, values in the text).

``--for-update`` locks the row as it reads it (the cure). Connects with ``DATABASE_URL``.
"""

import os
import sys

import psycopg2

lock = " FOR UPDATE" if "--for-update" in sys.argv else ""
conn = psycopg2.connect(os.environ["DATABASE_URL"])
try:
    cur = conn.cursor()
    cur.execute("SELECT balance FROM accounts WHERE id = %s" + lock, (1,))
    row = cur.fetchone()
    assert row is not None
    cur.execute("UPDATE accounts SET balance = %s WHERE id = %s", (row[0] - 100, 1))
    conn.commit()
finally:
    conn.close()
