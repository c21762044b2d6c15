"""--exec: commands' own connections, through the proxy, are the sessions of the one scheduler (real clients)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import cli
from proxying import cured_wait_as_pg_locks_shows

from pgrace.drivers.exec import explore_exec, run_exec
from pgrace.frontends import catalog
from pgrace.model.scenario import Command
from pgrace.servers import ServerInfo

CLIENTS = Path(__file__).parent / "clients"
EXAMPLES = Path(__file__).parents[1] / "examples" / "any-language"
WITHDRAW = f"{sys.executable} {EXAMPLES / 'withdraw.py'}"


def test_lost_update_one_run(pgrace_server: ServerInfo) -> None:
    scenario = catalog.read_scenario("lost-update", {})
    commands = [Command("alice", WITHDRAW), Command("bob", WITHDRAW)]
    run = run_exec(scenario, commands, pgrace_server, order=["alice#1", "bob#1", "alice#1", "bob#1"])
    from pgrace.render.text import render_text

    print(render_text(run))
    assert [s.session for s in run.scenario.steps][:4] == ["alice#1", "bob#1", "alice#1", "bob#1"]


def test_lost_update_explored(pgrace_server: ServerInfo) -> None:
    scenario = catalog.read_scenario("lost-update", {})
    commands = [Command("alice", WITHDRAW), Command("bob", WITHDRAW)]
    found = explore_exec(scenario, commands, pgrace_server)
    for cls in found.classes:
        print(cls.summary, cls.count)
    print(found.runs, found.complete, found.incomplete)
    assert found.complete


@pytest.mark.thorough  # 18 s; test_results' explore --exec cases hold the CLI's exits every day
def test_cli_explore_finds_the_bug_and_proves_the_cure(pgrace_server: ServerInfo) -> None:
    alice, bob = f"alice={WITHDRAW}", f"bob={WITHDRAW}"
    found = cli("explore", "lost-update", "--exec", alice, "--exec", bob, "--dsn", pgrace_server.dsn)
    print(found.output, found.stderr)
    cured = cli(
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


def test_the_wait_is_what_pg_locks_shows(pgrace_server: ServerInfo, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bob's FOR UPDATE waits for Alice's: the timeline names the row, holder and modes pg_locks shows then."""
    order = ["alice#1", "alice#1", "bob#1", "bob#1"]
    cured_wait_as_pg_locks_shows(pgrace_server, monkeypatch, WITHDRAW + " --for-update", order)


