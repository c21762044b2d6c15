"""``pgrace matrix``: the lock conflict tables, measured on the server at hand.

Each cell is two real sessions: ``held`` takes a lock (``BEGIN`` and the statement),
``requested`` then asks for another on the same row (or table), and the server says
whether it is blocked, exactly as in any pgrace run: the matrix is a scenario whose
permutations are the cells, run by the ordinary runner on one pair of connections
(each cell rolls both transactions back, so nothing needs resetting between cells).

The documented tables are encoded once, from PostgreSQL's manual, "Explicit Locking":
Table 13.2 (conflicting table lock modes) and Table 13.3 (conflicting row-level locks).
The row table's statements map to row lock modes as the manual says: an UPDATE that
changes no key column takes FOR NO KEY UPDATE, an UPDATE of a key column and a DELETE
take FOR UPDATE, and the foreign-key check of an INSERT into a referencing table takes
FOR KEY SHARE on the referenced row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from pgrace.engine.control import ControlSql
from pgrace.engine.libpq.runner import run_scenario
from pgrace.engine.observe.locks import CONFLICTS, ROW_CONFLICTS, ROW_STRENGTHS
from pgrace.engine.options import RunOptions
from pgrace.model.matrix import Matrix, MatrixTable, ModePair
from pgrace.model.scenario import LOCK_MODES, PermutationStep, Scenario, Session, Step
from pgrace.model.timeline import Run, StepRun
from pgrace.servers import ServerInfo

__all__ = ["DOCUMENTED_ROW_CONFLICTS", "DOCUMENTED_TABLE_CONFLICTS", "Matrix", "MatrixTable", "measure"]

ROW_LOCK_MODES = ROW_STRENGTHS

# Table 13.3: requested mode -> the current (held) modes it conflicts with; pgrace's one copy is locks.ROW_CONFLICTS.
DOCUMENTED_ROW_CONFLICTS: dict[str, frozenset[str]] = ROW_CONFLICTS

TABLE_LOCK_MODES = (
    "ACCESS SHARE",
    "ROW SHARE",
    "ROW EXCLUSIVE",
    "SHARE UPDATE EXCLUSIVE",
    "SHARE",
    "SHARE ROW EXCLUSIVE",
    "EXCLUSIVE",
    "ACCESS EXCLUSIVE",
)

# Table 13.2: requested mode -> the current (held) modes it conflicts with, in the manual's
# names; pgrace's one copy of the table is locks.CONFLICTS, in pg_locks' names.
_MANUAL_NAME = dict(zip(LOCK_MODES, TABLE_LOCK_MODES, strict=True))
DOCUMENTED_TABLE_CONFLICTS: dict[str, frozenset[str]] = {
    _MANUAL_NAME[wanted]: frozenset(_MANUAL_NAME[held] for held in CONFLICTS[wanted]) for wanted in LOCK_MODES
}


@dataclass(frozen=True)
class RowOperation:
    """A statement on the parent row, and the row lock mode the manual says it takes."""

    name: str
    sql: str
    mode: str


ROW_OPERATIONS = (
    *(RowOperation(mode, f"SELECT id FROM parent WHERE id = 1 {mode}", mode) for mode in ROW_LOCK_MODES),
    RowOperation("UPDATE non-key", "UPDATE parent SET note = 'changed' WHERE id = 1", "FOR NO KEY UPDATE"),
    RowOperation("UPDATE key", "UPDATE parent SET id = 100 WHERE id = 1", "FOR UPDATE"),
    RowOperation("DELETE", "DELETE FROM parent WHERE id = 1", "FOR UPDATE"),
    RowOperation("INSERT child (FK)", "INSERT INTO child (parent_id) VALUES (1)", "FOR KEY SHARE"),
)

SCHEMA_SQL = """
CREATE TABLE parent (id int PRIMARY KEY, note text);
CREATE TABLE child (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, parent_id int NOT NULL REFERENCES parent);
INSERT INTO parent VALUES (1, 'original');
CREATE TABLE locked (id int);
"""


def row_documented_blocks(held: str, requested: str) -> bool:
    modes = {op.name: op.mode for op in ROW_OPERATIONS}
    return modes[held] in DOCUMENTED_ROW_CONFLICTS[modes[requested]]


def table_documented_blocks(held: str, requested: str) -> bool:
    return held in DOCUMENTED_TABLE_CONFLICTS[requested]


def _pairs_scenario(name: str, operations: list[tuple[str, str]]) -> Scenario:
    """Sessions ``held`` and ``requested``; one permutation per (held, requested) pair of operations."""
    steps: list[Step] = []
    for session in ("held", "requested"):
        for index, (_, sql) in enumerate(operations):
            steps.append(Step(f"{session}{index}", session, f"BEGIN; {sql}"))
        steps.append(Step(f"{session}-end", session, "ROLLBACK"))
    permutations = tuple(
        (
            PermutationStep(f"held{h}"),
            PermutationStep(f"requested{r}"),
            PermutationStep("held-end"),
            PermutationStep("requested-end"),
        )
        for h in range(len(operations))
        for r in range(len(operations))
    )
    return Scenario(
        name=name,
        title=f"lock conflicts: {name}",
        source="<pgrace matrix>",
        sessions=(Session("held"), Session("requested")),
        steps=tuple(steps),
        permutations=permutations,
    )


def _seen(step: StepRun) -> str:
    if step.waited:
        parts = []
        for wait in step.waits:
            if wait.kind == "row":
                parts.append(f"waits for {wait.mode or '?'} on the row, held {wait.holder_mode or '?'}")
            else:
                parts.append(f"waits for {wait.mode or '?'} on {wait.table or wait.lock_type}")
        return "; ".join(parts) or "waits"
    if step.outcome is not None and step.outcome.error is not None:
        return f"error {step.outcome.error.sqlstate}"
    if step.locks_after:
        return ", ".join(f"{lock.session} {lock.mode}" for lock in step.locks_after)
    return "granted"


def _cells(run: Run, names: list[str], documented: Any) -> list[ModePair]:
    requested_runs = [s for s in run.step_runs() if s.session == "requested" and s.step != "requested-end"]
    cells = []
    for position, step in enumerate(requested_runs):
        held, requested = names[position // len(names)], names[position % len(names)]
        blocks = step.waited or step.cancelled
        cells.append(ModePair(held, requested, blocks, documented(held, requested), _seen(step)))
    return cells


def measure(server: ServerInfo, step_timeout: float = 10.0) -> Matrix:
    """Measure both tables in one scratch database on ``server``."""
    from pgrace.scratch import scratch_database

    row_ops = [(op.name, op.sql) for op in ROW_OPERATIONS]
    table_ops = [(mode, f"LOCK TABLE locked IN {mode} MODE") for mode in TABLE_LOCK_MODES]
    with scratch_database(server, "matrix") as db:
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            ControlSql(step_timeout).check(conn.pgconn, SCHEMA_SQL, "the matrix's setup")
        row_run = run_scenario(
            _pairs_scenario("row", row_ops),
            db.dsn,
            server_version=server.version,
            server_label=server.label,
            row_locks_available=db.has_pgrowlocks,
            options=RunOptions(step_timeout=step_timeout),
            observer_dsn=db.observer_dsn,
        )
        table_run = run_scenario(
            _pairs_scenario("table", table_ops),
            db.dsn,
            server_version=server.version,
            server_label=server.label,
            row_locks_available=False,
            options=RunOptions(step_timeout=step_timeout, track_row_locks=False),
            observer_dsn=db.observer_dsn,
        )
    row_names = [name for name, _ in row_ops]
    return Matrix(
        server.version,
        server.label,
        MatrixTable(tuple(row_names), _cells(row_run, row_names, row_documented_blocks)),
        MatrixTable(TABLE_LOCK_MODES, _cells(table_run, list(TABLE_LOCK_MODES), table_documented_blocks)),
    )
