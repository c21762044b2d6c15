"""Server backends and scratch databases, against real PostgreSQL servers (no mocks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgrace.errors import ServerUnavailable
from pgrace.scratch import scratch_database, scratch_name
from pgrace.servers import ServerInfo, booting_server, open_server, redact_dsn
from pgrace.servers.embedded import embedded_booting, embedded_server
from pgrace.servers.existing import existing_server

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerInfo]:
    """One embedded server for the whole module: starting one costs ~50 ms."""
    with embedded_server() as info:
        yield info


def _rundir(info: ServerInfo) -> str:
    host = conninfo_to_dict(info.dsn)["host"]
    assert isinstance(host, str)
    return host


def _postmaster_pid(rundir: str) -> int:
    with open(os.path.join(rundir, "data", "postmaster.pid")) as f:
        return int(f.readline())


def _alive(pid: int) -> bool:
    """Running and not a zombie (an orphaned postmaster may stay unreaped here)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                found.append(int(entry))
    return found


def _wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.01)
    return left


# --- embedded server --------------------------------------------------------------------


@pytest.mark.server
def test_embedded_server_starts_and_cleans_up() -> None:
    with embedded_server() as info:
        with psycopg.connect(info.dsn) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert info.version.startswith("18")
        assert info.label == f"embedded PostgreSQL {info.version}"
        rundir = _rundir(info)
        pid = _postmaster_pid(rundir)
        assert _alive(pid)
    assert not _alive(pid)
    assert not os.path.exists(rundir)


_CHILD = textwrap.dedent(
    """
    import os, sys, time
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    from pgrace.servers.embedded import embedded_server
    with embedded_server() as info:
        rundir = conninfo_to_dict(info.dsn)["host"]
        with open(os.path.join(rundir, "data", "postmaster.pid")) as f:
            print(f.readline().strip(), rundir, flush=True)
        time.sleep(60)
    """
)


def _run_child_and_signal(sig: signal.Signals) -> tuple[list[int], str, int]:
    """Start a server in a child Python, send it ``sig``; return server pids, run dir, exit code."""
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=pythonpath)
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    ) as child:
        assert child.stdout is not None
        line = child.stdout.readline().split()
        assert len(line) == 2, "child did not report its server"
        postmaster, rundir = int(line[0]), line[1]
        processes = [postmaster, *_children(postmaster)]
        assert len(processes) > 1  # checkpointer, background writer, ...
        child.send_signal(sig)
        code = child.wait()
    return processes, rundir, code


