"""A client that locks the row, then writes its pid to the file named by its argument and works (sleeps) a minute.

The pid is written once the lock's result has reached the client: from then on only its own work keeps it alive."""

import os
import sys
import time

import psycopg

with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
    conn.execute("SELECT balance FROM accounts WHERE id = 1 FOR UPDATE")
    with open(sys.argv[1] + ".part", "w") as f:
        f.write(str(os.getpid()))
    os.rename(sys.argv[1] + ".part", sys.argv[1])
    time.sleep(60)
