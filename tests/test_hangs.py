"""Nothing blocks forever, and Ctrl-C or SIGTERM always ends a run, cleaned up, within 2 s.

A spec's setup or teardown SQL can wait forever on a lock held by a session left inside
a transaction (isolationtester itself would hang there). pgrace bounds setup and teardown
by ``--step-timeout`` like steps, and answers SIGINT/SIGTERM in every phase of a run.

The child process is signalled at a phase observed on the server (pg_stat_activity shows
the blocked statement) or on disk (the embedded server's run directory appears), never
after a guessed delay.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from procs import alive, wait_gone

from pgrace.servers import ServerInfo

pytestmark = pytest.mark.server

# s1 is left inside a transaction holding an ACCESS EXCLUSIVE lock: the teardown's DROP waits forever.
TEARDOWN_HANG = """
setup { CREATE TABLE t (id int); }
teardown { DROP TABLE t; }
session s1
step s1a { BEGIN; LOCK TABLE t; }
session s2
step s2a { SELECT 1 AS one; }
permutation s1a s2a
"""
# s1's setup takes the lock inside a transaction; s2's setup then waits for it forever.
SETUP_HANG = """
setup { CREATE TABLE t (id int); }
teardown { DROP TABLE t; }
session s1
setup { BEGIN; LOCK TABLE t; }
step s1a { COMMIT; }
session s2
setup { SELECT count(*) FROM t; }
step s2a { SELECT 1 AS one; }
"""
# s2's step waits for s1's lock; nothing later releases it (the runner waits for it at the end).
STEP_HANG = """
setup { CREATE TABLE t (id int); }
teardown { DROP TABLE t; }
session s1
step s1a { BEGIN; LOCK TABLE t; }
session s2
step s2a { SELECT count(*) FROM t; }
permutation s1a s2a
"""
# A step that is busy, not blocked: pg_sleep.
STEP_BUSY = """
session s1
step s1a { SELECT pg_sleep(600); }
"""
RUN_ROOT = Path("/dev/shm")


def spec(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.spec"
    path.write_text(text)
    return path


def start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pgrace", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1", **(env or {})},
    )


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    """Child processes, killed if a test fails before they end (a hang must not outlive its test)."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for child in started:
        if child.poll() is None:
            child.kill()
            child.communicate()


def wait_until(what: str, condition: Callable[[], bool], child: subprocess.Popen[str], deadline_s: float = 30) -> None:
    end = time.monotonic() + deadline_s
    while not condition():
        if child.poll() is not None:
            out, err = child.communicate()
            pytest.fail(f"pgrace ended (exit {child.returncode}) before {what}:\n{out}\n{err}")
        if time.monotonic() > end:
            pytest.fail(f"never saw {what}")
        time.sleep(0.01)  # polling the server for a phase; not a stand-in for pgrace's own detection


def blocked_statement(dsn: str, prefix: str, waiting_for: str = "Lock") -> Callable[[], bool]:
    """True once the server shows a statement starting with ``prefix`` waiting (for a lock, by default)."""

    def seen() -> bool:
        with psycopg.connect(dsn, autocommit=True) as admin:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND wait_event_type = %s"
                " AND application_name LIKE 'isolation/%%' AND query LIKE %s",
                (waiting_for, prefix + "%"),
            ).fetchone()
        return bool(row and row[0])

    return seen


