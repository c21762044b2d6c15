"""The withdrawal with psycopg2 (libpq's own protocol use: simple queries, values in the text).

``--for-update`` locks the row as it reads it (the cure). Connects with ``DATABASE_URL``.
``--late S`` connects S seconds after it starts and ``--pause S`` works S seconds between its
connection and its first statement: an application that is slower than the others, which pgrace
waits for (a sleeping process is not a settled one).
"""

import argparse
import os
import time

import psycopg2

parser = argparse.ArgumentParser()
parser.add_argument("--for-update", action="store_true")
parser.add_argument("--late", type=float, default=0.0)
parser.add_argument("--pause", type=float, default=0.0)
args = parser.parse_args()
lock = " FOR UPDATE" if args.for_update else ""
time.sleep(args.late)
conn = psycopg2.connect(os.environ["DATABASE_URL"])
try:
    time.sleep(args.pause)
    cur = conn.cursor()
    cur.execute("SELECT balance FROM accounts WHERE id = %s" + lock, (1,))
    row = cur.fetchone()
    assert row is not None
    cur.execute("UPDATE accounts SET balance = %s WHERE id = %s", (row[0] - 100, 1))
    conn.commit()
finally:
    conn.close()
