"""explore_code's partial-order reduction: the same outcome classes as every schedule of the choice tree, in fewer runs.

Each example is explored twice on a real server, reduced (the default) and with
``reduce=False`` (every schedule, depth first), and the classes must be the same. Where
sessions touch different tables the reduced search must run far fewer schedules.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from test_code import FINAL, SETUP, _example, withdraw, withdraw_locked
from tiers import tiered

from pgrace.drivers.code import _runner, explore_code
from pgrace.drivers.reduce import code_trace, dependent
from pgrace.model.exploration import Exploration
from pgrace.model.orders.choices import Follow
from pgrace.model.timeline import FootprintObserved
from pgrace.servers import ServerInfo

SAVINGS = "CREATE TABLE savings (id int PRIMARY KEY, balance int); INSERT INTO savings VALUES (1, 50)"
BOTH = "SELECT (SELECT balance FROM accounts WHERE id = 1), (SELECT balance FROM savings WHERE id = 1)"
JOBS = "CREATE TABLE jobs (id int PRIMARY KEY, owner text); INSERT INTO jobs VALUES (1, NULL), (2, NULL)"


def deposit(conn: Any) -> None:
    """A read-modify-write like withdraw's, on another table: it commutes with every withdrawal."""
    (balance,) = conn.execute("SELECT balance FROM savings WHERE id = 1").fetchone()
    conn.execute("UPDATE savings SET balance = %s WHERE id = 1", (balance + 10,))
    conn.commit()


def withdraw_second(conn: Any) -> None:
    """withdraw's statements on another row of the same table."""
    (balance,) = conn.execute("SELECT balance FROM accounts WHERE id = 2").fetchone()
    conn.execute("UPDATE accounts SET balance = %s WHERE id = 2", (balance - 100,))
    conn.commit()


def withdraw_checked(conn: Any) -> None:
    """What the code does next depends on what it read: an exception when the money is gone."""
    (balance,) = conn.execute("SELECT balance FROM accounts WHERE id = 1 FOR UPDATE").fetchone()
    if balance < 450:
        raise ValueError("insufficient funds")
    conn.execute("UPDATE accounts SET balance = %s WHERE id = 1", (balance - 100,))
    conn.commit()


def withdraw_repeatable(conn: Any) -> None:
    """The lost update under REPEATABLE READ: the later writer fails to serialize (40001)."""
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    withdraw(conn)


def claim(conn: Any) -> None:
    """A queue worker: the first job nobody holds, skipping locked ones."""
    row = conn.execute("SELECT id FROM jobs WHERE owner IS NULL ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED").fetchone()
    if row is not None:
        conn.execute("UPDATE jobs SET owner = %s WHERE id = %s", ("w", row[0]))
    conn.commit()


def both_ways(
    sessions: Mapping[str, Callable[[Any], object]], server: ServerInfo, setup: str = SETUP, final: str = FINAL
) -> tuple[Exploration, Exploration]:
    reduced = explore_code(sessions, setup=setup, final=final, server=server)
    every = explore_code(sessions, setup=setup, final=final, server=server, reduce=False)
    return reduced, every


def classes(found: Exploration) -> set[tuple[Any, ...]]:
    return {(c.final, c.errors, c.ok) for c in found.classes}


EXAMPLES: dict[str, tuple[dict[str, Callable[[Any], object]], str, str]] = {
    "lost update": ({"alice": withdraw, "bob": withdraw}, SETUP, FINAL),
    "FOR UPDATE": ({"alice": withdraw_locked, "bob": withdraw_locked}, SETUP, FINAL),
    "an exception": ({"alice": withdraw_checked, "bob": withdraw_checked}, SETUP, FINAL),
    "REPEATABLE READ": ({"alice": withdraw_repeatable, "bob": withdraw_repeatable}, SETUP, FINAL),
    "SKIP LOCKED": ({"w1": claim, "w2": claim}, JOBS, "SELECT id, owner FROM jobs ORDER BY id"),
    # ORDER BY: without, the rows come in the order they lie on disk, which the order of the two updates decides
    "rows apart": (
        {"alice": withdraw, "bob": withdraw_second},
        f"{SETUP}, (2, 500)",
        "SELECT * FROM accounts ORDER BY id",
    ),
    # the final rows in the order they lie on disk: the two updates of different rows stay ordered
    "rows apart, in disk order": (
        {"alice": withdraw, "bob": withdraw_second},
        f"{SETUP}, (2, 500)",
        "SELECT * FROM accounts",
    ),
    "an exception, and one apart": (
        {"alice": withdraw_checked, "bob": withdraw_checked, "carol": deposit},
        f"{SETUP}; {SAVINGS}",
        BOTH,
    ),
    "three, one apart": ({"alice": withdraw, "bob": withdraw_locked, "carol": deposit}, f"{SETUP}; {SAVINGS}", BOTH),
}

