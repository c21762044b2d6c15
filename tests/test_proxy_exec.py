"""--exec: commands' own connections, through the proxy, are the sessions of the one scheduler (real clients)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from pgrace.drivers.exec import explore_exec, run_exec
from pgrace.engine.proxy.processes import Command
from pgrace.formats import catalog
from pgrace.servers import ServerInfo

CLIENTS = Path(__file__).parent / "clients"
WITHDRAW = f"{sys.executable} {CLIENTS / 'withdraw.py'}"


@pytest.fixture(autouse=True)
def stub_relay(monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy_stub import StubProxy

    import pgrace.engine.proxy.runner as runner

    monkeypatch.setattr(runner.ExecRunner, "__init__", _with_stub(runner.ExecRunner.__init__, StubProxy))


def _with_stub(init: Any, stub: Any) -> Any:
    def patched(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("proxy", stub)
        init(self, *args, **kwargs)

    return patched


def test_lost_update_one_run(pgrace_server: ServerInfo) -> None:
    scenario = catalog.load("lost-update", {})
    commands = [Command("alice", WITHDRAW), Command("bob", WITHDRAW)]
    run = run_exec(scenario, commands, pgrace_server, order=["alice#1", "bob#1", "alice#1", "bob#1"])
    from pgrace.render.text import render_text

    print(render_text(run))
    assert [s.session for s in run.scenario.steps][:4] == ["alice#1", "bob#1", "alice#1", "bob#1"]


def test_lost_update_explored(pgrace_server: ServerInfo) -> None:
    scenario = catalog.load("lost-update", {})
    commands = [Command("alice", WITHDRAW), Command("bob", WITHDRAW)]
    found = explore_exec(scenario, commands, pgrace_server)
    for cls in found.classes:
        print(cls.summary, cls.count)
    print(found.runs, found.complete, found.incomplete)
    assert found.complete


def _cli(*args: str) -> Any:
    from click.testing import CliRunner

    from pgrace.cli import main

    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_cli_explore_finds_the_bug_and_proves_the_cure(pgrace_server: ServerInfo) -> None:
    alice, bob = f"alice={WITHDRAW}", f"bob={WITHDRAW}"
    found = _cli("explore", "lost-update", "--exec", alice, "--exec", bob, "--dsn", pgrace_server.dsn)
    print(found.output, found.stderr)
    cured = _cli(
        "explore",
        "lost-update",
        "--fix",
        "--exec",
        alice + " --for-update",
        "--exec",
        bob + " --for-update",
        "--dsn",
        pgrace_server.dsn,
    )
    print(cured.output, cured.stderr)
    assert found.exit_code == 0
    assert cured.exit_code == 0
