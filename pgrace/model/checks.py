"""Evaluate a scenario's expectations against what a run recorded.

Pure functions over a :class:`~pgrace.model.timeline.Run`: no database, no printing. Each
expectation becomes one :class:`~pgrace.model.timeline.CheckResult` saying what was expected
and what happened, so ``pgrace check`` can explain a failure in one line.
"""

from __future__ import annotations

from decimal import Decimal
from fnmatch import fnmatchcase
from typing import Any

from pgrace.model.scenario import RowRef, Scenario, StepExpectation, WaitTarget
from pgrace.model.timeline import RELEASE_CAUSES, CheckResult, HeldLock, Outcome, Run, SqlError, StepRun, Wait

NULL = "NULL"  # TOML has no null: the string "NULL" in expected rows matches SQL NULL


def evaluate(run: Run) -> list[CheckResult]:
    """Every step expectation, in step order, then every final-state check."""
    results: list[CheckResult] = []
    scenario = run.scenario
    for step_run in run.step_runs():
        step = scenario.step(step_run.step)
        if step_run.retried:  # an attempt another followed: the last attempt's steps are checked
            continue
        if not step.expect.is_empty():
            results.extend(_step_checks(step_run, step.expect, step.line, run.row_locks_available))
        if scenario.dialect == "pgrace":  # a spec's errors are output to compare, as isolationtester's
            results.extend(_unexpected_error(step_run, step.expect, step.line))
    outcomes = run.check_outcomes()
    for index, check in enumerate(scenario.checks):
        outcome = outcomes.get(index)
        expected = format_rows(check.rows)
        if outcome is None:
            results.append(CheckResult(check.description, False, expected, "not run", line=check.line))
            continue
        actual = _rows_of(outcome)
        ok = outcome.error is None and rows_equal(actual, check.rows)
        shown = _describe_outcome(outcome)
        results.append(CheckResult(check.description, ok, expected, shown, line=check.line))
    return results


def _unexpected_error(run: StepRun, expect: StepExpectation, line: int | None) -> list[CheckResult]:
    """A failed step whose error no expectation allows fails the verdict: errors are never silent.

    A step that was not sent because its session's connection was lost earlier (08003)
    is not an error of its own: the step that found the loss carries it.
    """
    error = run.outcome.error if run.outcome else None
    if error is None or expect.allows_error(error.sqlstate) or expect.sqlstate == "":
        return []  # error = false already fails with its own line
    if error.sqlstate == "08003":  # not sent: the session was already gone
        return []
    what = f"step {run.seq} failed unexpectedly: {error.sqlstate} {error.message}"
    if run.cancelled:
        what = f"step {run.seq} was cancelled by pgrace (--step-timeout): {error.sqlstate} {error.message}"
    allow = f'expect = {{ error = "{error.sqlstate}" }} or {{ may_fail = true }}'
    return [CheckResult(what, False, f"no error (or {allow})", f"{error.sqlstate} {error.message}", run.step, line)]


