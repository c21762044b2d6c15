"""A withdrawal as an application writes it, with psycopg: read the balance, compute, write it back.

``--for-update`` locks the row as it reads it (the cure). Connects with ``DATABASE_URL``.
"""

import os
import sys

import psycopg

lock = " FOR UPDATE" if "--for-update" in sys.argv else ""
with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
    row = conn.execute("SELECT balance FROM accounts WHERE id = 1" + lock).fetchone()
    assert row is not None
    (balance,) = row
    conn.execute(f"UPDATE accounts SET balance = {balance - 100} WHERE id = 1")
    conn.commit()
