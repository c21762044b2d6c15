"""The lost update in the application's own psycopg code: the race, and its cure (SELECT ... FOR UPDATE).

Run it from the repository: python examples/code/withdraw_psycopg.py
"""

from __future__ import annotations

from typing import Any

import pgrace


def withdraw(conn: Any) -> None:
    """The race: read the balance, subtract in Python, write it back."""
    (balance,) = conn.execute("SELECT balance FROM accounts WHERE id = 1").fetchone()
    conn.execute("UPDATE accounts SET balance = %s WHERE id = 1", (balance - 100,))
    conn.commit()


def withdraw_locked(conn: Any) -> None:
    """The cure: lock the row when reading it; the second withdrawal waits, then reads the new balance."""
    (balance,) = conn.execute("SELECT balance FROM accounts WHERE id = 1 FOR UPDATE").fetchone()
    conn.execute("UPDATE accounts SET balance = %s WHERE id = 1", (balance - 100,))
    conn.commit()


SETUP = "CREATE TABLE accounts (id int PRIMARY KEY, balance int); INSERT INTO accounts VALUES (1, 500)"
FINAL = "SELECT balance FROM accounts WHERE id = 1"


def main(server: Any = None) -> None:
    """Explore the race and the cure; show the timeline of the interleaving that loses 100."""
    for fn in (withdraw, withdraw_locked):
        found = pgrace.explore_code({"alice": fn, "bob": fn}, setup=SETUP, final=FINAL, server=server)
        covered = "every order covered" if found.complete else f"not every order covered: {found.incomplete}"
        print(f"{fn.__name__}: {found.run_count} runs, {covered}")
        for c in found.classes:
            print(f"  {c.count:3}  final {c.final[0]}  e.g. {' '.join(session for session, _ in c.statements)}")
        if fn is withdraw:
            from pgrace.render.text import render_text

            lost = next(c for c in found.classes if c.final[0] == ((400,),))
            print()
            print(render_text(found.replay(lost)))


if __name__ == "__main__":
    main()