def _step_checks(run: StepRun, expect: StepExpectation, line: int | None, locks_known: bool) -> list[CheckResult]:
    out: list[CheckResult] = []
    name = run.step

    def add(description: str, ok: bool, expected: str, actual: str) -> None:
        out.append(CheckResult(f"{name}: {description}", ok, expected, actual, step=name, line=line))

    waited_desc = _describe_wait(run)
    if expect.waits is not None:
        add(
            "waits" if expect.waits else "does not wait",
            run.waited == expect.waits,
            "a wait" if expect.waits else "no wait",
            waited_desc,
        )
    if expect.waits_for is not None:
        seen = set(run.blocked_by) | {w.holder for w in run.waits if w.holder}
        add(
            f"waits for {', '.join(expect.waits_for)}",
            run.waited and set(expect.waits_for) <= seen,
            "waits for " + ", ".join(expect.waits_for),
            waited_desc,
        )
    if isinstance(expect.waits_on, RowRef):
        rows = [w.row for w in run.waits if w.row is not None]
        target = expect.waits_on
        add(
            f"waits on {target}",
            run.waited and any(row_matches(r, target) for r in rows),
            f"waits on {target}",
            waited_desc,
        )
    elif expect.waits_on is not None:
        other = expect.waits_on
        add(
            f"waits on {other}",
            run.waited and any(wait_matches(w, other) for w in run.waits),
            f"waits on {other}",
            waited_desc,
        )
    error = run.outcome.error if run.outcome else None
    actual_error = f"{error.sqlstate} {error.message}" if error else ("no error" if run.outcome else run.status)
    if expect.sqlstate is not None:
        if expect.sqlstate:
            add(
                f"fails with {expect.sqlstate}",
                error is not None and error.sqlstate == expect.sqlstate,
                f"error {expect.sqlstate}",
                actual_error,
            )
        else:
            add(
                "succeeds",
                run.outcome is not None and error is None,
                "no error",
                actual_error,
            )
    if expect.released_by is not None:
        add(
            f"released by {expect.released_by}",
            run.waited and _released_by(run, expect.released_by),
            f"released by {expect.released_by}",
            _describe_release(run),
        )
    if expect.message is not None:
        add(
            f"fails with a message like {expect.message!r}",
            error is not None and fnmatchcase(error.message, expect.message),
            f"an error like {expect.message!r}",
            actual_error,
        )
    if expect.deadlock is not None:
        cycle = f" of {', '.join(expect.deadlock)}" if expect.deadlock else ""
        victim = error is not None and error.sqlstate == "40P01"
        add(
            f"is the victim of a deadlock{cycle}",
            victim and (not expect.deadlock or _cycle_sessions(error) == set(expect.deadlock)),
            f"error 40P01{cycle}",
            actual_error + (f" (cycle: {', '.join(error.cycle)})" if error is not None and error.cycle else ""),
        )
    if expect.rows is not None:
        actual_rows = _rows_of(run.outcome) if run.outcome else []
        add(
            f"returns {format_rows(expect.rows)}",
            run.outcome is not None and error is None and rows_equal(actual_rows, expect.rows),
            format_rows(expect.rows),
            _describe_outcome(run.outcome) if run.outcome else run.status,
        )
    if expect.locks is not None:
        expected = "; ".join(f"{e.session}: {e.row} {e.mode or 'any mode'}" for e in expect.locks) or "no row locks"
        if not locks_known or run.locks_after is None:
            add(
                "row locks after it",
                False,
                expected,
                "unknown (pgrowlocks is not available)",
            )
        else:
            held = list(run.locks_after)
            ok = len(held) == len(expect.locks) and all(
                any(_lock_matches(h, e.row, e.session, e.mode) for h in held) for e in expect.locks
            )
            add("row locks after it", ok, expected, format_locks(held))
    return out


def _cycle_sessions(error: SqlError | None) -> set[str]:
    """The sessions of a deadlock cycle: each link reads "<session> waits for ...", a session name has no space."""
    return {link.split(" ", 1)[0] for link in error.cycle} if error is not None else set()


def wait_matches(wait: Wait, target: WaitTarget) -> bool:
    """A recorded wait is the one a scenario expects (a table's lock, an advisory key, a transaction, a unique key)."""
    if target.kind == "relation":
        return wait.kind == "relation" and wait.table == target.table and target.mode in (None, wait.mode)
    if target.kind == "advisory":
        return wait.kind == "advisory" and wait.advisory is not None and wait.advisory.keys == target.advisory
    if target.kind == "transaction":  # its xid (a row it holds too), its virtual xid, its insertion's token
        kinds = ("transaction", "row", "virtualxid", "speculative")
        return wait.kind in kinds and target.session in (wait.holder, *wait.blocked_by)
    indexes = (
        wait.unique_indexes
    )  # one name is the index; several are candidates, and the expected one must be among them
    return wait.kind == "transaction" and bool(indexes) and (target.index is None or target.index in indexes)


