"""The postgres process: spawned on a copy of the template, waited for, stopped, its orphans ended."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping

from pgrace.errors import ServerUnavailable
from pgrace.servers.embedded.binaries import _User
from pgrace.servers.info import LOG_LINE_PREFIX, server_version
from pgrace.servers.processes import PR_SET_PDEATHSIG, libc_prctl, pid_alive

_PORT = 5432
_READY_DEADLINE_S = 15.0
_READY_POLL_S = 0.003
_STARTING_POLL_S = 0.001  # reading postmaster.pid costs microseconds: look often
_PID_STATUS_LINE = 7  # postmaster.pid's 8th line: "starting", "ready", "stopping", ...
_STOP_TIMEOUT_S = 10.0
_ORPHAN_GRACE_S = 2.0  # for a dead postmaster's children to notice and exit


_SERVER_SETTINGS = {
    "listen_addresses": "",
    "port": str(_PORT),
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "100",
    "shared_buffers": "16MB",
    # No background vacuum or analyze changing what a scenario sees between steps.
    "autovacuum": "off",
    # PG 18's default io_method=worker starts 3 more processes: 5 ms of every start.
    "io_method": "sync",
    "huge_pages": "off",
    # Dynamic shared memory as files in the data directory instead of /dev/shm/PostgreSQL.*:
    # removed with the run directory, even after a postmaster was SIGKILLed.
    "dynamic_shared_memory_type": "mmap",
    # Lets scenarios use two-phase commit (PREPARE TRANSACTION); costs a few kB.
    "max_prepared_transactions": "10",
    # The WAL lives in tmpfs (RAM): keep it small, checkpoints are cheap without fsync.
    "max_wal_size": "64MB",
    # Each line names its database: a load reads back the lock waits of its own scratch database.
    "log_line_prefix": LOG_LINE_PREFIX,
}


def _spawn(
    bindir: str, template: str, rundir: str, user: _User | None, extra: Mapping[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start postgres on a fresh copy of the template in ``rundir``; return it and its log path.

    The copy (about 1,000 files) is made by ``cp`` in the child, which then becomes postgres:
    it runs beside pgrace, which meanwhile reads the scenario and imports the driver,
    instead of holding it up. The child runs as the server user, who can read the template
    but (as root) not write it; the copy is the server user's, its top directory private
    as postgres requires.
    """
    if user is not None:
        os.chown(rundir, user.uid, user.gid)
    data = os.path.join(rundir, "data")
    log_path = os.path.join(rundir, "postgres.log")
    argv = [os.path.join(bindir, "bin", "postgres"), "-D", data, "-k", rundir]
    settings = dict(_SERVER_SETTINGS)
    if _major_version(template) < 18:
        del settings["io_method"]  # new in PostgreSQL 18
    settings.update(extra or {})
    for name, value in settings.items():
        argv += ["-c", f"{name}={value}"]
    # The shell becomes postgres once the copy is done. Stopped before that (by `_stop`, or
    # the parent-death signal), it ends its cp and waits for it: nothing is left copying.
    copy_then_start = (
        "trap 'kill $copy 2>/dev/null; wait $copy; exit 1' QUIT TERM; "
        'cp -RPp -- "$1" "$2" & copy=$!; wait $copy || exit; chmod 0700 "$2" || exit; shift 2; exec "$@"'
    )
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", copy_then_start, "pgrace-start", template, data, *argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_child_env(),
            cwd=rundir,
            # The parent-death signal can only be armed from inside the child; exec keeps it.
            preexec_fn=_child_setup(user, death_signal=True),
        )
    return proc, log_path


