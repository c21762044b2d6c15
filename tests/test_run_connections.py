"""Both transports open a run's connections the same way: all at once, through one RunConnections."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from pgrace import api, scratch
from pgrace.drivers.code import run_code
from pgrace.frontends.catalog import read_scenario
from pgrace.servers import ServerInfo


def _opened_together(monkeypatch: pytest.MonkeyPatch, parties: int) -> list[str]:
    """The first ``parties`` connections each wait, before connecting, until all of them are asked for.

    Opened one at a time, the first would wait alone and the barrier break: the run fails.
    """
    barrier = threading.Barrier(parties, timeout=10)
    asked: list[str] = []
    lock = threading.Lock()
    real = scratch.connect

    def connect(*args: Any, **kwargs: Any) -> Any:
        with lock:
            asked.append(str(kwargs["application_name"]))
            first = len(asked) <= parties
        if first:
            barrier.wait()
        return real(*args, **kwargs)

    monkeypatch.setattr(scratch, "connect", connect)
    return asked


def test_a_scenario_run_opens_control_sessions_and_observer_at_once(
    pgrace_server: ServerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = read_scenario("lost-update")
    asked = _opened_together(monkeypatch, len(scenario.sessions) + 2)
    run = api.run(scenario, server=pgrace_server)
    assert run.step_runs()
    together = {name.rsplit("/", 1)[1] for name in asked[: len(scenario.sessions) + 2]}
    assert together == {"control connection", "observer", *(s.name for s in scenario.sessions)}


def test_a_code_run_opens_control_and_observer_at_once(
    pgrace_server: ServerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    def one(conn: psycopg.Connection[Any]) -> None:
        conn.execute("SELECT 1")
        conn.commit()

    asked = _opened_together(monkeypatch, 2)
    run = run_code({"a": one}, server=pgrace_server)
    assert [s.status for s in run.step_runs()] == ["ok", "ok"]
    assert sorted(asked[:2]) == ["pgrace/one/control connection", "pgrace/one/observer"]
