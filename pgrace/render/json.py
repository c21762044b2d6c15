"""The machine-readable timeline: a documented, stable JSON contract (docs/reference/json.md).

Times are milliseconds since the run started; they live here, never in the text output.
"""

from __future__ import annotations

import json
from typing import Any

from pgrace.model.timeline import AdvisoryKey, HeldLock, Outcome, Release, Run, ServerChose, StepRun, Wait
from pgrace.model.values import to_json_value
from pgrace.text import json_safe

SCHEMA_VERSION = 1


def run_to_dict(run: Run) -> dict[str, Any]:
    scenario = run.scenario
    return {
        "schema": SCHEMA_VERSION,
        "scenario": scenario.name,
        "title": scenario.title,
        "variant": scenario.variant,
        "source": scenario.source,
        "server_version": run.server_version,
        "server": run.server_label,
        "row_locks_available": run.row_locks_available,
        "sessions": scenario.session_names,
        "params": {k: to_json_value(v) for k, v in scenario.params},
        "steps": [_step(s) for s in run.step_runs()],
        "sessions_lost": [
            {
                "session": e.session,
                "at_step": e.during_seq,
                "sqlstate": e.sqlstate,
                "message": e.message,
                "idle": e.idle,
            }
            for e in run.sessions_lost()
        ],
        "final": [
            {
                "description": check.description,
                "kind": check.kind,
                "sql": check.sql,
                **_result(run.check_outcomes().get(i)),
            }
            for i, check in enumerate(scenario.checks)
        ],
        "checks": [
            {
                "description": c.description,
                "ok": c.ok,
                "expected": c.expected,
                "actual": c.actual,
                "step": c.step,
                "line": c.line,
            }
            for c in run.checks
        ],
        "ok": run.ok,
    }


def render_json(run: Run) -> str:
    return json_safe(json.dumps(run_to_dict(run), indent=2, ensure_ascii=False)) + "\n"


def _step(run: StepRun) -> dict[str, Any]:
    outcome = run.outcome
    error = outcome.error if outcome else None
    return {
        "index": run.seq,
        "permutation": run.permutation,
        "name": run.step,
        "session": run.session,
        "sql": run.sql,
        "status": run.status,
        "retry_loop": run.loop,
        "attempt": run.attempt,
        "retried": run.retried,
        "waited": run.waited,
        "blocked_by": run.blocked_by,
        "waited_on": [_wait(w) for w in run.waits],
        **_result(outcome),
        "error": {
            "sqlstate": error.sqlstate,
            "message": error.message,
            "severity": error.severity,
            "detail": error.detail,
            "cycle": list(error.cycle),
            "predicate_locks": [_lock(lock) for lock in run.predicate_locks_at_error],
        }
        if error
        else None,
        "released_by": run.released_by,
        "release": _release(run.release),
        "server_chose": [_chosen(event) for event in run.overtaken],
        "locks_after": [_lock(lock) for lock in run.locks_after] if run.locks_after is not None else None,
        "other_locks_after": [_lock(lock) for lock in run.other_locks_after],
        "started_ms": round(run.started_ms, 3),
        "wait_detected_ms": round(run.wait_detected_ms, 3) if run.wait_detected_ms is not None else None,
        "finished_ms": round(run.finished_ms, 3) if run.finished_ms is not None else None,
    }


def _release(release: Release | None) -> dict[str, Any] | None:
    """What ended the step's wait: the same fact the text and pictures tell."""
    if release is None:
        return None
    return {
        "cause": release.cause,
        "step": release.seq,
        "session": release.session,
        "failed": release.failed,
        "reason": release.reason,
    }


def _chosen(event: ServerChose) -> dict[str, Any]:
    """A COMMIT or ROLLBACK woke this step and another, and the server let the other go first: whom it waits for now."""
    return {
        "went_first": event.winner_seq,
        "session": event.winner,
        "woken_by": event.released_by,
        "waits_on": [_wait(w) for w in event.waits],
        "detected_ms": round(event.t, 3),
    }


def _result(outcome: Outcome | None) -> dict[str, Any]:
    last = outcome.last_rows if outcome else None
    return {
        "columns": list(last.columns) if last else None,
        "rows": [[to_json_value(v) for v in row] for row in last.rows] if last else None,
        "commands": list(outcome.commands) if outcome else [],
    }


def _wait(wait: Wait) -> dict[str, Any]:
    return {
        "kind": wait.kind,
        "table": wait.row.table if wait.row else wait.table,
        "key": {k: to_json_value(v) for k, v in wait.row.key} if wait.row else None,
        "ctid": wait.ctid,
        "holder": wait.holder if wait.holder else (wait.blocked_by[0] if wait.blocked_by else None),
        "mode": wait.mode,
        "holder_mode": wait.holder_mode,
        "blocked_by": list(wait.blocked_by),
        "queued_behind": list(wait.queued_behind),
        "detail": wait.detail or None,
        "chain": [
            {"waiter": link.waiter, "session": link.session, "how": link.how, "mode": link.mode, "wants": link.wants}
            for link in wait.chain
        ],
        "advisory": _advisory(wait.advisory),
        "unique_indexes": list(wait.unique_indexes),
        "reason": wait.reason or None,
    }


def _advisory(key: AdvisoryKey | None) -> dict[str, Any] | None:
    if key is None:
        return None
    return {"keys": list(key.keys), "shared": key.shared, "level": key.level}


def _lock(lock: HeldLock) -> dict[str, Any]:
    return {
        "table": lock.row.table if lock.row else (lock.table or None),
        "key": {k: to_json_value(v) for k, v in lock.row.key} if lock.row else None,
        "ctid": lock.ctid or None,
        "session": lock.session,
        "mode": lock.mode,
        "kind": lock.kind,
        "advisory": _advisory(lock.advisory),
        "page": lock.page,
    }
