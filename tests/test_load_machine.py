"""What ``pgrace load`` leaves on the machine: no secret in ``ps``, no pgbench after a SIGKILL, no stray files.

pgbench's command line is readable by every user of the machine (``ps``, ``/proc/PID/cmdline``):
the password goes through ``PGPASSWORD`` and ``sslpassword``, for which libpq has no
variable, through a service file only pgrace's user can read. pgbench dies with pgrace,
even with a SIGKILLed one, and the work directory a killed load left is removed by the next
load or by ``pgrace clean``. ``--emit`` into a place it cannot write is invalid input, and
a symbolic link planted among the files it writes is not followed.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from procs import alive, wait_gone
from psycopg.conninfo import make_conninfo

from pgrace.cli import main
from pgrace.servers import ServerInfo

SPY = """#!/bin/sh
# Records what pgbench was given, then is pgbench.
printf '%s\\n' "$@" > "{argv}"
env > "{env}"
[ -n "$PGSERVICEFILE" ] && stat -c '%a' "$PGSERVICEFILE" > "{mode}" && cat "$PGSERVICEFILE" > "{service}"
exec "{pgbench}" "$@"
"""


def real_pgbench(server: ServerInfo) -> str:
    assert server.bindir is not None, "the suite's server is pgrace's own"
    return os.path.join(server.bindir, "pgbench")


@pytest.fixture
def role_with_password(pgrace_server: ServerInfo) -> Iterator[str]:
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS loader")
        admin.execute("CREATE ROLE loader LOGIN CREATEDB PASSWORD 'hunter2-load'")
    yield make_conninfo(pgrace_server.dsn, user="loader", password="hunter2-load", sslpassword="open-sesame-ssl")
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS loader")


def test_no_secret_reaches_pgbenchs_command_line(
    pgrace_server: ServerInfo, role_with_password: str, tmp_path: Path
) -> None:
    spy = tmp_path / "pgbench"
    files = {k: tmp_path / k for k in ("argv", "env", "mode", "service")}
    spy.write_text(SPY.format(pgbench=real_pgbench(pgrace_server), **{k: str(v) for k, v in files.items()}))
    spy.chmod(0o755)
    result = CliRunner().invoke(
        main, ["load", "lost-update", "--fix", "-c", "2", "-t", "3", "--dsn", role_with_password, "--pgbench", str(spy)]
    )
    assert result.exit_code == 0, result.output
    argv = files["argv"].read_text()
    assert "hunter2-load" not in argv and "open-sesame-ssl" not in argv, argv
    assert "service=pgrace" in argv
    assert "PGPASSWORD=hunter2-load" in files["env"].read_text()
    assert files["mode"].read_text().strip() == "600"
    assert files["service"].read_text() == "[pgrace]\nsslpassword=open-sesame-ssl\n"


LONG_LOAD = ["load", "lost-update", "-c", "2", "-T", "60"]


def pgbench_children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat_fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                command = Path(f"/proc/{entry}/comm").read_text().strip()
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if int(stat_fields[1]) == pid and command == "pgbench" and b"-f" in argv:
                found.append(int(entry))  # the load itself, not `pgbench --version`
    return found


@pytest.mark.alone  # beside other workers, their loads' sweeps may take the killed load's directory first
def test_pgbench_dies_with_a_sigkilled_pgrace_and_clean_removes_its_work_directory(pgrace_server: ServerInfo) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "pgrace", *LONG_LOAD, "--dsn", pgrace_server.dsn],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not (bench := pgbench_children(child.pid)):
        assert time.monotonic() < deadline, "pgbench never started"
        assert child.poll() is None, "pgrace ended before pgbench started"
        time.sleep(0.02)  # polling for a process to appear
    [work] = Path(tempfile.gettempdir()).glob(f"pgrace-load-{child.pid}-*")
    assert stat.S_IMODE(work.stat().st_mode) == 0o700
    child.kill()
    child.wait()
    assert wait_gone(bench[0]), "pgbench outlived a SIGKILLed pgrace"
    assert work.exists()
    result = CliRunner().invoke(main, ["clean", "--dsn", pgrace_server.dsn])
    assert result.exit_code == 0, result.output
    assert f"removed {work} (a killed pgrace load's work directory)" in result.output
    assert not work.exists()


def test_the_sweep_takes_no_work_directory_of_a_live_process_or_of_another_user(tmp_path: Path) -> None:
    from pgrace.drivers.load import sweep_work_dirs

    base = Path(tempfile.gettempdir())
    live = base / f"pgrace-load-{os.getppid()}-live"
    open_to_all = base / "pgrace-load-3999999-open"
    for folder in (live, open_to_all):
        folder.mkdir(mode=0o700)
    open_to_all.chmod(0o777)
    try:
        assert alive(os.getppid())
        removed = sweep_work_dirs()
        assert str(live) not in removed and str(open_to_all) not in removed
        assert live.exists() and open_to_all.exists()
    finally:
        shutil.rmtree(live)
        shutil.rmtree(open_to_all)


def test_the_sweep_takes_no_work_directory_a_live_load_holds_whatever_pid_its_name_says() -> None:
    """A pid names a process in its own PID namespace only: seen from another (a container, ``unshare -p``),
    a live load's directory is named for a pid that does not exist there. The owner's lock says it is in use."""
    from pgrace.drivers.load import WORK_PREFIX, sweep_work_dirs
    from pgrace.servers.processes import held_temporary_dir

    with held_temporary_dir(WORK_PREFIX) as work:
        as_seen_elsewhere = Path(work).with_name(f"{WORK_PREFIX}3999999-{Path(work).name.rsplit('-', 1)[1]}")
        os.rename(work, as_seen_elsewhere)  # the name as another namespace reads it: a pid with no process
        try:
            assert str(as_seen_elsewhere) not in sweep_work_dirs()
            assert as_seen_elsewhere.is_dir()
        finally:
            os.rename(as_seen_elsewhere, work)


def test_pgrace_clean_from_another_pid_namespace_leaves_a_live_loads_work_directory() -> None:
    from pgrace.drivers.load import WORK_PREFIX
    from pgrace.servers.processes import held_temporary_dir

    with held_temporary_dir(WORK_PREFIX) as work:
        swept = subprocess.run(
            ["unshare", "-p", "-f", "--mount-proc", sys.executable, "-c",
             "from pgrace.drivers.load import sweep_work_dirs; print(sweep_work_dirs())"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert work not in swept.stdout
        assert Path(work).is_dir()


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ("/proc/self/nope", "cannot make the folder: No such file or directory"),
        ("/dev/null", "cannot make the folder: File exists"),
    ],
)
def test_emit_where_nothing_can_be_written_is_one_line_exit_2(where: str, says: str) -> None:
    result = CliRunner().invoke(main, ["load", "lost-update", "--emit", where])
    assert result.exit_code == 2, result.output
    assert result.stderr == f"pgrace: {where}: {says}\n"


def test_emit_into_a_folder_nobody_may_write_is_exit_2() -> None:
    """/sys/kernel refuses new files even to root: a read-only folder the suite can have as any user."""
    result = CliRunner().invoke(main, ["load", "lost-update", "--emit", "/sys/kernel"])
    assert result.exit_code == 2, result.output
    assert result.stderr == "pgrace: /sys/kernel/lost-update.bug.pgbench.sql: cannot write: Permission denied\n"


def test_emit_does_not_write_through_a_link_planted_in_the_folder(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / "lost-update.bug.setup.sql").symlink_to(target)
    result = CliRunner().invoke(main, ["load", "lost-update", "--emit", str(out)])
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"pgrace: {out / 'lost-update.bug.setup.sql'}: cannot write: a symbolic link is there;"
        " pgrace does not write through one\n"
    )
    assert target.read_text() == "keep me"


def test_a_signal_while_pgbench_runs_still_ends_it(pgrace_server: ServerInfo) -> None:
    """Giving pgbench a death signal must not change how SIGINT ends it (pgrace's own stop)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "pgrace", *LONG_LOAD, "--dsn", pgrace_server.dsn],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not (bench := pgbench_children(child.pid)):
        assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.02)  # polling for a process to appear
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=30)
    assert child.returncode == 130, err
    assert wait_gone(bench[0])
    assert not list(Path(tempfile.gettempdir()).glob(f"pgrace-load-{child.pid}-*"))