def test_a_command_that_connects_around_the_proxy_fails_the_run(
    pgrace_server: ServerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(pgrace_server.dsn)
    monkeypatch.setenv("AROUND_HOST", str(params["host"]))
    monkeypatch.setenv("AROUND_PORT", str(params.get("port") or 5432))
    around = f"around={sys.executable} {CLIENTS / 'around.py'}"
    result = cli("run", "lost-update", "--exec", f"alice={WITHDRAW}", "--exec", around, "--dsn", pgrace_server.dsn)
    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    assert "around pgrace's proxy" in line and "did not order" in line


def test_pooled_connections_are_sessions_of_their_own(pgrace_server: ServerInfo) -> None:
    """An idle connection beside a parked one: the process waits for pgrace, so the run goes on; each connection
    that sends a statement is a session, named by the order the process opened it."""
    scenario = catalog.read_scenario("lost-update", {})
    pooled = f"{sys.executable} {CLIENTS / 'pooled.py'}"
    run = run_exec(scenario, [Command("pool", pooled), Command("bob", WITHDRAW)], pgrace_server)
    sessions = [(s.session, s.sql) for s in run.scenario.steps]
    assert sessions == [  # the first ready session, by name, goes each time
        ("bob#1", "BEGIN"),
        ("bob#1", "SELECT balance FROM accounts WHERE id = 1"),
        ("bob#1", "UPDATE accounts SET balance = 400 WHERE id = 1"),
        ("bob#1", "COMMIT"),
        ("pool#2", "BEGIN"),
        ("pool#2", "SELECT balance FROM accounts WHERE id = 1"),
        ("pool#2", "UPDATE accounts SET balance = 300 WHERE id = 1"),
        ("pool#2", "COMMIT"),
        ("pool#1", "BEGIN"),
        ("pool#1", "SELECT 1"),
        ("pool#1", "COMMIT"),
    ]
    assert [s.name for s in run.scenario.sessions] == ["pool#1", "pool#2", "bob#1"]


def test_a_command_that_fails_is_an_outcome(pgrace_server: ServerInfo) -> None:
    """A non-zero exit is a step of the run with the command's last line of stderr, not a crash."""
    scenario = catalog.read_scenario("lost-update", {})
    failing = f"{sys.executable} -c \"import sys; sys.exit('no more money')\""
    run = run_exec(scenario, [Command("alice", WITHDRAW), Command("broke", failing)], pgrace_server)
    [failed] = [s for s in run.steps if s.outcome is not None and s.outcome.error is not None]
    assert (failed.session, failed.sql) == ("broke", "exit 1")
    assert failed.outcome is not None and failed.outcome.error is not None
    assert (failed.outcome.error.sqlstate, failed.outcome.error.message) == ("exit 1", "no more money")


@pytest.fixture(scope="module")
def node_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """node-postgres, installed with npm for these tests alone: NODE_PATH for the commands."""
    from tools import clients

    return str(clients.node_modules(tmp_path_factory.mktemp("node")) / "node_modules")


def _explore(monkeypatch: pytest.MonkeyPatch, node_path: str, *args: str) -> tuple[int, str]:
    monkeypatch.setenv("NODE_PATH", node_path)
    result = cli("explore", *args)
    return result.exit_code, result.output


def test_node_lost_update_found_and_its_cure_proved(
    pgrace_server: ServerInfo, monkeypatch: pytest.MonkeyPatch, node_path: str
) -> None:
    withdraw = f"node {EXAMPLES / 'withdraw.js'}"
    dsn = ("--dsn", pgrace_server.dsn)
    code, found = _explore(
        monkeypatch, node_path, "lost-update", "--exec", f"alice={withdraw}", "--exec", f"bob={withdraw}", *dsn
    )
    assert code == 0, found
    assert "all 6 interleavings, 7 runs: 2 outcome classes" in found
    assert "reproduces the bug" in found
    cured = f"{withdraw} --for-update"
    code, proved = _explore(
        monkeypatch, node_path, "lost-update", "--fix", "--exec", f"alice={cured}", "--exec", f"bob={cured}", *dsn
    )
    assert code == 0, proved
    assert "all 6 interleavings, 7 runs: 1 outcome class" in proved and "holds" in proved
    code, exhaustive = _explore(
        monkeypatch,
        node_path,
        "lost-update",
        "--fix",
        "--no-reduce",
        "--exec",
        f"alice={cured}",
        "--exec",
        f"bob={cured}",
        *dsn,
    )
    assert code == 0, exhaustive
    assert "all 24 interleavings: 1 outcome class" in exhaustive, exhaustive  # reduced: 6, and a first run


@pytest.mark.slow
@pytest.mark.thorough  # a minute; the lost update above is node's everyday test
def test_node_queue_worker_claims_no_job_twice(
    pgrace_server: ServerInfo, monkeypatch: pytest.MonkeyPatch, node_path: str
) -> None:
    worker = f"node {EXAMPLES / 'worker.js'}"
    code, out = _explore(
        monkeypatch,
        node_path,
        str(EXAMPLES / "queue.toml"),
        "--exec",
        f"w1={worker} w1 --once",
        "--exec",
        f"w2={worker} w2 --once",
        "--dsn",
        pgrace_server.dsn,
    )
    assert code == 0, out
    assert "all 70 interleavings, 71 runs: 1 outcome class" in out
    assert "no class shows the bug" in out


@contextlib.contextmanager
def never_left_running(child: subprocess.Popen[str], dsn: str) -> Iterator[None]:
    """However the test ends, the pgrace it started has ended too: a failure leaves the next tests a clean server."""
    try:
        yield
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
            subprocess.run([sys.executable, "-m", "pgrace", "clean", "--dsn", dsn], check=True, capture_output=True)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL])
