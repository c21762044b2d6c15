"""The sweep of dead runs' directories cannot be aimed by another user.

``/dev/shm`` is writable by everyone: anybody can create ``pgrace-<dead pid>-x`` there. The
sweep takes only real directories this user's pgrace could have made (owned by us or by
the server user, mode 0700), follows no link, and signals a process only when it proves
to be the postmaster of that very directory: run by that user, working in it, started as
``postgres -D <dir>/data``. A victim here is a plain ``sleep`` whose working directory
holds a ``postmaster.pid`` naming it, which is all the old sweep checked.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import alive

from pgrace.servers import ServerInfo
from pgrace.servers.embedded.rundirs import _is_server_of, _remove_stale_runs, _run_base, _run_dir_owners

DEAD_PID = 3999999  # above any pid this machine hands out (pid_max 4194304 is never reached here)


@pytest.fixture
def victim(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A process that is not pgrace's, in a directory holding a postmaster.pid that names it."""
    home = tmp_path / "victim"
    home.mkdir()
    proc = subprocess.Popen(["sleep", "60"], cwd=home)
    (home / "postmaster.pid").write_text(f"{proc.pid}\n{home}\n")
    yield proc, home
    proc.kill()
    proc.wait()


def planted(base: Path, name: str = f"pgrace-{DEAD_PID}-evil") -> Path:
    run = base / name
    run.mkdir(mode=0o700)
    return run


def another_user() -> pwd.struct_passwd:
    if os.geteuid() != 0:
        pytest.skip("planting another user's directory needs root (chown)")
    return pwd.getpwnam("nobody")


def test_another_users_directory_linking_to_a_process_is_left_alone(
    tmp_path: Path, victim: tuple[subprocess.Popen[bytes], Path]
) -> None:
    proc, home = victim
    run = planted(tmp_path)
    (run / "data").symlink_to(home)
    nobody = another_user()
    os.lchown(run / "data", nobody.pw_uid, nobody.pw_gid)
    os.chown(run, nobody.pw_uid, nobody.pw_gid)
    _remove_stale_runs(str(tmp_path))
    assert alive(proc.pid)
    assert run.exists(), "another user's directory was removed"


def test_our_own_directory_with_data_as_a_link_signals_nothing(
    tmp_path: Path, victim: tuple[subprocess.Popen[bytes], Path]
) -> None:
    proc, home = victim
    run = planted(tmp_path)
    (run / "data").symlink_to(home)
    _remove_stale_runs(str(tmp_path))
    assert alive(proc.pid)
    assert (home / "postmaster.pid").exists(), "the sweep reached through the link"
    assert not run.exists(), "our own dead run's directory is still swept"


def test_a_process_in_our_directory_that_is_not_its_server_is_not_signalled(tmp_path: Path) -> None:
    run = planted(tmp_path)
    data = run / "data"
    data.mkdir(mode=0o700)
    proc = subprocess.Popen(["sleep", "60"], cwd=data)
    try:
        (data / "postmaster.pid").write_text(f"{proc.pid}\n{data}\n")
        _remove_stale_runs(str(tmp_path))
        assert alive(proc.pid), "a process that merely worked in the directory was signalled"
    finally:
        proc.kill()
        proc.wait()


def test_a_directory_open_to_others_is_not_ours(tmp_path: Path) -> None:
    run = planted(tmp_path)
    run.chmod(0o777)
    _remove_stale_runs(str(tmp_path))
    assert run.exists()


def test_a_real_postmaster_proves_it_serves_its_directory(pgrace_server: ServerInfo) -> None:
    """The proof accepts pgrace's own server: the sweep still stops a leftover postmaster."""
    rundir = pgrace_server.dsn.split("host=")[1].split()[0] if "host=" in pgrace_server.dsn else None
    if rundir is None or not rundir.startswith(_run_base()):
        pytest.skip("the suite's server is not pgrace's embedded one")
    data = os.path.join(rundir, "data")
    pid = int(Path(data, "postmaster.pid").read_text().split("\n", 1)[0])
    assert _is_server_of(pid, data, _run_dir_owners())
    assert not _is_server_of(pid, os.path.join(rundir, "elsewhere"), _run_dir_owners())
    assert not _is_server_of(os.getpid(), data, _run_dir_owners())


def test_a_held_run_directory_survives_a_sweep_whatever_pid_its_name_says() -> None:
    """Seen from another PID namespace, a live run's directory is named for a pid with no process there:
    the owner's lock, not the name, says it is in use."""
    from pgrace.servers.embedded.rundirs import hold_run_dir

    run = planted(Path(_run_base()), f"pgrace-{DEAD_PID}-live")
    holding = hold_run_dir(str(run))
    try:
        _remove_stale_runs(_run_base())
        assert run.is_dir()
    finally:
        os.close(holding)
    _remove_stale_runs(_run_base())  # the owner let go: now it is a dead run's
    assert not run.exists()


def test_the_suites_own_server_directory_is_held(pgrace_server: ServerInfo) -> None:
    from pgrace.servers.processes import held

    rundir = pgrace_server.dsn.split("host=")[1].split()[0] if "host=" in pgrace_server.dsn else None
    if rundir is None or not rundir.startswith(_run_base()):
        pytest.skip("the suite's server is not pgrace's embedded one")
    assert held(rundir)
