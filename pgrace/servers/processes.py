"""Processes and files of this machine that pgrace may act on: alive or not, ours or not.

Shared by the embedded server (its run directories) and the pgbench driver (its work
directories): both clean up after killed runs in folders every user can write to, so
both must tell what is provably theirs from what merely looks like it.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator

PR_SET_PDEATHSIG = 1


PID_MAX = 4_194_304  # Linux's largest pid_max: a bigger number in a name anyone may write names no process


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a running (not zombie) process."""
    if not 0 < pid <= PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def owned_private_dir(path: str, owners: set[int]) -> bool:
    """A directory itself (not a link to one), owned by one of ``owners``, with no access for group or others."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid in owners and not st.st_mode & 0o077


def sweep_dead_dirs(prefix: str) -> list[str]:
    """Remove the temporary directories ``PREFIX<pid>-…`` that killed pgrace processes of this user left.

    The temporary folder is everyone's: only a 0700 directory of this user, named for a
    process that is gone, is taken.
    """
    named = re.compile(rf"^{re.escape(prefix)}(\d+)-")
    removed: list[str] = []
    try:
        entries = list(os.scandir(tempfile.gettempdir()))
    except OSError:
        return removed
    for entry in entries:
        match = named.match(entry.name)
        if match is None or int(match[1]) == os.getpid() or pid_alive(int(match[1])):
            continue
        if owned_private_dir(entry.path, {os.geteuid()}) and not held(entry.path):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


@contextlib.contextmanager
def held_temporary_dir(prefix: str) -> Iterator[str]:
    """A temporary directory ``PREFIX<pid>-…``, locked while in use so that no sweep takes it.

    A pid names a process only in its own PID namespace: a sweep from another one (a container,
    ``unshare -p``) finds no such process and would take a live run's directory for a dead one's.
    The lock is the owner's own answer, the same in every namespace, and goes with the process.
    """
    with tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}-") as path:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield path
        finally:
            os.close(fd)


def held(path: str) -> bool:
    """Whether a live process holds ``path`` (a directory of `held_temporary_dir`)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@functools.cache
def libc_prctl() -> Callable[..., int] | None:
    """libc's prctl, resolved in the parent: loading libraries after fork is not safe."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        func: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return func


def dies_with_parent(sig: signal.Signals = signal.SIGKILL, *, group: bool = False) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets ``sig`` when this process dies, even by SIGKILL (Linux).

    The signal reaches the child alone. With ``group`` (a child started with ``start_new_session``), every process of
    its group dies too, by `the guard <_guard>`: what a shell forks for a command's line, what an npm script starts.
    The parent says `release_group` once it has stopped the group itself."""
    prctl = libc_prctl()
    parent = os.getpid()
    guard = _guard() if group else None

    def setup() -> None:
        if guard is not None:  # before exec, so no process of the group ever runs unguarded
            default = signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a guard killed by someone: start all the same
            with contextlib.suppress(OSError):
                os.write(guard, b"+%d\n" % os.getpid())
            signal.signal(signal.SIGPIPE, default)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
            if os.getppid() != parent:  # the parent died before the signal was armed
                os._exit(1)

    return setup


def release_group(pgid: int) -> None:
    """Tell the guard that the group ``pgid`` is gone: its number may name someone else's group later."""
    guard = _guard_process
    if guard is not None and guard.stdin is not None:
        with contextlib.suppress(OSError):
            os.write(guard.stdin.fileno(), b"-%d\n" % pgid)


#: The guard: a small process that reads group ids from a pipe only this process writes to. The pipe ends when this
#: process does, however it ends (SIGKILL, too), and the guard then kills every group it was told of and not released.
_GUARD_SOURCE = """
import os, signal, sys
groups = set()
for line in sys.stdin.buffer:
    (groups.add if line[:1] == b"+" else groups.discard)(int(line[1:]))
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""
_guard_lock = threading.Lock()
_guard_process: subprocess.Popen[bytes] | None = None


def _guard() -> int:
    """The write end of the guard's pipe, the guard started on first use (in its own session: Ctrl-C is not for it)."""
    global _guard_process
    with _guard_lock:
        if _guard_process is None or _guard_process.poll() is not None:
            _guard_process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _GUARD_SOURCE],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        assert _guard_process.stdin is not None
        return _guard_process.stdin.fileno()


#: Set by the test suite's fast tier (``make test-fast``): this process and its children may not
#: start a PostgreSQL, so a test that needs one but is not marked ``server`` fails instead.
NO_SERVER_ENV_VAR = "PGRACE_NO_SERVER"


def refuse_if_forbidden(what: str) -> None:
    """Raise before starting ``what`` when `NO_SERVER_ENV_VAR` forbids starting servers."""
    if os.environ.get(NO_SERVER_ENV_VAR):
        raise RuntimeError(f"{NO_SERVER_ENV_VAR} is set: this process may not start {what}")