@pytest.mark.server
def test_embedded_server_dies_with_sigkilled_parent() -> None:
    processes, rundir, code = _run_child_and_signal(signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert _wait_gone(processes) == []
    # The killed run's directory is stale now; the next start sweeps it away.
    assert os.path.isdir(rundir)
    with embedded_server():
        assert not os.path.exists(rundir)


@pytest.mark.server
def test_embedded_server_is_stopped_on_keyboard_interrupt() -> None:
    processes, rundir, code = _run_child_and_signal(signal.SIGINT)
    assert code == -signal.SIGINT  # KeyboardInterrupt went on up after the cleanup
    assert [p for p in processes if _alive(p)] == []  # stopped before the child exited
    assert not os.path.exists(rundir)


def _processes_of(rundir: str) -> list[int]:
    """Live processes working in ``rundir`` or its data directory (the copying ``cp``, postgres)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            if cwd.startswith(rundir) and _alive(int(entry)):
                found.append(int(entry))
    return found


def _run_dirs() -> set[str]:
    return {str(p) for p in Path("/dev/shm").glob(f"pgrace-{os.getpid()}-*")}


@pytest.mark.server
def test_a_booting_server_is_waited_for_only_when_asked() -> None:
    """The copy and the postmaster's start happen in other processes; ready() waits for them."""
    before = _run_dirs()
    with embedded_booting() as ready:
        (rundir,) = _run_dirs() - before
        assert _processes_of(rundir), "nothing is starting the server"
        info = ready()
        assert ready() is info  # waited for once
        with psycopg.connect(info.dsn) as conn:
            assert conn.execute("SELECT current_setting('data_directory')").fetchone() == (f"{rundir}/data",)
    assert not os.path.exists(rundir)
    assert _wait_gone(_processes_of(rundir), timeout=0) == []


@pytest.mark.server
def test_a_start_connects_once_when_postmaster_pid_says_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """No knocking while the template is copied or the postmaster starts: every refused try costs the server a backend."""
    tries: list[str] = []
    real_connect = psycopg.connect

    def counted(conninfo: str = "", **kwargs: object) -> psycopg.Connection[object]:
        tries.append(conninfo)
        return real_connect(conninfo, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(psycopg, "connect", counted)
    with embedded_server():
        pass
    assert len(tries) == 1


@pytest.mark.server
def test_a_server_left_while_still_booting_leaves_nothing_behind() -> None:
    """Leaving before ready() (a bad scenario file, Ctrl-C) stops the copy or the postmaster, whichever runs."""
    for _ in range(5):
        before = _run_dirs()
        with embedded_booting():
            (rundir,) = _run_dirs() - before
            starting = _processes_of(rundir)
        assert _wait_gone(starting, timeout=0) == []
        assert not os.path.exists(rundir)


_BOOTING_CHILD = textwrap.dedent(
    """
    import glob, os, signal, sys, time
    from pgrace.servers.embedded import embedded_booting
    if sys.argv[1:] == ["background"]:  # as `pgrace ... &` in a script: sh starts it with SIGQUIT ignored
        signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    with embedded_booting():
        print(*glob.glob(f"/dev/shm/pgrace-{os.getpid()}-*"), flush=True)
        time.sleep(60)
    """
)


@pytest.mark.server
@pytest.mark.parametrize("started", ["foreground", "background"])
def test_a_server_whose_pgrace_is_killed_while_booting_goes_too(started: str) -> None:
    """SIGKILL right after the start: the copying shell gets the parent-death signal and ends its cp.

    Also when pgrace itself was started with SIGQUIT ignored, as a shell script's background job is.
    """
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    for _ in range(3):
        with subprocess.Popen(
            [sys.executable, "-c", _BOOTING_CHILD, started],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=pythonpath),
        ) as child:
            assert child.stdout is not None
            rundir = child.stdout.readline().strip()
            assert rundir
            child.kill()
        assert _wait_gone(_processes_of(rundir)) == []


def test_booting_server_reports_a_failed_start_when_the_server_is_wanted(tmp_path: Path) -> None:
    """The caller's own errors come first: entering never fails, ready() raises the server's."""
    # A directory that is no PostgreSQL installation, then a server that is not there.
    with booting_server(str(tmp_path)) as ready, pytest.raises(ServerUnavailable, match="no PostgreSQL installation"):
        ready()
    with booting_server("host=/nonexistent-socket-dir dbname=postgres") as ready, pytest.raises(ServerUnavailable):
        ready()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the server as another user")
def test_the_template_is_roots_and_only_the_run_copy_is_the_server_users(server: ServerInfo) -> None:
    """The server user copies the template (``cp`` in the child) but cannot write it: nothing a server does changes it."""
    cache = Path(os.environ.get("PGRACE_CACHE_DIR", "/var/cache/pgrace"))
    with psycopg.connect(server.dsn) as conn:
        row = conn.execute("SELECT current_setting('data_directory')").fetchone()
    assert row is not None
    server_uid = os.stat(row[0]).st_uid
    assert server_uid != 0
    templates = [t for t in cache.glob("template-*/data") if not t.parent.name.startswith("template-local-")]
    assert templates
    entries = [path for t in templates for path in (t, *t.rglob("*"))]
    assert {os.lstat(p).st_uid for p in entries} == {0}
    assert not [p for p in entries if os.lstat(p).st_mode & 0o022]


def test_pgrowlocks_works_on_embedded_server(server: ServerInfo) -> None:
    with scratch_database(server, "pgrowlocks") as db, psycopg.connect(db.dsn, autocommit=True) as conn:
        assert db.has_pgrowlocks
        conn.execute("CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)")
        with psycopg.connect(db.dsn) as locker:
            locker.execute("SELECT * FROM t FOR UPDATE")
            rows = conn.execute("SELECT modes FROM pgrowlocks('t')").fetchall()
        assert rows == [(["For Update"],)]


@pytest.mark.server
@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the server as another user")
def test_unreachable_cache_dir_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    monkeypatch.setenv("PGRACE_CACHE_DIR", str(private / "cache"))
    with pytest.raises(ServerUnavailable, match="cannot enter"), embedded_server():
        pass


# --- scratch databases ----------------------------------------------------------------


def _databases(server: ServerInfo) -> set[str]:
    with psycopg.connect(server.dsn) as conn:
        return {row[0] for row in conn.execute("SELECT datname FROM pg_database")}


def test_scratch_database_is_created_and_dropped(server: ServerInfo) -> None:
    before = _databases(server)
    with scratch_database(server, "Lost update!") as db:
        assert db.name.startswith("pgrace_lost_update_")
        assert db.name in _databases(server)
        assert db.name not in before
        assert db.has_pgrowlocks
        # A session still open at the end must not prevent the drop.
        session = psycopg.connect(db.dsn)
        assert session.execute("SELECT current_database()").fetchone() == (db.name,)
    session.close()
    assert _databases(server) == before


def test_scratch_database_is_dropped_on_error(server: ServerInfo) -> None:
    before = _databases(server)
    with pytest.raises(RuntimeError), scratch_database(server, "boom"):
        raise RuntimeError("the run failed")
    assert _databases(server) == before


def test_scratch_database_is_dropped_with_a_prepared_transaction(server: ServerInfo) -> None:
    before = _databases(server)
    with scratch_database(server, "two phase") as db, psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int)")
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("PREPARE TRANSACTION 'pgrace-test'")
    assert _databases(server) == before


