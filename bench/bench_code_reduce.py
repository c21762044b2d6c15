"""explore_code reduced against its choice tree (``reduce=False``): runs and seconds, per example.

Each example's sessions are explored both ways on one embedded server (the scratch
database included); the outcome classes must be the same, and the table gives the runs
and the wall time of each. The four-session example's choice tree is too big to walk
here (hundreds of thousands of schedules): only its reduced search runs.

    python bench/bench_code_reduce.py
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "code"))
from withdraw_psycopg import withdraw, withdraw_locked

from pgrace.drivers.code import explore_code
from pgrace.model.exploration import Exploration
from pgrace.servers import open_server

ACCOUNTS = "CREATE TABLE accounts (id int PRIMARY KEY, balance int); INSERT INTO accounts VALUES (1, 500)"
SAVINGS = "CREATE TABLE savings (id int PRIMARY KEY, balance int); INSERT INTO savings VALUES (1, 50)"
BALANCE = "SELECT balance FROM accounts WHERE id = 1"
BOTH = "SELECT (SELECT balance FROM accounts WHERE id = 1), (SELECT balance FROM savings WHERE id = 1)"
JOBS = "CREATE TABLE jobs (id int PRIMARY KEY, owner text); INSERT INTO jobs VALUES (1, NULL), (2, NULL)"


def withdraw_repeatable(conn: Any) -> None:
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    withdraw(conn)


def deposit(conn: Any) -> None:
    (balance,) = conn.execute("SELECT balance FROM savings WHERE id = 1").fetchone()
    conn.execute("UPDATE savings SET balance = %s WHERE id = 1", (balance + 10,))
    conn.commit()


def claim(conn: Any) -> None:
    row = conn.execute("SELECT id FROM jobs WHERE owner IS NULL ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED").fetchone()
    if row is not None:
        conn.execute("UPDATE jobs SET owner = %s WHERE id = %s", ("w", row[0]))
    conn.commit()


Sessions = dict[str, Callable[[Any], object]]
EXAMPLES: list[tuple[str, Sessions, str, str, bool]] = [  # name, sessions, setup, final, walk the tree too
    ("lost update ×2", {"alice": withdraw, "bob": withdraw}, ACCOUNTS, BALANCE, True),
    ("FOR UPDATE ×2", {"alice": withdraw_locked, "bob": withdraw_locked}, ACCOUNTS, BALANCE, True),
    ("REPEATABLE READ ×2", {"alice": withdraw_repeatable, "bob": withdraw_repeatable}, ACCOUNTS, BALANCE, True),
    ("SKIP LOCKED ×2", {"w1": claim, "w2": claim}, JOBS, "SELECT id, owner FROM jobs ORDER BY id", True),
    (
        "lost update ×2 + other table",
        {"alice": withdraw, "bob": withdraw, "carol": deposit},
        f"{ACCOUNTS}; {SAVINGS}",
        BOTH,
        True,
    ),
    (
        "two lost-update pairs",
        {"alice": withdraw, "bob": withdraw, "carol": deposit, "dave": deposit},
        f"{ACCOUNTS}; {SAVINGS}",
        BOTH,
        False,
    ),
]


def timed(sessions: Sessions, setup: str, final: str, server: Any, reduce: bool) -> tuple[Exploration, float]:
    started = time.perf_counter()
    found = explore_code(sessions, setup=setup, final=final, server=server, reduce=reduce, limit=1_000_000)
    return found, time.perf_counter() - started


def main() -> int:
    failed = False
    print(f"{'example':30} {'tree runs':>10} {'tree s':>8} {'reduced runs':>13} {'reduced s':>10}  classes")
    with open_server("embedded") as server:
        timed(EXAMPLES[0][1], ACCOUNTS, BALANCE, server, True)  # warm up
        for name, sessions, setup, final, walk in EXAMPLES:
            reduced, reduced_s = timed(sessions, setup, final, server, True)
            tree_runs, tree_s, same = "-", "-", "(tree not walked)"
            if walk:
                every, seconds = timed(sessions, setup, final, server, False)
                tree_runs, tree_s = f"{every.run_count:,}", f"{seconds:.2f}"
                equal = {(c.final, c.errors) for c in every.classes} == {(c.final, c.errors) for c in reduced.classes}
                same = "same" if equal and reduced.complete else "DIFFERENT"
                failed = failed or same != "same"
            print(f"{name:30} {tree_runs:>10} {tree_s:>8} {reduced.run_count:>13,} {reduced_s:>10.2f}  {same}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
