"""Explore's reduction reads rows: a read by key, an insert's key, a delete's rows, told apart on one table.

Each small scenario of ``tests/explore/reads/`` is explored reduced and exhaustively, and the
two must find the same outcome classes. Five are the orders that must stay dependent (an
update that moves a row into the key a write reads, an insert of a key it missed, a delete
by a predicate, a phantom in a range, a write that waited on a row and then left it
alone); ``reads-apart`` is a read beside a transaction that
touches only other keys, and needs fewer runs than when a read was of the whole table
(``TABLE_RUNS``, measured with that rule). The figures of the acceptance: two independent
lost updates on two rows of one table, and three sessions on one table.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pgrace.drivers.explore import explore
from pgrace.drivers.reduce import Access, Move, dependent, executor
from pgrace.drivers.reduce.reads import Shape, effect_of
from pgrace.drivers.searches import Exhaustive
from pgrace.frontends import catalog
from pgrace.model.orders.space import Space
from pgrace.servers import ServerInfo

READS = Path(__file__).parent / "explore" / "reads"

#: Runs of the reduced search when a read, and a COMMIT, was of the whole table.
TABLE_RUNS = {"reads-apart": 7}
MUST_DEPEND = ["key-moves-in", "insert-missed", "delete-under-predicate", "phantom-range", "wait-then-skip"]


def _classes(found: object) -> list[str]:
    return sorted(c.key for c in found.classes)  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", [*MUST_DEPEND, *TABLE_RUNS])
def test_reads_told_apart_keep_the_exhaustive_classes(pgrace_server: ServerInfo, name: str) -> None:
    scenario = catalog.read_scenario(str(READS / f"{name}.toml"))
    reduced = explore(scenario, pgrace_server)
    every = explore(scenario, pgrace_server, search=Exhaustive())
    assert _classes(reduced) == _classes(every)
    assert reduced.covers_all
    if name in MUST_DEPEND:  # the order of the two transactions decides the final state
        assert len(every.classes) == 2
    else:
        assert reduced.run_count < TABLE_RUNS[name]


def test_a_read_by_key_and_an_insert_say_their_keys(pgrace_server: ServerInfo) -> None:
    """The copier's read is of row (1); the writer's transaction changed (2) and (5) and made (4)."""
    scenario = catalog.read_scenario(str(READS / "reads-apart.toml"))
    with executor(scenario, pgrace_server, 5.0) as execute:
        trace = execute(tuple(name for chain in Space(scenario).chains for name in chain))
    table = ("relation", "pgrace_explore.accounts")
    by_name = {m.name: m for m in trace.moves}
    assert by_name["copier-read"].access[table].scan == frozenset({"(1)"})
    commit = by_name["writer-5"].access[table]
    assert commit.made == frozenset({"(4)"}) and {k for k, _ in commit.rows or ()} == {"(2)", "(5)"}
    assert by_name["writer-5"].releases and by_name["copier-4"].access[table].scan == frozenset()
    assert not dependent(by_name["copier-read"], by_name["writer-5"])


@pytest.mark.timing
def test_two_independent_lost_updates_on_one_table_in_few_runs(pgrace_server: ServerInfo) -> None:
    """Four sessions of four steps on two rows of one table: complete, every final state, at most 100 runs."""
    scenario = catalog.read_scenario(str(READS / "two-pairs-one-table.toml"))
    started = time.perf_counter()
    found = explore(scenario, pgrace_server)
    assert time.perf_counter() - started < 10
    assert (found.space, found.covers_all) == (63_063_000, True)
    assert found.run_count <= 100
    assert {c.final[0][0] for c in found.classes} == {(300, 300), (300, 400), (400, 300), (400, 400)}


def test_one_reader_two_writers_take_a_tenth_of_the_runs(pgrace_server: ServerInfo) -> None:
    """Three sessions of four steps on one table (34,650 interleavings; bench_reduce compares every one).

    The auditor copies the balance it read: before both, between, or after, and each writer's
    withdrawal counts or is lost."""
    scenario = catalog.read_scenario(str(READS / "one-reader-two-writers.toml"))
    found = explore(scenario, pgrace_server)
    assert found.space == 34_650 and found.covers_all
    assert found.run_count <= 3_465
    finals = {c.final[0][0] for c in found.classes}
    assert finals == {(300, 500), (300, 400), (300, 300), (400, 500), (400, 400)}


ACCOUNTS = {"s.accounts": Shape("s.accounts", "s", "accounts", "r", True, True, (("id", "int", 1),))}


@pytest.mark.parametrize(
    ("sql", "scan", "made"),
    [
        ("SELECT balance FROM accounts WHERE id = 1", {"(1)"}, None),
        ("SELECT balance FROM accounts a WHERE a.id IN (1, '2') AND balance > 0", {"(1)", "(2)"}, None),
        ("UPDATE accounts SET balance = 1 WHERE id = 2", {"(2)"}, None),
        ("DELETE FROM accounts WHERE id = 2 RETURNING balance", {"(2)"}, None),
        ("INSERT INTO accounts VALUES (4, 100)", {"(4)"}, {"(4)"}),
        ("INSERT INTO accounts (balance, id) VALUES (1, 5), (2, 6)", {"(5)", "(6)"}, {"(5)", "(6)"}),
        ("UPDATE accounts SET id = 2 WHERE id = 3", "all", "unknown"),  # a row moved into another key
        ("INSERT INTO accounts (balance) VALUES (1)", "all", "unknown"),  # a default key, not returned
        ("SELECT balance FROM accounts WHERE id BETWEEN 1 AND 3", "all", None),  # a range: phantoms
        ("SELECT balance FROM accounts WHERE id = 1 OR id = 2", "all", None),
        ("SELECT balance FROM accounts WHERE id = 1.0", "all", None),  # not an integer literal
        ("SELECT balance FROM accounts WHERE id = (SELECT 1)", "all", None),  # a subquery
        ("SELECT balance FROM accounts WHERE id = 1 FOR UPDATE SKIP LOCKED", "all", None),
        ("COMMIT", "none", None),
    ],
)
def test_what_a_statement_reads_and_makes(sql: str, scan: object, made: object) -> None:
    effect = effect_of(sql, ACCOUNTS, closed=True)
    read = frozenset() if effect.quiet else effect.scans.get("s.accounts")
    assert read == ({"none": frozenset(), "all": None}.get(scan, scan) if isinstance(scan, str) else scan)
    if made == "unknown":
        assert effect.made.get("s.accounts", frozenset()) is None or effect.made_anywhere
    else:
        assert effect.made.get("s.accounts", frozenset()) == (made or frozenset())


def test_a_database_with_its_own_functions_or_triggers_narrows_nothing() -> None:
    effect = effect_of("SELECT balance FROM accounts WHERE id = 1", ACCOUNTS, closed=False)
    assert effect.scans.get("s.accounts") is None and effect.made_anywhere


def _move(session: str, access: Access, releases: bool = False) -> Move:
    return Move(session, session, {("relation", "t"): access}, opaque=False, releases=releases)


HELD = frozenset({"AccessShareLock", "RowExclusiveLock"})


@pytest.mark.parametrize(
    ("reader", "ending", "depends"),
    [
        (
            frozenset({"(1)"}),
            Access(True, True, HELD, frozenset({("(2)", "FOR UPDATE")}), frozenset(), frozenset()),
            False,
        ),
        (
            frozenset({"(1)"}),
            Access(True, True, HELD, frozenset({("(1)", "FOR UPDATE")}), frozenset(), frozenset()),
            True,
        ),
        (frozenset({"(1)"}), Access(True, True, HELD, frozenset(), frozenset(), frozenset({"(1)"})), True),  # inserted
        (frozenset({"(1)"}), Access(True, True, HELD, frozenset(), frozenset(), None), True),  # a key not known
        (None, Access(True, True, HELD, frozenset({("(2)", "FOR UPDATE")}), frozenset(), frozenset()), True),
        (frozenset(), Access(True, True, HELD, frozenset({("(1)", "FOR UPDATE")}), frozenset(), frozenset()), False),
        (None, Access(True, True, frozenset({"RowShareLock"}), frozenset(), frozenset(), frozenset()), False),
    ],
)
def test_which_reads_an_ending_transaction_changes(
    reader: frozenset[str] | None, ending: Access, depends: bool
) -> None:
    read = Access(False, True, frozenset({"AccessShareLock"}), frozenset(), reader, frozenset())
    assert dependent(_move("x", read), _move("y", ending, releases=True)) is depends
    assert dependent(_move("y", ending, releases=True), _move("x", read)) is depends


@pytest.mark.parametrize(
    ("sql", "physical"),
    [
        ("SELECT * FROM accounts", True),  # the rows as they lie on disk
        ("SELECT * FROM accounts ORDER BY id", False),
        ("SELECT balance FROM accounts WHERE id = 1", False),  # one row
        ("SELECT (SELECT balance FROM accounts WHERE id = 1), (SELECT balance FROM accounts WHERE id = 2)", False),
        ("SELECT count(*), sum(balance) FROM accounts", False),
        ("SELECT string_agg(balance::text, ',' ORDER BY id) FROM accounts", False),
        ("SELECT string_agg(balance::text, ',') FROM accounts", True),
        ("SELECT (SELECT string_agg(balance::text, ',') FROM accounts)", True),
        ("SELECT balance, count(*) FROM accounts GROUP BY balance", True),
    ],
)
def test_which_final_checks_see_rows_in_disk_order(sql: str, physical: bool) -> None:
    from pgrace.drivers.reduce.reads import in_physical_order

    assert in_physical_order(sql, ACCOUNTS) is physical