@pytest.fixture
def role(server: ServerInfo) -> Iterator[str]:
    """A fresh non-superuser login role on the shared server."""
    name = "pgrace_test_role"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {name}")
        conn.execute(f"CREATE ROLE {name} LOGIN")
        yield name
        conn.execute(f"DROP ROLE {name}")


def test_scratch_database_without_createdb_is_reported(server: ServerInfo, role: str) -> None:
    limited = ServerInfo(dsn=make_conninfo(server.dsn, user=role), version=server.version, label="limited")
    with pytest.raises(ServerUnavailable, match="may not create databases") as raised, scratch_database(limited, "x"):
        pass
    assert "--allow-scratch-schema" not in str(raised.value)  # only a scenario run can take that way out


@pytest.mark.parametrize(
    ("command", "offers_schema_mode"),
    [(["run", "lost-update"], True), (["explore", "lost-update", "--max", "1"], False), (["matrix"], False)],
)
def test_without_createdb_only_run_is_told_of_allow_scratch_schema(
    server: ServerInfo, role: str, command: list[str], offers_schema_mode: bool
) -> None:
    from click.testing import CliRunner

    from pgrace.cli import main

    result = CliRunner().invoke(main, [*command, "--dsn", make_conninfo(server.dsn, user=role)])
    assert result.exit_code == 3, result.output
    assert "may not create databases" in result.stderr
    assert ("--allow-scratch-schema" in result.stderr) is offers_schema_mode, result.stderr


def test_scratch_database_without_superuser_lacks_pgrowlocks(server: ServerInfo, role: str) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"ALTER ROLE {role} CREATEDB")
    limited = ServerInfo(dsn=make_conninfo(server.dsn, user=role), version=server.version, label="limited")
    before = _databases(server)
    with scratch_database(limited, "no superuser") as db:
        assert not db.has_pgrowlocks  # pgrowlocks is not a trusted extension
        with psycopg.connect(db.dsn) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (role,)
    assert _databases(server) == before


def test_scratch_name_is_a_short_safe_identifier() -> None:
    name = scratch_name("Ünïcode & spaces / " * 10)
    assert len(name.encode()) <= 63
    assert name.replace("_", "").isalnum() and name.isascii() and name == name.lower()
    assert scratch_name("") != scratch_name("")


# --- existing servers and server selection -----------------------------------------------


def test_existing_server_reachable(server: ServerInfo) -> None:
    with existing_server(server.dsn) as info:
        assert info.version == server.version
        assert info.label.startswith("postgresql://postgres@")
        assert info.label.endswith(":5432/postgres")


@pytest.mark.parametrize(
    "dsn",
    ["postgresql://u:secret@127.0.0.1:1/x", "host=127.0.0.1 port=1 user=u password=secret dbname=x"],
)
def test_existing_server_unreachable(dsn: str) -> None:
    with pytest.raises(ServerUnavailable) as excinfo, existing_server(dsn):
        pass
    message = str(excinfo.value)
    assert "127.0.0.1" in message
    assert "secret" not in message
    assert "\n" not in message


def test_open_server_prefers_explicit_dsn_then_env(server: ServerInfo, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGRACE_DSN", "postgresql://u:secret@127.0.0.1:1/x")
    with pytest.raises(ServerUnavailable), open_server():
        pass
    with open_server(server.dsn) as info:
        assert info.label.startswith("postgresql://")


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgresql://u:secret@db.example:5432/app", "postgresql://u@db.example:5432/app"),
        ("postgres://u@h/db", "postgres://u@h/db"),
        ("postgresql://u:s%40cret@h/db?sslmode=require&password=x", "postgresql://u@h/db?sslmode=require"),
        ("postgresql://h/db?password=secret", "postgresql://h/db"),
        ("host=h user=u password=secret dbname=d", "host=h user=u dbname=d"),
        ("host=h password='sec ret' port=5", "host=h port=5"),
        ("password = secret host=h", "host=h"),
        ("host=h sslpassword=secret", "host=h"),
        ("host=h dbname=d", "host=h dbname=d"),
    ],
)
def test_redact_dsn(dsn: str, expected: str) -> None:
    assert redact_dsn(dsn) == expected


def test_where_servers_are_forbidden_none_starts_and_the_command_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """``make test-fast`` sets PGRACE_NO_SERVER: a test that would start a PostgreSQL fails at once, loudly."""
    from click.testing import CliRunner

    from pgrace.cli import main
    from pgrace.servers import NO_SERVER_ENV_VAR

    monkeypatch.setenv(NO_SERVER_ENV_VAR, "1")
    forbidden = "PGRACE_NO_SERVER is set: this process may not start embedded PostgreSQL"
    with pytest.raises(RuntimeError, match=forbidden), open_server("embedded"):
        pass
    with pytest.raises(RuntimeError, match="PGRACE_NO_SERVER"), booting_server("embedded"):
        pass
    result = CliRunner().invoke(main, ["run", "lost-update"], env={"PGRACE_DSN": ""})
    assert result.exit_code == 4 and "PGRACE_NO_SERVER" in result.stderr, result.output
