"""The ``--exec`` commands: started per run in process groups of their own, read in /proc, killed whole.

When may the scheduler choose the next statement? Only when no command can send anything
more without an answer that pgrace holds. :func:`quiet` is that rule, read from the kernel
(``/proc/PID/task/TID/stat`` and ``syscall``), never guessed from time: every thread of
every process of the command's group is asleep in a system call that waits for input or
for another thread (``read``, ``recv*``, ``accept``, ``poll``, ``select``, ``epoll_wait``,
``futex``, ``wait4``, ``pause``...) with no timeout. A thread that is runnable, in a sleep
(``nanosleep``), writing, or in any other call may still act on its own, so it is not quiet.
A look reads the threads one after another; it holds only if, once every thread is read, the
same threads are there and none has run since the look began (``/proc/PID/task/TID/schedstat``,
the scheduler's count of each thread's time on a CPU): a parent read asleep in the join of a
thread it has just started, not yet listed, is no proof.

A *timed* wait (``poll`` with a timeout, a timed ``futex``) is quiet only while the process waits
for pgrace: one of its connections has a statement that pgrace holds or runs, and every
descriptor the wait watches is a socket connected to the proxy or the process's own wake-up
handle (an ``eventfd``, a ``signalfd``). Drivers and runtimes wait that way: psycopg polls its
socket in 0.1 s slices to see Ctrl-C, Node's event loop keeps a timer for V8's housekeeping
(8 s) beside the sockets. A timed wait on anything else (a ``timerfd``, a pipe, another
socket), or in a process none of whose statements is held, may end in a statement nobody held:
the process is not quiet until it is back in a wait that says so. What the rule cannot see is
an application timer that fires while another of its connections waits for pgrace; the reduced
search then meets a run that does not follow an earlier one and says the exploration is
incomplete.

A timed wait that ends at a deadline the kernel holds (a ``futex`` ``WAIT_BITSET``: its absolute
timeout is read from the process's memory) further away than ``horizon`` is quiet, whatever the
thread and whatever is held: the runner passes twice the step timeout, and looks again before
that (a step and a settle each end within the step timeout, or the run fails), so the thread
cannot wake in between. The JDK's ``Common-Cleaner`` (60 s) and code sweeper (a day) pass so,
by their clocks, not by their names.

A JVM (a process that maps HotSpot's ``libjvm.so``) runs threads of its own beside the
application's, asleep in short timed waits (the ``VM Thread`` every second, the ``VM Periodic
Task Thread`` every 50 ms, monitor deflation, the JIT's compiler threads, the G1 service
thread). For a JVM the rule trusts two things and states them:

* *The names the JVM gives its threads* (``/proc/PID/task/TID/comm``, :data:`HOTSPOT_THREADS`),
  cross-checked by the JVM's own count: the process's threads less those so named, less the
  launcher's first thread (TID = PID), must be exactly the Java threads the JVM counts as live
  (``java.threads.live`` in the ``hsperfdata`` file it maps, the file ``jstat`` reads), which
  leaves its service threads out. An application thread that takes such a name breaks the count;
  then, or with ``-XX:-UsePerfData`` (no file), nothing is trusted by name. A timed ``futex`` of
  such a thread is quiet: these threads run the VM's housekeeping, never application code.
* *That a collection starts only when a Java thread allocates* (the Serial, Parallel and G1
  collectors, whose threads alone are named here; G1's ``G1PeriodicGCInterval``, off by default,
  is not read). A collection hands unreachable objects to the ``Finalizer`` and the cleaners,
  which run application code; a quiet JVM allocates nothing, so they stay asleep. A finalizer or
  ``Cleaner`` that talks to the database after a collection pgrace did not cause is not seen.

Any other timed ``futex`` in a JVM (``Object.wait(ms)``, a ``ScheduledExecutorService``, a
``java.util.Timer``: an application thread that may act on its own) is not quiet, even while a
statement of the process is held: the run waits for it and, past the step timeout, is refused.
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Protocol

from pgrace.errors import ExecError
from pgrace.model.scenario import Command, set_by_pgrace
from pgrace.servers.processes import dies_with_parent, release_group
from pgrace.text import visible

# x86_64 system call numbers: untimed waits, and the timed ones with the argument that says so.
_READ, _READV, _RECVFROM, _RECVMSG, _RECVMMSG, _ACCEPT, _ACCEPT4 = 0, 19, 45, 47, 299, 43, 288
_POLL, _PPOLL, _SELECT, _PSELECT6 = 7, 271, 23, 270
_EPOLL_WAIT, _EPOLL_PWAIT, _EPOLL_PWAIT2 = 232, 281, 441
_FUTEX, _FUTEX_WAITV, _WAIT4, _WAITID, _PAUSE, _RT_SIGSUSPEND, _RT_SIGTIMEDWAIT = 202, 449, 61, 247, 34, 130, 128
SELECTOR_WAITS = frozenset({_POLL, _PPOLL, _SELECT, _PSELECT6, _EPOLL_WAIT, _EPOLL_PWAIT, _EPOLL_PWAIT2})
"""The waits of a thread multiplexing its sockets: the only one in which pgrace's relay thread reads nothing."""
_ALWAYS_UNTIMED = {_READ, _READV, _RECVFROM, _RECVMSG, _ACCEPT, _ACCEPT4, _WAIT4, _WAITID, _PAUSE, _RT_SIGSUSPEND}
_FUTEX_WAITS = {0, 6, 9, 11, 13}  # WAIT, LOCK_PI, WAIT_BITSET, WAIT_REQUEUE_PI, LOCK_PI2
_FUTEX_FLAGS = 128 | 256  # PRIVATE, CLOCK_REALTIME
_FUTEX_WAIT_BITSET, _FUTEX_CLOCK_REALTIME = 9, 256  # the wait whose timeout is an absolute time

