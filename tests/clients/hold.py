"""A client that writes its pid to the file named by its argument, locks the row, then works (sleeps) a minute."""

import os
import sys
import time

import psycopg

with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
    conn.execute("SELECT balance FROM accounts WHERE id = 1 FOR UPDATE")
    time.sleep(60)
