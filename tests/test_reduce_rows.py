"""Explore's reduction tells rows apart: sessions on different rows of one table commute.

Each scenario of ``tests/explore/rows/`` is explored reduced and exhaustively, and the two
must find the same outcome classes; where rows are told apart, the reduced search needs
fewer runs than it did when every table was one resource (the figures in ``RELATION_RUNS``
were measured with that rule: every footprint coarsened to its tables). What a run's footprint says of a row is
shown on one run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tiers import tiered

from pgrace.drivers.explore import explore
from pgrace.drivers.reduce import Access, Move, dependent, executor
from pgrace.drivers.searches import Exhaustive
from pgrace.frontends import catalog
from pgrace.model.orders.space import Space
from pgrace.servers import ServerInfo

ROWS = Path(__file__).parent / "explore" / "rows"

#: Runs of the reduced search when a table was one resource, whatever its rows.
RELATION_RUNS = {
    "rows-apart": 14,
    "rows-same": 10,
    "fk-parent": 74,
    "fk-delete": 7,
    "unique-inserts": 88,
    "predicate-moves": 60,
    "partitioned": 90,
    "savepoint-undo": 40,
    "no-key": 10,
    "trigger-counts": 106,
    "share-locks": 108,
}
NOT_FEWER = {"skip-locked-one-queue", "upsert-apart"}  # probes: every row of the table counts
#: Comparisons of many seconds each: CI runs them, make test the rest (the same rules, on fewer runs).
LONG = {"partitioned", "fk-parent", "skip-locked-one-queue", "unique-inserts", "predicate-moves"}


def _classes(found: object) -> list[str]:
    return sorted(c.key for c in found.classes)  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", tiered(sorted(RELATION_RUNS.keys() | NOT_FEWER), LONG))
def test_rows_told_apart_keep_the_exhaustive_classes(pgrace_server: ServerInfo, name: str) -> None:
    scenario = catalog.read_scenario(str(ROWS / f"{name}.toml"))
    reduced = explore(scenario, pgrace_server)
    every = explore(scenario, pgrace_server, search=Exhaustive())
    assert _classes(reduced) == _classes(every)
    assert reduced.covers_all
    if name in RELATION_RUNS:
        assert reduced.run_count < RELATION_RUNS[name]


def test_the_same_row_still_loses_an_update(pgrace_server: ServerInfo) -> None:
    found = explore(catalog.read_scenario(str(ROWS / "rows-same.toml")), pgrace_server)
    assert sorted(c.final[0][0][0] for c in found.classes) == ["300,500", "400,500"]


def test_a_footprint_names_the_rows_by_primary_key(pgrace_server: ServerInfo) -> None:
    """The write locks row (1) by its key; the read before it touches no row; bob's row is (2)."""
    scenario = catalog.read_scenario(str(ROWS / "rows-apart.toml"))
    with executor(scenario, pgrace_server, 5.0) as execute:
        trace = execute(tuple(name for chain in Space(scenario).chains for name in chain))
    table = ("relation", "pgrace_explore.accounts")
    by_name = {m.name: m for m in trace.moves}
    assert by_name["alice-read"].access[table].rows == frozenset()
    assert by_name["alice-3"].access[table].rows == frozenset({("(1)", "FOR NO KEY UPDATE")})
    assert by_name["bob-3"].access[table].rows == frozenset({("(2)", "FOR NO KEY UPDATE")})
    assert not dependent(by_name["alice-3"], by_name["bob-3"])
    assert not dependent(by_name["alice-3"], by_name["bob-read"])


def _move(session: str, access: Access) -> Move:
    return Move(session, session, {("relation", "t"): access}, opaque=False)


READ = Access(False, True, frozenset({"AccessShareLock"}))
INSERT = Access(True, True, frozenset({"RowExclusiveLock"}))


def _rows(mode: str, *rows: tuple[str, str]) -> Access:
    return Access(True, True, frozenset({mode}), frozenset(rows))


@pytest.mark.parametrize(
    ("a", "b", "depends"),
    [
        (READ, _rows("RowExclusiveLock", ("(1)", "FOR NO KEY UPDATE")), False),  # it cannot see it either way
        (INSERT, INSERT, False),  # a clash of keys shows as a wait, then both are coarse
        (
            _rows("RowExclusiveLock", ("(1)", "FOR NO KEY UPDATE")),
            _rows("RowExclusiveLock", ("(2)", "FOR UPDATE")),
            False,
        ),
        (_rows("RowExclusiveLock", ("(1)", "FOR NO KEY UPDATE")), _rows("RowShareLock", ("(1)", "FOR SHARE")), True),
        (
            _rows("RowShareLock", ("(1)", "FOR KEY SHARE")),
            _rows("RowExclusiveLock", ("(1)", "FOR NO KEY UPDATE")),
            False,
        ),
        (_rows("RowShareLock", ("(1)", "FOR KEY SHARE")), _rows("RowExclusiveLock", ("(1)", "FOR UPDATE")), True),
        (Access(True, True, frozenset({"RowExclusiveLock"}), None), INSERT, True),  # rows not named: any row
        (Access(True, True, frozenset({"RowExclusiveLock"}), None), READ, False),
        (Access(True, True, frozenset({"ShareLock"})), INSERT, True),  # LOCK TABLE: the eight-mode table
        (Access(True), READ, True),  # a sequence, a view, a step that waited: the relation-level rule
        (Access(False), READ, False),
    ],
)
def test_which_accesses_of_one_table_conflict(a: Access, b: Access, depends: bool) -> None:
    assert dependent(_move("x", a), _move("y", b)) is depends
    assert dependent(_move("y", b), _move("x", a)) is depends
