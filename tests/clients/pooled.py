"""Two connections of one process, as a pool holds them: the first stays idle while the second withdraws."""

import os

import psycopg

with psycopg.connect(os.environ["DATABASE_URL"]) as idle, psycopg.connect(os.environ["DATABASE_URL"]) as busy:
    row = busy.execute("SELECT balance FROM accounts WHERE id = 1").fetchone()
    assert row is not None
    busy.execute(f"UPDATE accounts SET balance = {row[0] - 100} WHERE id = 1")
    busy.commit()
    idle.execute("SELECT 1")