#: Three sessions, one on another table: many seconds each, so CI's (everyday: a_session_on_another_table below).
THREE_SESSIONS = {"an exception, and one apart", "three, one apart"}


@pytest.mark.parametrize("example", tiered(EXAMPLES, THREE_SESSIONS))
def test_reduced_classes_are_every_schedules_classes(pgrace_server: ServerInfo, example: str) -> None:
    sessions, setup, final = EXAMPLES[example]
    reduced, every = both_ways(sessions, pgrace_server, setup, final)
    assert reduced.complete and every.complete
    assert classes(reduced) == classes(every)
    assert reduced.runs is not None and reduced.runs <= every.run_count
    assert sum(c.count for c in reduced.classes) == reduced.runs  # a class counts its runs
    if example in ("rows apart", "three, one apart"):
        assert reduced.runs is not None and reduced.runs * 3 <= every.run_count


def test_the_orm_example_has_the_same_classes_reduced(pgrace_server: ServerInfo) -> None:
    example = _example("withdraw_sqlalchemy")
    for fn in (example.withdraw, example.withdraw_locked):
        reduced, every = both_ways({"alice": fn, "bob": fn}, pgrace_server, example.SETUP, example.FINAL)
        assert reduced.complete and classes(reduced) == classes(every)


def test_a_session_on_another_table_costs_no_more_runs(pgrace_server: ServerInfo) -> None:
    """A third session on another table commutes with all of the lost update: no more runs than the pair alone,
    and the lost update's two outcomes, each with carol's deposit (the reduced classes are every order's: above)."""
    pair = explore_code({"alice": withdraw, "bob": withdraw}, setup=SETUP, final=FINAL, server=pgrace_server)
    sessions = {"alice": withdraw, "bob": withdraw, "carol": deposit}
    reduced = explore_code(sessions, setup=f"{SETUP}; {SAVINGS}", final=BOTH, server=pgrace_server)
    assert classes(reduced) == {((((400, 60),),), (), True), ((((300, 60),),), (), True)}
    assert reduced.complete and reduced.runs == pair.runs


def test_two_independent_lost_updates_are_covered_completely(pgrace_server: ServerInfo) -> None:
    """Four sessions, two pairs on two tables: all four final states, every order covered, in about 50 runs."""
    sessions = {"alice": withdraw, "bob": withdraw, "carol": deposit, "dave": deposit}
    found = explore_code(sessions, setup=f"{SETUP}; {SAVINGS}", final=BOTH, server=pgrace_server)
    assert {c.final[0] for c in found.classes} == {((a, s),) for a in (400, 300) for s in (60, 70)}
    assert found.complete and found.runs is not None and found.runs <= 100


def test_code_that_sends_other_statements_after_the_same_ones_is_not_covered(pgrace_server: ServerInfo) -> None:
    """The search takes the same statements after the same prefix; Python state of its own breaks that."""
    calls = itertools.count()

    def stamped(conn: Any) -> None:
        conn.execute("UPDATE accounts SET balance = balance - %s WHERE id = 1", (next(calls) % 7,))
        conn.commit()

    found = explore_code({"alice": stamped, "bob": stamped}, setup=SETUP, final=FINAL, server=pgrace_server)
    assert not found.complete
    steady = explore_code({"alice": withdraw, "bob": withdraw}, setup=SETUP, final=FINAL, server=pgrace_server)
    assert steady.complete


def test_a_code_run_records_what_every_session_holds_after_each_statement(pgrace_server: ServerInfo) -> None:
    """The footprints pgrace explore reads, in code runs; the same statements from the sixth run on.

    psycopg prepares a statement it has met five times, and a prepared statement's portal keeps
    its snapshot while the session idles in its transaction: the reading would then say REPEATABLE
    READ of a READ COMMITTED transaction, and make every statement depend on every other.
    """
    sessions = {"alice": withdraw, "carol": deposit}
    setup = f"{SETUP}; {SAVINGS}"
    with _runner(
        "footprints", sessions, pgrace_server, setup=setup, final=BOTH, teardown=None, step_timeout=10, expect=None
    ) as runner:
        for _ in range(7):
            run, _ = runner.run_once(Follow(["alice", "carol"]), observe=False, footprints=True)
            readings = [e for e in run.events if isinstance(e, FootprintObserved)]
            assert len(readings) == len(run.scenario.steps) == 6  # one after each statement
            trace = code_trace(run, runner.raised)
            assert not any(m.isolated or m.opaque for m in trace.moves)
            first, second = (m for m in trace.moves if m.name.endswith(".2"))  # the two UPDATEs
            assert {first.session, second.session} == {"alice", "carol"} and not dependent(first, second)
        plain, _ = runner.run_once(Follow([]), observe=False)
        assert not any(isinstance(e, FootprintObserved) for e in plain.events)