def _lock_matches(lock: HeldLock, row: RowRef, session: str, mode: str | None) -> bool:
    return (
        lock.row is not None
        and row_matches(lock.row, row)
        and lock.session == session
        and (mode is None or lock.mode == mode)
    )


def row_matches(actual: RowRef, expected: RowRef) -> bool:
    """Tables compare without schema qualification; key values loosely (1 == Decimal(1))."""
    if actual.table.split(".")[-1].strip('"') != expected.table.split(".")[-1].strip('"'):
        return False
    return dict(actual.key).keys() == dict(expected.key).keys() and all(
        values_equal(dict(actual.key)[k], v) for k, v in expected.key
    )


def values_equal(actual: Any, expected: Any) -> bool:
    if isinstance(actual, bool) or isinstance(expected, bool):
        return type(actual) is bool and type(expected) is bool and actual == expected
    if isinstance(actual, (int, float, Decimal)) and isinstance(expected, (int, float)):
        return Decimal(str(actual)) == Decimal(str(expected))
    if actual is None or expected is None:
        return actual is expected or (actual is None and expected == NULL)
    if isinstance(expected, str) and not isinstance(actual, str):
        return str(actual) == expected
    return bool(actual == expected)


def rows_equal(actual: list[tuple[Any, ...]], expected: tuple[tuple[Any, ...], ...]) -> bool:
    return len(actual) == len(expected) and all(
        len(a) == len(e) and all(values_equal(x, y) for x, y in zip(a, e, strict=True))
        for a, e in zip(actual, expected, strict=True)
    )


def _rows_of(outcome: Outcome | None) -> list[tuple[Any, ...]]:
    last = outcome.last_rows if outcome else None
    return list(last.rows) if last else []


def format_value(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    return str(value)


def format_rows(rows: tuple[tuple[Any, ...], ...] | list[tuple[Any, ...]]) -> str:
    if not rows:
        return "no rows"
    return ", ".join("(" + ", ".join(format_value(v) for v in row) + ")" for row in rows)


def format_locks(locks: list[HeldLock] | tuple[HeldLock, ...]) -> str:
    return "; ".join(f"{lock.session}: {lock.describe_row()} {lock.mode}" for lock in locks) or "no row locks"


def _describe_outcome(outcome: Outcome) -> str:
    if outcome.error is not None:
        return f"error {outcome.error.sqlstate} {outcome.error.message}"
    return format_rows(_rows_of(outcome))


def _released_by(run: StepRun, expected: str) -> bool:
    """``expected`` is a session (a step of it ended the wait) or a cause such as ``deadlock``."""
    release = run.release
    if release is None:
        return False
    if expected in RELEASE_CAUSES:
        return release.cause == expected
    return release.cause == "step" and release.session == expected


def _describe_release(run: StepRun) -> str:
    release = run.release
    if not run.waited or release is None:
        return "no wait" if not run.waited else "not finished"
    if release.cause == "step":
        return f"released by {release.session} (step {release.seq})"
    if release.cause == "deadlock":
        return f"ended by the deadlock detector (victim: step {release.seq})"
    if release.cause == "terminated":
        return f"ended when {release.session}'s backend was terminated"
    return f"ended by {release.cause}"


def _describe_wait(run: StepRun) -> str:
    if not run.waited:
        return "no wait"
    parts = []
    for wait in run.waits:
        target = str(wait.row) if wait.row else (wait.table or wait.kind)
        parts.append(f"waited for {', '.join(wait.blocked_by) or '?'} on {target}")
    return "; ".join(parts) or "waited"


def expectations_count(scenario: Scenario) -> int:
    return sum(1 for s in scenario.steps if not s.expect.is_empty()) + len(scenario.checks)