def _major_version(data: str) -> int:
    """The major version a data directory was made by, from its PG_VERSION file."""
    try:
        with open(os.path.join(data, "PG_VERSION")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 0


def _child_env() -> dict[str, str]:
    """The caller's environment minus PG* variables, which could redirect initdb/postgres."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


def _child_setup(user: _User | None, *, death_signal: bool) -> Callable[[], None]:
    """Build the preexec_fn: own process group, default stop signals, drop root, then the parent-death signal.

    The death signal must be set after the uid switch, because a credential change
    clears it.  Own process group: a Ctrl-C at the terminal must not reach postgres
    before we stop it ourselves.  Default stop signals: a shell script's background job
    starts with SIGQUIT ignored, and the copying shell cannot trap a signal ignored on
    entry, so both our stop and the death signal would be lost until postgres took over.
    """
    prctl = libc_prctl() if death_signal else None
    parent = os.getpid()

    def setup() -> None:
        os.setpgrp()
        for stop in (signal.SIGQUIT, signal.SIGTERM, signal.SIGINT):
            signal.signal(stop, signal.SIG_DFL)
        if user is not None:
            os.setgid(user.gid)
            os.setgroups([])
            os.setuid(user.uid)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(signal.SIGQUIT), 0, 0, 0)
            if os.getppid() != parent:  # the parent died before the signal was armed
                os._exit(1)

    return setup


class BrokenStart(ServerUnavailable):
    """The server came up but answers every connection with an error (not 57P03, "starting up")."""


_NOT_YET = ("starting up", "not yet accepting", "recovery", "shutting down")


def _starting(data: str) -> bool:
    """The server in ``data`` has no postmaster.pid yet (the template is still being copied), or it says "starting".

    The status is the file's 8th line, written by PostgreSQL 10 and later as ``pg_ctl`` reads
    it; until it is there the server is starting too. Before 10 the file says nothing, and
    connecting tells.
    """
    try:
        with open(os.path.join(data, "postmaster.pid"), "rb") as f:
            lines = f.read().split(b"\n")
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if len(lines) <= _PID_STATUS_LINE or not lines[_PID_STATUS_LINE].strip():
        return _major_version(data) >= 10
    return lines[_PID_STATUS_LINE].strip() == b"starting"


def _refuses(exc: Exception) -> bool:
    """The server is up and refuses us for good: its FATAL is not one of "wait, I am starting".

    A connection's own failure carries no SQLSTATE in psycopg (libpq reports it as text), so
    there only the server's words can tell.
    """
    state = getattr(exc, "sqlstate", None)
    if state is not None:
        return bool(state != "57P03")
    text = str(exc)
    return "FATAL:" in text and not any(words in text for words in _NOT_YET)


def _wait_ready(proc: subprocess.Popen[bytes], dsn: str, rundir: str, log_path: str) -> str:
    """Poll until the server accepts a connection; return its version.

    While postmaster.pid says the server is still starting, no connection is tried: each
    would cost a refused backend (and pgrace the error) in the middle of the start.
    """
    import psycopg

    deadline = time.monotonic() + _READY_DEADLINE_S
    last_error = "no attempt made"
    data = os.path.join(rundir, "data")
    while True:
        code = proc.poll()
        if code is not None:
            raise ServerUnavailable(
                f"embedded PostgreSQL exited during startup (exit {code}); log tail: {_tail(_read_log(log_path))}"
            )
        if _starting(data) and time.monotonic() < deadline:
            time.sleep(_STARTING_POLL_S)
            continue
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                return server_version(conn)
        except psycopg.OperationalError as exc:
            last_error = " ".join(str(exc).split())
            if _refuses(exc):
                raise BrokenStart(f"embedded PostgreSQL refuses connections: {last_error}") from None
        if time.monotonic() >= deadline:
            raise ServerUnavailable(
                f"embedded PostgreSQL did not accept connections on unix socket {rundir} "
                f"port {_PORT} within {_READY_DEADLINE_S:.0f} s (last error: {last_error}); "
                f"log tail: {_tail(_read_log(log_path))}"
            )
        time.sleep(_READY_POLL_S)


def _stop(proc: subprocess.Popen[bytes], data: str) -> None:
    """Immediate shutdown: the data is thrown away, so there is nothing to flush.

    A postmaster that is already dead (killed under us) cannot stop its children: they
    notice and exit by themselves, except one busy computing.  Those are waited for,
    then killed, so that nothing of the run outlives it.  Before postgres the child is the
    shell still copying the template: SIGQUIT makes it end its copy (see `_spawn`).
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGQUIT)
        try:
            proc.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return
    _end_orphans(data)


def _end_orphans(data: str) -> None:
    """End the processes still working in ``data`` (a dead postmaster's children), by cwd."""
    deadline = time.monotonic() + _ORPHAN_GRACE_S
    while orphans := _processes_in(data):
        if time.monotonic() >= deadline:
            for pid in orphans:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + _ORPHAN_GRACE_S  # SIGKILL is not ignored: they go
        time.sleep(0.005)  # polling for processes to exit


def _processes_in(data: str) -> list[int]:
    """Live processes whose working directory is ``data``: postgres chdirs into its data directory."""
    target = os.path.realpath(data)
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    found = []
    for name in names:
        if not name.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{name}/cwd")
        except OSError:
            continue
        if cwd == target and pid_alive(int(name)):
            found.append(int(name))
    return found


def _read_log(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            return f.read().decode(errors="replace")
    except OSError as exc:
        return f"(log unreadable: {exc})"


def _tail(text: str, lines: int = 8) -> str:
    """Last lines of a log, on one line: errors are reported as a single line."""
    kept = [line.strip() for line in text.strip().splitlines()[-lines:] if line.strip()]
    return " | ".join(kept) if kept else "(empty)"