HOTSPOT_THREADS = (
    "VM Thread",  # safepoints and VM operations (GC among them)
    "VM Periodic Tas",  # VM Periodic Task Thread: sampling and statistics
    "Monitor Deflati",  # Monitor Deflation Thread
    "Service Thread",
    "Sweeper thread",  # the code cache sweeper
    "C1 CompilerThre",  # the JIT's compiler threads (the kernel keeps 15 bytes of a name)
    "C2 CompilerThre",
    "GC Thread#",  # G1's and the Parallel collector's workers
    "G1 Main Marker",
    "G1 Conc#",
    "G1 Refine#",
    "G1 Service",
)
"""HotSpot's own threads (JDK 17), which run no application code and which the JVM does not count as Java threads:
a name here, or one that starts with an entry ending in ``#``."""

OUTPUT_LIMIT = 64 * 1024  # bytes of a command's stdout and stderr kept for the report (the rest is read and dropped)


def _signed32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


@dataclass(frozen=True)
class ThreadState:
    """What one thread is doing, as far as the scheduler cares."""

    quiet: bool  # asleep in a wait that only input or another thread ends
    timed_fds: tuple[int, ...] | None = None  # a timed multiplexing wait: the descriptors it waits on
    left: float | None = None  # a timed futex with an absolute deadline: seconds before it ends by itself