def test_a_signal_mid_run_leaves_no_process_connection_database_or_role(
    pgrace_server: ServerInfo, tmp_path: Path, signum: int
) -> None:
    """pgrace stopped while a command works inside its transaction: the command's processes go with it (the shell
    and what the shell started), and so do its connection, the scratch database and the run's role (after `pgrace
    clean`, for SIGKILL)."""
    import psycopg
    from procs import wait_gone

    pid_file = tmp_path / "pid"
    hold = f"alice={sys.executable} {CLIENTS / 'hold.py'} {pid_file} && true"  # a list: no shell execs into the client
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pgrace",
            "run",
            "lost-update",
            "--exec",
            hold,
            "--step-timeout",
            "60",
            "--dsn",
            pgrace_server.dsn,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # SIGABRT on a hang prints where each thread was
    )
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin, never_left_running(child, pgrace_server.dsn):
        roles = "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'pgrace%'"
        (roles_before,) = admin.execute(roles).fetchone() or (0,)
        locked = "SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND mode = 'ExclusiveLock'"
        holders = "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'"
        deadline = time.monotonic() + 60
        while (
            not pid_file.exists() or admin.execute(holders).fetchone() != (1,) or not admin.execute(locked).fetchone()
        ):
            assert time.monotonic() < deadline and child.poll() is None, child.communicate()
            time.sleep(0.01)  # polling for the client to be inside its transaction, not lock detection
        client = int(pid_file.read_text())
        during = admin.execute("SELECT count(*) FROM pg_database WHERE datname LIKE 'pgrace%'").fetchone()
        assert during == (1,)
        child.send_signal(signum)
        try:
            child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGABRT)
            _, stacks = child.communicate()
            pytest.fail(f"pgrace did not end within 30 s of the signal; its threads:\n{stacks}")
        assert child.returncode == (130 if signum == signal.SIGINT else -signal.SIGKILL)
        assert wait_gone(client), "the command outlived pgrace"
        if signum == signal.SIGKILL:
            subprocess.run(
                [sys.executable, "-m", "pgrace", "clean", "--dsn", pgrace_server.dsn], check=True, capture_output=True
            )
        left = admin.execute(
            "SELECT (SELECT count(*) FROM pg_database WHERE datname LIKE 'pgrace%'),"
            f" ({roles}) - {roles_before},"
            " (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            "  AND datname LIKE 'pgrace%')"
        ).fetchone()
    assert left == (0, 0, 0)


def test_a_statement_past_the_step_timeout_says_pgrace_cancelled_it(pgrace_server: ServerInfo) -> None:
    """The proxy's step is cancelled at the step timeout as any step is, and its error says who cancelled it, as a
    code session's and a setup's do: the application's own cancel would read the same SQLSTATE."""
    scenario = catalog.read_scenario("lost-update", {})
    sleeper = (
        f"{sys.executable} -c \"import os, psycopg; psycopg.connect(os.environ['DATABASE_URL'], autocommit=True)"
        ".execute('SELECT pg_sleep(60)')\""
    )
    run = run_exec(scenario, [Command("sleeper", sleeper)], pgrace_server, step_timeout=5)  # room to start Python
    [step] = [s for s in run.steps if s.sql == "SELECT pg_sleep(60)"]
    assert step.outcome is not None and step.outcome.error is not None
    assert step.outcome.error.sqlstate == "57014"
    assert step.outcome.error.detail == "pgrace cancelled it after the step timeout 5 s"
