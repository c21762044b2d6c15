"""What a load measured: clients waiting on locks (sampled from pg_locks), latency percentiles, the load checks."""

from __future__ import annotations

import glob
import os
import re
from typing import Any

import psycopg
from psycopg import pq

from pgrace.drivers.load.script import compose_sql, load_of
from pgrace.engine.control import ControlSql
from pgrace.engine.results import result_set
from pgrace.model.load import Violation
from pgrace.model.scenario import Scenario

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


def check_invariants(scenario: Scenario, dsn: str, timeout: float = 60.0) -> list[Violation]:
    """Each load check's ``(expected, actual[, detail])``; a violation where they differ."""
    violations: list[Violation] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for check in load_of(scenario).checks:
            text = compose_sql(check.sql, scenario)
            res, _ = control_sql(timeout).result(conn.pgconn, text)  # a lost connection raises
            if res.status in (pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.NONFATAL_ERROR):
                code = res.error_field(pq.DiagnosticField.SQLSTATE)
                said = f"error {code.decode() if code else None}: {res.get_error_message()}"
                violations.append(Violation(check.description, "a row", said))
                continue
            rows = result_set(res).rows if res.status == pq.ExecStatus.TUPLES_OK else ()
            row = rows[0] if rows else None
            if row is None or len(row) < 2:
                violations.append(Violation(check.description, "a row (expected, actual)", repr(row)))
                continue
            expected, actual = row[0], row[1]
            if expected != actual:
                shown = _text(actual) + (f" ({row[2]})" if len(row) > 2 and row[2] is not None else "")
                violations.append(Violation(check.description, _text(expected), shown))
    return violations


def control_sql(timeout: float) -> ControlSql:
    """pgrace's own SQL of a load run (setup, checks): cut after ``--setup-timeout``, and a lost connection
    is psycopg's error, which the caller turns into RunAborted after asking whether the server is gone."""
    return ControlSql(
        timeout, timeout_name="--setup-timeout", aborted=lambda where, detail: psycopg.OperationalError(detail)
    )


def _text(value: Any) -> str:
    return "NULL" if value is None else str(value)
