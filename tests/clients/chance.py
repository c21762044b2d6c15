"""A client whose first statement depends on chance, not on the database: the same order sends another statement."""

import os
import random

import psycopg

with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
    conn.execute(f"SELECT {random.randrange(1 << 30)}")
    conn.execute("SELECT 1")
