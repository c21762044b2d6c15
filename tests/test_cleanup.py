"""Ctrl-C, SIGTERM and SIGKILL in the middle of a run leave no server and no scratch data.

Each test starts `pgrace run lost-update --fix --step` in a child process and answers
its prompts until bob's read is seen waiting on alice's row lock; at the next prompt
the server is up, three sessions are connected and a lock is held. Then the signal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from procs import start_blocked_run, wait_gone

from pgrace.servers import ServerInfo

pytestmark = pytest.mark.server

RUN_ROOT = Path("/dev/shm") if Path("/dev/shm").is_dir() else None


def run_dirs(pid: int) -> list[Path]:
    return sorted(RUN_ROOT.glob(f"pgrace-{pid}-*")) if RUN_ROOT else []


def postmaster_of(run_dir: Path) -> int:
    pidfile = next(run_dir.rglob("postmaster.pid"))
    return int(pidfile.read_text().split("\n", 1)[0])


@pytest.fixture
def embedded_only() -> Iterator[None]:
    if RUN_ROOT is None:
        pytest.skip("no /dev/shm on this machine")
    saved = os.environ.pop("PGRACE_DSN", None)
    yield
    if saved is not None:
        os.environ["PGRACE_DSN"] = saved


@pytest.mark.usefixtures("embedded_only")
@pytest.mark.parametrize(
    ("signum", "code", "word"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_interrupt_mid_wait_stops_the_embedded_server(signum: int, code: int, word: str) -> None:
    child, _ = start_blocked_run([])
    [run_dir] = run_dirs(child.pid)
    postmaster = postmaster_of(run_dir)
    child.send_signal(signum)
    _, stderr = child.communicate(timeout=30)
    assert child.returncode == code
    assert stderr == f"pgrace: {word}; cleaned up\n"
    assert wait_gone(postmaster), "the embedded postmaster outlived pgrace"
    assert not run_dir.exists()


@pytest.mark.usefixtures("embedded_only")
def test_sigkill_takes_the_server_down_and_the_next_run_sweeps_the_rest() -> None:
    child, _ = start_blocked_run([])
    [run_dir] = run_dirs(child.pid)
    postmaster = postmaster_of(run_dir)
    child.kill()
    child.communicate(timeout=30)
    assert wait_gone(postmaster), "the death signal did not stop the postmaster"
    subprocess.run([sys.executable, "-m", "pgrace", "run", "nowait"], check=True, capture_output=True)
    assert not run_dir.exists(), "the next run did not remove the dead run's directory"


def test_interrupt_on_a_dsn_server_drops_the_scratch_database(pgrace_server: ServerInfo) -> None:
    child, _ = start_blocked_run(["--dsn", pgrace_server.dsn])
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        before = admin.execute("SELECT datname FROM pg_database WHERE datname LIKE 'pgrace%'").fetchall()
        assert before, "the run's scratch database should exist while it runs"
        child.send_signal(signal.SIGINT)
        child.communicate(timeout=30)
        assert child.returncode == 130
        after = admin.execute("SELECT datname FROM pg_database WHERE datname LIKE 'pgrace%'").fetchall()
        backends = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgrace/lost-update/%'"
        ).fetchone()
    assert after == []
    assert backends == (0,)