def thread_state(pid: int, tid: int) -> ThreadState:
    """Read one thread's state and system call (a thread that is gone is quiet: it does nothing more)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/task/{tid}/syscall") as f:
            fields = f.read().split()
    except (FileNotFoundError, ProcessLookupError):
        return ThreadState(True)
    except (OSError, IndexError):
        return ThreadState(False)
    if state in ("Z", "X"):
        return ThreadState(True)
    if state != "S" or not fields or fields[0] in ("running", "-1"):
        return ThreadState(False)
    nr = int(fields[0])
    args = [int(a, 16) for a in fields[1:7]]
    if nr in _ALWAYS_UNTIMED:
        return ThreadState(True)
    if nr == _FUTEX:
        if (args[1] & ~_FUTEX_FLAGS) not in _FUTEX_WAITS:
            return ThreadState(False)
        if args[3] == 0:
            return ThreadState(True)
        if args[1] & ~_FUTEX_FLAGS != _FUTEX_WAIT_BITSET:
            return ThreadState(False, ())  # a relative timeout: when it started is not known
        left = _left(pid, args[3], realtime=bool(args[1] & _FUTEX_CLOCK_REALTIME))
        try:  # the same wait still, so the deadline read is this wait's, not the next one's
            with open(f"/proc/{pid}/task/{tid}/syscall") as f:
                again = f.read().split()
        except OSError:
            again = []
        return ThreadState(False, (), left if again == fields else None)
    if nr == _FUTEX_WAITV:
        return ThreadState(True) if args[3] == 0 else ThreadState(False, ())
    if nr == _RT_SIGTIMEDWAIT:
        return ThreadState(True) if args[2] == 0 else ThreadState(False, ())
    untimed = {
        _POLL: _signed32(args[2]) < 0,
        _PPOLL: args[2] == 0,
        _SELECT: args[4] == 0,
        _PSELECT6: args[4] == 0,
        _EPOLL_WAIT: _signed32(args[3]) < 0,
        _EPOLL_PWAIT: _signed32(args[3]) < 0,
        _EPOLL_PWAIT2: args[3] == 0,
    }.get(nr)
    if untimed is None:
        return ThreadState(False)
    if untimed:
        return ThreadState(True)
    return ThreadState(False, _waited_fds(pid, nr, args))


def _left(pid: int, timespec: int, realtime: bool) -> float | None:
    """Seconds until an absolute futex timeout (a ``struct timespec`` in the process's memory); None: unreadable."""
    try:
        with open(f"/proc/{pid}/mem", "rb") as mem:
            mem.seek(timespec)
            seconds, nanoseconds = struct.unpack("qq", mem.read(16))
    except (OSError, ValueError, OverflowError, struct.error):
        return None
    now = time.clock_gettime(time.CLOCK_REALTIME if realtime else time.CLOCK_MONOTONIC)
    return float(seconds) + float(nanoseconds) / 1e9 - now


def _waited_fds(pid: int, nr: int, args: list[int]) -> tuple[int, ...] | None:
    """The descriptors a timed poll, select or epoll wait watches (None: they cannot be read)."""
    try:
        if nr in (_POLL, _PPOLL):
            count = min(args[1], 1024)
            with open(f"/proc/{pid}/mem", "rb") as mem:
                mem.seek(args[0])
                raw = mem.read(8 * count)
            return tuple(struct.unpack_from("i", raw, 8 * k)[0] for k in range(count))
        if nr in (_EPOLL_WAIT, _EPOLL_PWAIT, _EPOLL_PWAIT2):
            with open(f"/proc/{pid}/fdinfo/{args[0]}") as f:
                return tuple(int(line.split()[1]) for line in f if line.startswith("tfd:"))
        if nr in (_SELECT, _PSELECT6):
            count = min(args[0], 1024)
            fds: list[int] = []
            with open(f"/proc/{pid}/mem", "rb") as mem:
                for pointer in args[1:4]:
                    if pointer:
                        mem.seek(pointer)
                        bits = int.from_bytes(mem.read((count + 63) // 64 * 8), "little")
                        fds += [fd for fd in range(count) if bits >> fd & 1]
            return tuple(sorted(set(fds)))
    except (OSError, ValueError, IndexError, struct.error):
        return None
    return None


_WAKE_UPS = ("anon_inode:[eventfd]", "anon_inode:[signalfd]")


def _pgrace_or_wake_up(
    pid: int, fd: int, proxied: set[int], own_pipes: set[str], wake_ups: frozenset[int] = frozenset()
) -> bool:
    """A descriptor a timed wait may watch and stay quiet: a socket to the proxy, or the process's own wake-up
    (an eventfd, a signalfd, a pipe whose both ends it holds, as libuv's)."""
    try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return False
    if target.startswith("socket:["):
        return int(target[8:-1]) in proxied or int(target[8:-1]) in wake_ups
    return target in _WAKE_UPS or target in own_pipes


def _own_pipes(pid: int) -> set[str]:
    """Pipes both of whose ends the process holds: only its own threads write them."""
    seen: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("pipe:["):
                    seen[target] = seen.get(target, 0) + 1
    return {pipe for pipe, count in seen.items() if count > 1}


def descendants(pid: int) -> list[int]:
    """``pid`` and every process it started that is still its descendant (``/proc/.../children``)."""
    seen, todo = [], [pid]
    while todo:
        current = todo.pop()
        seen.append(current)
        with contextlib.suppress(OSError), os.scandir(f"/proc/{current}/task") as tasks:
            for task in tasks:
                with contextlib.suppress(OSError), open(f"/proc/{current}/task/{task.name}/children") as f:
                    todo += [int(child) for child in f.read().split()]
    return seen


def quiet(root: int, proxied: set[int], held: bool, horizon: float) -> str | None:
    """None when every thread of ``root``'s process tree waits provably; else which thread does not, for people.

    ``proxied``: the inodes of sockets connected to the proxy; ``held``: a statement of the process is pgrace's;
    ``horizon``: a timed wait whose deadline is further away than this many seconds is quiet.
    """
    seen = _threads(root)
    ran = {(pid, tid): _ran(pid, tid) for pid, tids in seen.items() for tid in tids}
    for pid, tids in seen.items():
        moving = threads_quiet(pid, list(tids), proxied, held, horizon)
        if moving is not None:
            return moving
    # A look reads one thread after another: one read asleep may have run since (woken by a thread read later,
    # or by one started meanwhile and not in the look, as a launcher that joins the thread it has just started).
    # The look holds only if the same threads are there after it and none of them has run in between, nor been
    # woken (a thread that ended has woken its joiner before it is gone from the list: read after the list).
    # A thread read runnable is not asleep, whatever it is read doing next: a thread preempted just as it went to
    # sleep is read asleep, off its CPU, and a waker makes it runnable again before it has run, its counts unchanged.
    # A thread the kernel counts can be missing from /proc's list of them: the count must agree.
    if (
        _threads(root) != seen
        or any(_ran(pid, tid) != before or _runnable(before) for (pid, tid), before in ran.items())
        or any(_counted(pid) != len(tids) for pid, tids in seen.items())
    ):
        return f"process {root}'s threads, which ran while pgrace looked"
    return None


def _runnable(ran: str | None) -> bool:
    """Whether :func:`_ran` read the thread running or waiting for a CPU."""
    return ran is not None and ran.startswith(("R", "State:\tR"))


def _counted(pid: int) -> int | None:
    """How many threads the kernel counts in the process (its ``stat``'s num_threads); None: unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[17])
    except (OSError, IndexError, ValueError):
        return None


def _ran(pid: int, tid: int) -> str | None:
    """What a thread has run so far (the scheduler's count of its time on a CPU and of its turns), and its state:
    it changes whenever the thread runs, or is woken and waits for a CPU (runnable, it has not run yet). None: the
    thread is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            return state + " " + f.read()
    except FileNotFoundError:
        pass
    except (OSError, IndexError):
        return None
    try:  # a kernel without scheduler statistics: the state and context switches in its status
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            return "".join(line for line in f if "ctxt_switches" in line or line.startswith("State:"))
    except OSError:
        return None


def _threads(root: int) -> dict[int, frozenset[int]]:
    """Every process of ``root``'s tree and its threads."""
    found: dict[int, frozenset[int]] = {}
    for pid in descendants(root):
        with contextlib.suppress(OSError):
            found[pid] = frozenset(int(tid) for tid in os.listdir(f"/proc/{pid}/task"))
    return found


def threads_quiet(
    pid: int, tids: list[int], proxied: set[int], held: bool, horizon: float, wake_ups: frozenset[int] = frozenset()
) -> str | None:
    """:func:`quiet` for some threads of one process; ``wake_ups``: socket inodes that are the process's own."""
    own: set[str] | None = None
    jvm: Jvm | None = None
    for tid in tids:
        state = thread_state(pid, tid)
        if state.quiet or (state.left is not None and state.left > horizon):
            continue
        fds = state.timed_fds
        if fds == ():  # a timed futex
            jvm = jvm_of(pid) if jvm is None else jvm
            if jvm.hotspot:
                if tid in jvm.own:
                    continue
                return f"process {pid} thread {tid} {_comm(pid, tid)!r} in a timed wait{jvm.why}"
        if held and fds is not None:
            own = _own_pipes(pid) if own is None else own
            if all(_pgrace_or_wake_up(pid, fd, proxied, own, wake_ups) for fd in fds):
                continue
        return f"process {pid} thread {tid}"
    return None


def _comm(pid: int, tid: int) -> str:
    """A thread's name as the kernel keeps it (15 bytes), control characters made visible."""
    try:
        with open(f"/proc/{pid}/task/{tid}/comm", "rb") as f:
            return visible(f.read().rstrip(b"\n").decode("utf-8", "replace"))
    except OSError:
        return "?"


@dataclass(frozen=True)
class Jvm:
    """What the rule trusts of a process as a JVM: ``own``, HotSpot's own threads, when its count agrees."""

    hotspot: bool  # the process maps libjvm.so
    own: frozenset[int] = frozenset()
    why: str = ""  # why nothing is trusted by name, for people ("" when ``own`` holds)


def jvm_of(pid: int) -> Jvm:
    """HotSpot's own threads of ``pid``, by name, cross-checked by the JVM's count of live Java threads."""
    hotspot, perf = False, None
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                cols = line.split(maxsplit=5)
                path = cols[5].strip() if len(cols) == 6 else ""
                if path.endswith("/libjvm.so"):
                    hotspot = True
                elif os.path.basename(os.path.dirname(path)).startswith("hsperfdata_"):
                    perf = (path, int(cols[4]))
    except (OSError, ValueError):
        return Jvm(False)
    if not hotspot:
        return Jvm(False)
    if perf is None:
        return Jvm(True, why="; no hsperfdata file to count the JVM's threads with (-XX:-UsePerfData)")
    live = _java_threads_live(*perf)
    try:
        tids = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return Jvm(True, why="; its threads could not be listed")
    own = frozenset(t for t in tids if t != pid and _hotspot_name(_comm(pid, t)))
    others = len(tids) - len(own) - (pid in tids)
    if live is None or live != others:
        counted = "no Java threads (its hsperfdata file unreadable)" if live is None else f"{live} Java threads"
        return Jvm(True, why=f"; the JVM counts {counted}, pgrace {others} besides the JVM's own and the launcher's")
    return Jvm(True, own)


def _hotspot_name(name: str) -> bool:
    return any(name == known or (known.endswith("#") and name.startswith(known)) for known in HOTSPOT_THREADS)


def _java_threads_live(path: str, inode: int) -> int | None:
    """``java.threads.live`` from a HotSpot performance data file (the one the process maps: same inode)."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_ino != inode:
                return None
            raw = f.read(1 << 20)
        if raw[:4] != b"\xca\xfe\xc0\xc0" or not raw[7]:  # magic; accessible (the JVM finished writing it)
            return None
        order = "<" if raw[4] == 1 else ">"
        offset, count = struct.unpack_from(order + "ii", raw, 24)
        for _ in range(min(count, 10_000)):
            length, name_at, vector, kind, _flags, _units, _variability, data_at = struct.unpack_from(
                order + "iiibbbbi", raw, offset
            )
            end = raw.index(b"\0", offset + name_at)
            if raw[offset + name_at : end] == b"java.threads.live" and vector == 0 and kind == ord("J"):
                return int(struct.unpack_from(order + "q", raw, offset + data_at)[0])
            if length <= 0:
                return None
            offset += length
    except (OSError, ValueError, IndexError, struct.error):
        return None
    return None


class Actor(Protocol):
    """What sends statements through the proxy in a run: an ``--exec`` command's process, or an async session's thread.

    ``owns``: whether a client connection is its own; ``moving``: None while it provably waits (see
    :func:`quiet`), else who runs, for people; ``exit_code``: None while it lives.
    """

    opened: int  # its connections so far, for NAME#N names
    reported: bool  # its end is on the timeline

    @property
    def name(self) -> str: ...

    def owns(self, peer_pid: int | None, application_name: str | None) -> bool: ...

    def moving(self, proxied: set[int], held: bool, horizon: float) -> str | None: ...

    def exit_code(self) -> int | None: ...

    def last_words(self) -> str:
        """Why it failed, in one line (a command's last line of stderr, a session's exception)."""
        ...

    def stop(self) -> None:
        """End it, and wait until it has ended (the run is over, or pgrace is)."""
        ...


@dataclass
class Started:
    """A command's process in this run, its output drained so that it never blocks writing."""

    command: Command
    proc: subprocess.Popen[bytes]
    output: dict[str, bytearray] = field(default_factory=lambda: {"stdout": bytearray(), "stderr": bytearray()})
    readers: list[threading.Thread] = field(default_factory=list)
    opened: int = 0  # its connections so far, for COMMAND#N names
    reported: bool = False  # its exit is on the timeline

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def name(self) -> str:
        return self.command.name

    def owns(self, peer_pid: int | None, application_name: str | None) -> bool:
        """A connection from the command's process tree (its parents walked up from ``peer_pid``)."""
        pid = peer_pid
        for _ in range(64):
            if pid is None or pid <= 1:
                return False
            if pid == self.pid:
                return True
            pid = _parent(pid)
        return False

    def moving(self, proxied: set[int], held: bool, horizon: float) -> str | None:
        return quiet(self.pid, proxied, held, horizon)

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def text(self, stream: str) -> str:
        return bytes(self.output[stream]).decode("utf-8", "replace")

    def last_words(self) -> str:
        for reader in self.readers:
            reader.join(1.0)
        return next((ln.strip() for ln in reversed(self.text("stderr").splitlines()) if ln.strip()), "")

    def stop(self) -> None:
        kill(self)


def _parent(pid: int) -> int | None:
    with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])
    return None


def start(command: Command, env: Mapping[str, str], cwd: str | None = None) -> Started:
    """The command under ``/bin/sh -c``, in a process group of its own that dies with pgrace (in its own folder, with
    its own variables, where it says; pgrace's proxy variables in ``env`` win)."""
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command.line],
            env={**env, **{k: v for k, v in command.env if not set_by_pgrace(k)}},
            cwd=command.cwd or cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=dies_with_parent(group=True),
        )
    except OSError as exc:  # its folder went away, no /bin/sh: said where the command was given
        raise ExecError(
            f"cannot start command {command.name!r} in {command.cwd or cwd or '.'}: {exc.strerror or exc}",
            command.source or "commands",
            command.line_number,
        ) from None
    started = Started(command, proc)
    for stream in ("stdout", "stderr"):
        pipe = getattr(proc, stream)
        reader = threading.Thread(
            target=_drain, args=(pipe, started.output[stream]), name=f"pgrace exec {command.name} {stream}", daemon=True
        )
        reader.start()
        started.readers.append(reader)
    return started


def _drain(pipe: IO[bytes], into: bytearray) -> None:
    while chunk := pipe.read(65536):
        if len(into) < OUTPUT_LIMIT:
            into += chunk[: OUTPUT_LIMIT - len(into)]


def kill(started: Started, grace: float = 1.0) -> None:
    """SIGTERM to the command's process group, SIGKILL after ``grace``; its output readers joined."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(started.pid, sig)
        deadline = time.monotonic() + grace
        while started.proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                started.proc.wait(0.05)
        if started.proc.poll() is not None and not _group_alive(started.pid):
            break
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(started.pid, signal.SIGKILL)  # whatever of the group outlived its leader
    started.proc.wait()
    release_group(started.pid)
    for reader in started.readers:
        reader.join(grace)
    for pipe in (started.proc.stdout, started.proc.stderr):
        if pipe is not None:
            pipe.close()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
