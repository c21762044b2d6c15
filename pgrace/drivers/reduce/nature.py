"""What a step's text says about it before it runs: opaque (dependent on everything), local, or plain."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pgrace.model import variables
from pgrace.model.scenario import Scenario, Step

__all__ = ["CHECK_OPAQUE", "Nature", "every_order_differs", "nature_of", "opaque_orders", "setup_clock"]

# SQL whose effect or result pg_locks does not show, or that differs from run to run.
OPAQUE_WORDS = re.compile(
    r"\b(?!pg_advisory_|pg_try_advisory_)(pg_\w+|txid_\w+|"
    r"random|random_normal|setseed|gen_random_uuid|uuid_generate_\w+|dblink\w*|lo_\w+|xmin|xmax|cmin|cmax|ctid)\b",
    re.IGNORECASE,
)
# The transaction's start time (fixed by its first statement): now() and the SQL-standard
# values, the 'now', 'today' ... literals, and age() of one argument (since today's midnight).
CLOCK_AT_START = re.compile(
    r"\b(now|transaction_timestamp|current_timestamp|current_time|current_date|localtime|localtimestamp|"
    r"today|tomorrow|yesterday)\b|\bage\s*\(",
    re.IGNORECASE,
)
# The clock as the statement starts or runs: these are read by the step itself.
CLOCK_AT_STEP = re.compile(r"\b(clock_timestamp|statement_timestamp|timeofday)\b", re.IGNORECASE)
# A final check runs after every step, so its clock reads come after all of theirs in any order:
# only what the server's own counters say differs by order without a step showing it.
CHECK_OPAQUE = re.compile(r"\b(xmin|xmax|cmin|cmax|ctid|txid_\w+|pg_current_xact_id\w*)\b", re.I)
PLAIN_STATEMENTS = {
    "SelectStmt",
    "InsertStmt",
    "UpdateStmt",
    "DeleteStmt",
    "MergeStmt",
    "LockStmt",
    "DeclareCursorStmt",
    "FetchStmt",
    "ClosePortalStmt",
}
LOCAL_STATEMENTS = {"VariableSetStmt", "VariableShowStmt"}
# TransactionStmtKind: BEGIN, START, COMMIT, ROLLBACK, SAVEPOINT, RELEASE, ROLLBACK TO (not PREPARE and after)
TRANSACTION_KINDS = {0, 1, 2, 3, 4, 5, 6}


@dataclass(frozen=True)
class Nature:
    """What the text of a step says about it before it runs."""

    opaque: bool  # dependent on everything, whatever the server shows
    local: bool  # only settings: nothing another session can see
    single_transaction_statement: bool  # one COMMIT, ROLLBACK ... (AND CHAIN may end and begin)
    probes: bool = False  # its result hangs on rows it examined but need not lock (SKIP LOCKED, ON CONFLICT ...)
    rolls_back: bool = False  # ROLLBACK TO SAVEPOINT: undoes writes and row locks of the transaction's own
    clock: bool = False  # reads the clock as it runs (clock_timestamp, statement_timestamp)
    clock_at_start: bool = False  # reads its transaction's start time (now(), current_timestamp ...)
    prepares_only: bool = False  # parses its SQL and runs nothing: table locks, no row (Step.prepares_only)


def nature_of(step: Step, scenario: Scenario) -> Nature:
    if step.sleep is not None or step.crash is not None or OPAQUE_WORDS.search(step.sql):
        return Nature(True, False, False)
    import pglast

    params = variables.param_values(scenario) if scenario.dialect == "pgrace" else {}
    text = step.sql
    if scenario.dialect == "pgrace":
        uses = variables.find(text)
        values = {**{u.key: variables.Value(None) for u in uses}, **params}
        try:
            text = variables.substitute(text, values)
        except Exception:  # a value pgrace cannot spell without a connection: say nothing, trust nothing
            return Nature(True, False, False)
    try:
        statements = [raw.stmt for raw in pglast.parse_sql(text)]
    except Exception:  # pglast's ParseError, or anything it cannot take
        return Nature(True, False, False)
    kinds = [type(s).__name__ for s in statements]
    if not statements or all(k in LOCAL_STATEMENTS for k in kinds):
        return Nature(False, True, False)
    for statement, kind in zip(statements, kinds, strict=True):
        if kind == "TransactionStmt":
            if int(getattr(statement, "kind", -1)) not in TRANSACTION_KINDS:
                return Nature(True, False, False)
        elif kind not in PLAIN_STATEMENTS and kind not in LOCAL_STATEMENTS:
            return Nature(True, False, False)
    single = len(statements) == 1 and kinds[0] == "TransactionStmt"
    if step.prepares_only:  # nothing it names is evaluated: no row it examines, no clock it reads as it runs
        return Nature(False, False, single, clock_at_start=bool(CLOCK_AT_START.search(step.sql)), prepares_only=True)
    return Nature(
        False,
        False,
        single,
        bool(PROBES.search(text)),
        bool(ROLLS_BACK.search(text)),
        bool(CLOCK_AT_STEP.search(step.sql)),
        bool(CLOCK_AT_START.search(step.sql)),
    )


_SETUP_CLOCK: list[tuple[Scenario, tuple[bool, bool]]] = []  # the last one asked (held: its id stays its own)
SETUP_EVALUATES = {"SelectStmt", "InsertStmt", "UpdateStmt", "DeleteStmt", "TransactionStmt", "VariableSetStmt"}


def setup_clock(scenario: Scenario) -> tuple[bool, bool]:
    """Whether the setup leaves the clock to be read later, by steps whose text does not show it:
    (at a transaction's start, as a step runs).

    A setup query reads the clock once, before every step; a default, a function, a trigger,
    a view or a rule that names it reads it whenever a step uses them.
    """
    if _SETUP_CLOCK and _SETUP_CLOCK[0][0] is scenario:
        return _SETUP_CLOCK[0][1]
    import pglast

    start = step = False
    for text in (*scenario.setup, *(s.setup or "" for s in scenario.sessions)):
        try:
            data = text.encode()  # the parser's locations count bytes
            deferred = [
                data[(at := raw.stmt_location or 0) : at + (raw.stmt_len or len(data))].decode()
                for raw in pglast.parse_sql(text)
                if type(raw.stmt).__name__ not in SETUP_EVALUATES
            ]
        except Exception:  # not parsed: every word of it counts
            deferred = [text]
        start = start or any(CLOCK_AT_START.search(t) for t in deferred)
        step = step or any(CLOCK_AT_STEP.search(t) for t in deferred)
    _SETUP_CLOCK[:] = [(scenario, (start, step))]
    return start, step


# A statement whose result another session's uncommitted row change decides without a wait
# or a lock of its own showing it: a skipped or refused row, a conflict done nothing about.
PROBES = re.compile(r"\b(SKIP\s+LOCKED|NOWAIT|ON\s+CONFLICT|MERGE)\b", re.IGNORECASE)
ROLLS_BACK = re.compile(r"\bROLLBACK\s+((WORK|TRANSACTION)\s+)?TO\b", re.IGNORECASE)


BEGINS = re.compile(r"^\s*(BEGIN|START\s+TRANSACTION)\b", re.IGNORECASE)
ENDS = re.compile(r"\b(COMMIT|END|ABORT|ROLLBACK)(?!\s+TO\b)(\s+(WORK|TRANSACTION))?\s*;?\s*$", re.IGNORECASE)


def opaque_orders(scenario: Scenario) -> int:
    """A lower bound of the runs a reduced search needs: the orders of the steps known opaque before
    running (their text, or a statement outside a transaction block), which all depend on each other."""
    from pgrace.model.orders.space import Space, multinomial

    counts = []
    for chain in Space(scenario).chains:
        in_block, opaque = False, 0
        for name in chain:
            step = scenario.step(name)
            nature = nature_of(step, scenario)
            begins = bool(BEGINS.search(step.sql))
            if nature.opaque or not (in_block or begins or nature.local):
                opaque += 1
            in_block = (in_block or begins) and not ENDS.search(step.sql)
        counts.append(opaque)
    return multinomial(counts)


ISOLATED = re.compile(
    r"\bISOLATION\s+LEVEL\s+(SERIALIZABLE|REPEATABLE\s+READ)\b"
    r"|\bdefault_transaction_isolation\b\s*(=|\bTO\b)\s*'?\s*(serializable|repeatable)",
    re.IGNORECASE,
)


def every_order_differs(scenario: Scenario) -> bool:
    """Whether the text alone shows every two steps of different sessions dependent, so that a
    reduced search would run every interleaving and pay for its footprints on top.

    A step counts when it is opaque (as :func:`opaque_orders` counts it), or when it runs in a
    REPEATABLE READ or SERIALIZABLE transaction past its BEGIN (a BEGIN alone takes no
    snapshot, and commutes); any two steps of different sessions must have one opaque, or both
    such. Wrong either way costs time only: the exhaustive search is exact too.
    """
    from pgrace.model.orders.space import Space

    setups = {s.name: s.setup or "" for s in scenario.sessions}
    sessions: list[list[tuple[bool, bool]]] = []  # per session, per step: (opaque, isolated)
    for chain in Space(scenario).chains:
        setup = setups.get(scenario.step(chain[0]).session, "")
        default_isolated = bool(ISOLATED.search(setup)) and "default_transaction_isolation" in setup.lower()
        in_block = bool(BEGINS.search(setup)) and not ENDS.search(setup)
        isolated_block = in_block and bool(ISOLATED.search(setup))
        steps = []
        for name in chain:
            step = scenario.step(name)
            nature = nature_of(step, scenario)
            begins = bool(BEGINS.search(step.sql))
            if begins:
                isolated_block = default_isolated or bool(ISOLATED.search(step.sql))
            elif ISOLATED.search(step.sql):  # SET TRANSACTION ISOLATION LEVEL inside the block
                isolated_block = True
            opaque = nature.opaque or not (in_block or begins or nature.local)
            lone_begin = begins and nature.single_transaction_statement
            steps.append((opaque, (in_block or begins) and isolated_block and not lone_begin and not nature.local))
            in_block = (in_block or begins) and not ENDS.search(step.sql)
        sessions.append(steps)
    for i, mine in enumerate(sessions):
        for theirs in sessions[i + 1 :]:
            for opaque, isolated in mine:
                if any(
                    not (opaque or other_opaque or (isolated and other_isolated))
                    for other_opaque, other_isolated in theirs
                ):
                    return False
    return True
