"""What a load measured: clients waiting on locks (sampled from pg_locks), latency percentiles, the load checks."""

from __future__ import annotations

import glob
import os
import re
from typing import Any

import psycopg

from pgrace.model import Scenario
from pgrace.pgbench.results import Violation
from pgrace.pgbench.script import compose_sql, load_of

_GONE = frozenset({"57P01", "57P02", "57P03"})  # admin shutdown, crash shutdown, cannot connect now


def connection_lost(exc: psycopg.Error) -> bool:
    """Whether ``exc`` says the connection (or the server) went away, by its SQLSTATE.

    No SQLSTATE on an OperationalError is libpq's own word: refused, reset, closed unexpectedly.
    """
    if exc.sqlstate is None:
        return isinstance(exc, psycopg.OperationalError)
    return exc.sqlstate in _GONE or exc.sqlstate.startswith("08")


_SAMPLE = """
WITH l AS MATERIALIZED (SELECT * FROM pg_locks)  -- one reading of the lock table for the whole sample
SELECT w.pid, w.locktype, coalesce(w.relation, t.relation)::regclass::text
FROM l w
JOIN pg_stat_activity a ON a.pid = w.pid
LEFT JOIN LATERAL (
  SELECT relation FROM l t WHERE t.pid = w.pid AND t.locktype = 'tuple' AND t.granted LIMIT 1
) t ON true
WHERE NOT w.granted AND a.application_name = %s
"""


def sample_waits(observer: Any, app: str) -> dict[int, str]:
    """pgbench's clients waiting on a lock right now, and on what, by pid."""
    waiting: dict[int, str] = {}
    for pid, locktype, relation in observer.execute(_SAMPLE, (app,)).fetchall():
        waiting[pid] = _describe(locktype, relation)
    return waiting


def _describe(locktype: str, relation: str | None) -> str:
    if locktype in ("tuple", "transactionid") and relation:
        return f"a row of {relation}"
    if locktype == "transactionid":
        return "another transaction"
    if locktype == "relation" and relation:
        return f"table {relation}"
    if locktype == "advisory":
        return "an advisory lock"
    return locktype


def pgbench_error_line(err: str) -> str:
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    for line in lines:
        if "aborted" in line or "ERROR" in line or "error" in line:
            return line
    return lines[0] if lines else "no message"


def number_in(pattern: str, text: str) -> float:
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def read_latencies(work: str) -> list[float]:
    """Milliseconds of every successful transaction, from pgbench's per-transaction logs (one per thread)."""
    values: list[float] = []
    for path in glob.glob(os.path.join(work, "tx.*")):
        with open(path, encoding="utf-8", errors="replace") as log:
            for line in log:
                fields = line.split()
                if len(fields) >= 3 and fields[2].isdigit():
                    values.append(int(fields[2]) / 1000.0)
    return values


def percentiles_of(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    ordered = sorted(values)

    def rank(p: float) -> float:  # nearest rank
        index = max(0, min(len(ordered) - 1, int(-(-p * len(ordered) // 100)) - 1))
        return round(ordered[index], 3)

    return {"p50": rank(50), "p95": rank(95), "p99": rank(99)}


def check_invariants(scenario: Scenario, dsn: str) -> list[Violation]:
    """Each load check's ``(expected, actual[, detail])``; a violation where they differ."""
    violations: list[Violation] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for check in load_of(scenario).checks:
            try:
                row = conn.execute(compose_sql(check.sql, scenario).encode()).fetchone()
            except psycopg.Error as exc:
                if connection_lost(exc):  # not the check's answer: the run cannot be judged
                    raise
                violations.append(Violation(check.description, "a row", f"error {exc.sqlstate}: {exc}"))
                continue
            if row is None or len(row) < 2:
                violations.append(Violation(check.description, "a row (expected, actual)", repr(row)))
                continue
            expected, actual = row[0], row[1]
            if expected != actual:
                shown = _text(actual) + (f" ({row[2]})" if len(row) > 2 and row[2] is not None else "")
                violations.append(Violation(check.description, _text(expected), shown))
    return violations


def _text(value: Any) -> str:
    return "NULL" if value is None else str(value)
