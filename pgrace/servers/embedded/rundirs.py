"""Per-run directories in tmpfs, and the sweep that removes the ones killed runs left behind."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import tempfile
import threading
import time

from pgrace.errors import ServerUnavailable
from pgrace.servers.embedded.binaries import _server_user
from pgrace.servers.processes import held, owned_private_dir, pid_alive

_RUN_PREFIX = "pgrace-"
_RUN_DIR_RE = re.compile(r"^pgrace-(\d+)-")


# Run directories created by this process, so the stale-run sweep never takes one of
# ours for the leftover of a dead process that happened to have our pid.
_our_run_dirs: set[str] = set()
_run_dirs_lock = threading.Lock()


def _run_base() -> str:
    """tmpfs when available: the data is thrown away, so it never needs to touch a disk."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _remove_stale_runs(base: str) -> None:
    """Remove run directories (and servers) left by pgrace processes that were killed.

    ``base`` (``/dev/shm``) is writable by every user, so a name is no proof: only a real
    directory (no symlink followed) that this user's pgrace could have made, owned by us or
    by the server user and closed to everyone else, is swept. Directories of live processes,
    and those their owner holds locked (`hold_run_dir`), are left alone. Called with ``_run_dirs_lock`` held.
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
        if (pid != me and pid_alive(pid)) or held(entry.path):  # a pid is proof only in its own PID namespace
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


def hold_run_dir(rundir: str) -> int:
    """Lock ``rundir`` as in use; the lock goes with the returned descriptor, or with this process.

    A sweep from another PID namespace (a container, ``unshare -p``) finds no process of the pid
    in the name and would take a live server's directory: the lock is the owner's own answer.
    """
    fd = os.open(rundir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd
