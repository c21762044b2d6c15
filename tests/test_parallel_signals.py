"""`explore -j N` under Ctrl-C, SIGTERM and a server that goes away: quick, one line, nothing left.

Each test runs `python -m pgrace explore ... -j N` in a session of its own (as a terminal
would run it: Ctrl-C reaches its whole process group, SIGTERM only pgrace), signals it at a
moment it observes, and then looks for what it left: a process of that session, a backend
or a scratch database on the server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import psycopg
import pytest
from procs import alive

from pgrace.servers import ServerInfo, open_server

pytestmark = pytest.mark.server

# 3,000 interleavings of 4 workers × 3 steps: ~20 s of work at -j 3, unless stopped.
LONG_EXPLORE = ["explore", "skip-locked-fanout", "-p", "workers=4", "--max", "3000"]
EXIT_WITHIN_S = 2.0


def session_processes(sid: int) -> list[str]:
    """The live processes of a session (the child started it: it and all its workers)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and alive(int(stat.parent.name)):  # fields[3]: the session id
            found.append(f"{stat.parent.name} {cmdline.strip()}")
    return found


def workers_of(pid: int) -> list[str]:
    return [p for p in session_processes(pid) if "spawn_main" in p]


def backends(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE 'pgrace/%'"
        ).fetchall()
    return [name for (name,) in rows]


def scratch_databases(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'pgrace\\_%'").fetchall()
    return [name for (name,) in rows]


def scratch_objects(dsn: str) -> list[str]:
    """A run's scratch databases, and the roles made for them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE 'pgrace\\_%'").fetchall()
    return scratch_databases(dsn) + [name for (name,) in rows]


def start_explore(dsn: str, jobs: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "PGRACE_DSN"}
    return subprocess.Popen(
        [sys.executable, "-m", "pgrace", *LONG_EXPLORE, "-j", str(jobs), "--dsn", dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )


def wait_for(child: subprocess.Popen[str], moment: str, dsn: str, jobs: int) -> None:
    """Poll until the child reached the moment (another process's progress: no lock detection stands in)."""
    deadline = time.monotonic() + 30
    while not MOMENTS[moment](child, dsn, jobs):
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.005)


def wait_until(condition: Callable[[], bool], deadline_s: float = 5.0) -> bool:
    end = time.monotonic() + deadline_s
    while not condition():  # backends end asynchronously after their client is gone
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def no_process_left(sid: int, deadline_s: float = 5.0) -> bool:
    return wait_until(lambda: session_processes(sid) == [], deadline_s)


MOMENTS: dict[str, Callable[[subprocess.Popen[str], str, int], bool]] = {
    # The worker processes exist: Python starts in them, they import pgrace, read their share.
    "workers starting": lambda child, dsn, jobs: len(workers_of(child.pid)) == jobs,
    # The first worker made its scratch database.
    "a scratch database made": lambda child, dsn, jobs: bool(scratch_databases(dsn)),
    # Every worker works in its scratch database.
    "workers exploring": lambda child, dsn, jobs: len(scratch_databases(dsn)) == jobs and len(backends(dsn)) >= jobs,
}


@pytest.mark.timing
@pytest.mark.parametrize("moment", ["workers starting", "workers exploring"])
def test_ctrl_c_and_sigterm_end_explore_jobs_within_2_s_with_nothing_left(
    pgrace_server: ServerInfo, moment: str
) -> None:
    dsn = pgrace_server.dsn
    assert scratch_objects(dsn) == []
    for jobs, signum in ((3, signal.SIGINT), (3, signal.SIGTERM), (6, signal.SIGINT), (3, signal.SIGINT)):
        child = start_explore(dsn, jobs)
        try:
            wait_for(child, moment, dsn, jobs)
            sent = time.monotonic()
            if signum == signal.SIGINT:
                os.killpg(child.pid, signal.SIGINT)  # Ctrl-C at a terminal: pgrace and its workers
            else:
                child.send_signal(signal.SIGTERM)  # pgrace alone
            child.wait(timeout=60)
            took = time.monotonic() - sent
            what = f"-j {jobs}, {signum.name} with the {moment}"
            assert took < EXIT_WITHIN_S, f"{what}: exited after {took:.1f} s"
            assert no_process_left(child.pid), f"{what}: {session_processes(child.pid)}"
        finally:
            with suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)  # whatever outlived it: the test has failed
            _, stderr = child.communicate()
        word = "interrupted" if signum == signal.SIGINT else "terminated"
        assert (child.returncode, stderr) == (128 + signum, f"pgrace: {word}; cleaned up\n"), what
        assert scratch_objects(dsn) == [], what
        assert wait_until(lambda: backends(dsn) == []), f"{what}: {backends(dsn)}"


def test_workers_die_with_pgrace_even_of_sigkill_and_drop_their_databases(pgrace_server: ServerInfo) -> None:
    dsn = pgrace_server.dsn
    child = start_explore(dsn, 3)
    try:
        wait_for(child, "workers exploring", dsn, 3)
        child.kill()  # nothing of pgrace itself can clean up: the workers must see it die
        child.wait(timeout=60)
        gone = no_process_left(child.pid, EXIT_WITHIN_S)
        left = session_processes(child.pid)
    finally:
        with suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # the workers, if they outlived it: the test has failed
        child.communicate()
    assert gone, left
    assert scratch_objects(dsn) == []
    assert wait_until(lambda: backends(dsn) == []), backends(dsn)


@pytest.mark.parametrize("moment", ["workers starting", "a scratch database made", "workers exploring"])
def test_the_server_stopped_under_explore_jobs_is_one_line_exit_3_from_every_process(moment: str) -> None:
    with open_server("embedded") as own:
        with psycopg.connect(own.dsn, autocommit=True) as conn:
            row = conn.execute("SHOW data_directory").fetchone()
        assert row is not None
        postmaster = int((Path(str(row[0])) / "postmaster.pid").read_text().split("\n", 1)[0])
        child = start_explore(own.dsn, 2)
        try:
            wait_for(child, moment, own.dsn, 2)
            os.kill(postmaster, signal.SIGINT)  # pg_ctl stop -m fast: every backend is terminated
            child.wait(timeout=60)
            gone = no_process_left(child.pid)
            left = session_processes(child.pid)
        finally:
            with suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)  # whatever outlived it: the test has failed
            _, stderr = child.communicate()
    assert child.returncode == 3, stderr
    assert stderr.count("\n") == 1 and stderr.startswith("pgrace: "), stderr  # no traceback, from any process
    assert gone, left


def test_what_a_killed_reduced_explore_j_left_in_the_temporary_folder_is_swept(pgrace_server: ServerInfo) -> None:
    """Its workers share a claims file in a directory named for it; SIGKILL leaves that, the next -j takes it."""
    import tempfile

    child = subprocess.Popen(
        [sys.executable, "-m", "pgrace", "explore", "tests/explore/three-withdrawals.toml", "-j", "2",
         "--dsn", pgrace_server.dsn],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    mine = f"pgrace-explore-{child.pid}-"
    try:
        assert wait_until(lambda: any(p.name.startswith(mine) for p in Path(tempfile.gettempdir()).iterdir()))
        os.killpg(child.pid, signal.SIGKILL)
    finally:
        with suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
    left = [p for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith(mine)]
    assert left, "a killed explore -j leaves its claims directory: nothing else could remove it"
    again = subprocess.run(
        [sys.executable, "-m", "pgrace", "explore", "lost-update", "-j", "2", "--dsn", pgrace_server.dsn],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert not any(p.exists() for p in left)