def leftovers(dsn: str, name: str) -> tuple[list[str], int]:
    """Scratch databases and sessions of spec ``name`` still on the server."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        databases = admin.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", (f"pgrace\\_{name.replace('-', '_')}%",)
        ).fetchall()
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s", (f"isolation/{name}/%",)
        ).fetchone()
    return [d for (d,) in databases], row[0] if row else -1


def end_within(child: subprocess.Popen[str], signum: int, seconds: float) -> tuple[float, str]:
    sent = time.monotonic()
    child.send_signal(signum)
    try:
        _, err = child.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        _, err = child.communicate()
        pytest.fail(f"pgrace ignored signal {signum} for 30 s: {err}")
    took = time.monotonic() - sent
    assert took < seconds, f"pgrace took {took:.2f} s to end after signal {signum}"
    return took, err


SIGNALS = pytest.mark.parametrize(
    ("signum", "code", "word"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)


@pytest.mark.parametrize("fmt", ["isolation", "text"])
def test_a_teardown_that_blocks_forever_is_cancelled_after_the_step_timeout(
    tmp_path: Path, pgrace_server: ServerInfo, children: list[subprocess.Popen[str]], fmt: str
) -> None:
    path = spec(tmp_path, "teardown-hang", TEARDOWN_HANG)
    child = start(["run", str(path), "--format", fmt, "--step-timeout", "0.5", "--dsn", pgrace_server.dsn])
    children.append(child)
    try:
        out, err = child.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the blocked teardown was not bounded by --step-timeout")
    assert child.returncode == 0, err  # as isolationtester: a failed teardown is reported, not fatal
    failure = "teardown failed: ERROR:  canceling statement due to user request"
    if fmt == "isolation":  # in the output, where isolationtester writes it
        assert f"{failure}\nDETAIL:  pgrace cancelled it after --step-timeout 0.5 s\n" in out
        assert err == ""
    else:
        assert err == f"pgrace: note: {failure} (pgrace cancelled it after --step-timeout 0.5 s)\n"
    assert "Traceback" not in err
    assert leftovers(pgrace_server.dsn, "teardown-hang") == ([], 0)


def test_a_setup_that_blocks_forever_fails_the_run_after_the_step_timeout(
    tmp_path: Path, pgrace_server: ServerInfo, children: list[subprocess.Popen[str]]
) -> None:
    path = spec(tmp_path, "setup-hang", SETUP_HANG)
    child = start(["run", str(path), "--step-timeout", "0.5", "--dsn", pgrace_server.dsn])
    children.append(child)
    try:
        _, err = child.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the blocked setup was not bounded by --step-timeout")
    assert child.returncode == 1  # the scenario's own doing: not invalid input, not the server's fault
    assert err.startswith(f"pgrace: {path}:")
    assert "setup of session s2 failed" in err and "after --step-timeout 0.5 s" in err
    assert len(err.splitlines()) == 1, err
    assert leftovers(pgrace_server.dsn, "setup-hang") == ([], 0)


@pytest.mark.timing
@SIGNALS
@pytest.mark.parametrize(
    ("name", "text", "statement", "waiting_for"),
    [
        ("teardown-hang", TEARDOWN_HANG, "DROP TABLE", "Lock"),
        ("setup-hang", SETUP_HANG, "SELECT count(*) FROM t", "Lock"),
        ("step-hang", STEP_HANG, "SELECT count(*) FROM t", "Lock"),
        ("step-busy", STEP_BUSY, "SELECT pg_sleep", "Timeout"),
    ],
)
def test_a_signal_ends_a_run_in_setup_steps_or_teardown_within_2_s(
    tmp_path: Path,
    pgrace_server: ServerInfo,
    children: list[subprocess.Popen[str]],
    name: str,
    text: str,
    statement: str,
    waiting_for: str,
    signum: int,
    code: int,
    word: str,
) -> None:
    path = spec(tmp_path, name, text)
    child = start(["run", str(path), "--step-timeout", "600", "--dsn", pgrace_server.dsn])
    children.append(child)
    wait_until(f"{statement} waiting", blocked_statement(pgrace_server.dsn, statement, waiting_for), child)
    _, err = end_within(child, signum, 2.0)
    assert child.returncode == code, err
    assert err == f"pgrace: {word}; cleaned up\n"
    assert leftovers(pgrace_server.dsn, name) == ([], 0)


@pytest.mark.timing
@pytest.mark.skipif(not RUN_ROOT.is_dir(), reason="no /dev/shm on this machine")
@SIGNALS
def test_a_signal_while_the_embedded_server_starts_ends_the_run_within_2_s(
    tmp_path: Path, children: list[subprocess.Popen[str]], signum: int, code: int, word: str
) -> None:
    path = spec(tmp_path, "teardown-hang", TEARDOWN_HANG)
    env = {k: v for k, v in os.environ.items() if k != "PGRACE_DSN"}
    child = subprocess.Popen(
        [sys.executable, "-m", "pgrace", "run", str(path), "--step-timeout", "600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "PYTHONUNBUFFERED": "1"},
    )
    children.append(child)
    wait_until("the embedded server's run directory", lambda: any(RUN_ROOT.glob(f"pgrace-{child.pid}-*")), child)
    [run_dir] = RUN_ROOT.glob(f"pgrace-{child.pid}-*")
    _, err = end_within(child, signum, 2.0)
    assert child.returncode == code, err
    assert err.startswith(f"pgrace: {word}") and len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    assert not run_dir.exists()
    postmasters = [p for p in Path("/proc").glob("[0-9]*") if _is_postmaster_of(p, run_dir)]
    assert all(wait_gone(int(p.name)) for p in postmasters)


def _is_postmaster_of(proc: Path, run_dir: Path) -> bool:
    try:
        return str(run_dir) in (proc / "cmdline").read_text() and alive(int(proc.name))
    except OSError:
        return False


def test_ctrl_c_while_pgrace_imports_its_modules_is_one_line_and_exit_130(
    pgrace_server: ServerInfo, children: list[subprocess.Popen[str]]
) -> None:
    """-X importtime reports each import as it completes: the signal lands in the middle of them."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "pgrace",
            "run",
            "lost-update",
            "--step",
            "--dsn",
            pgrace_server.dsn,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    children.append(child)
    assert child.stderr is not None
    for line in child.stderr:
        if line.startswith("import time:") and "click" in line:  # imported by the commands, not the entry
            break
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=30)
    said = [line for line in err.splitlines() if not line.startswith("import time:")]
    assert child.returncode == 130, err
    assert said in (["pgrace: interrupted"], ["pgrace: interrupted; cleaned up"]), said
