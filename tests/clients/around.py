"""A client that connects around pgrace's proxy, straight to the server (``AROUND_HOST``/``AROUND_PORT``)."""

import os

import psycopg

with psycopg.connect(host=os.environ["AROUND_HOST"], port=os.environ["AROUND_PORT"], autocommit=True) as conn:
    conn.execute("UPDATE accounts SET balance = balance - 1 WHERE id = 1")
