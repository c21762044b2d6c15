"""Worker processes for the parallel drivers (``-j N``): stopped within a deadline, none outliving pgrace.

A process pool cannot promise that: a pool worker terminated while it holds the pool's
shared queue lock leaves the other workers, and the pool's shutdown, waiting on it for
good (``explore -j 6`` hung for minutes after Ctrl-C). Here every worker is a plain
spawned process with a pipe of its own that carries its one result back, so pgrace can
stop each one (SIGTERM: the worker cleans up, dropping its scratch database), wait for
all of them together up to :data:`STOP_DEADLINE_S`, and SIGKILL whatever is left.

Signals: Ctrl-C at a terminal reaches the whole process group, SIGTERM only pgrace;
workers ignore SIGINT and leave both to pgrace, which stops them with SIGTERM. A
worker starts with SIGINT and SIGTERM blocked (the mask is inherited), so neither can
strike while Python starts up (a traceback on the user's terminal); a stop sent meanwhile
waits until the worker can clean up. On Linux a worker is also sent SIGTERM when
pgrace dies, even of SIGKILL. Workers print nothing: what went wrong travels back
through the pipe, and pgrace reports it in one line.

This module is the worker's entry point, so it imports only the standard library:
what the work itself needs is imported once signals are in place.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pgrace.errors import PgraceError, RunAborted, Terminated

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess
    from types import FrameType

__all__ = ["STOP_DEADLINE_S", "run_in_processes"]

STOP_DEADLINE_S = 1.5  # from SIGTERM to SIGKILL: cleaning up (dropping a scratch database) takes ~0.1 s
POLL_S = 0.5
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
_PR_SET_PDEATHSIG = 1

Call = tuple[Callable[..., Any], tuple[Any, ...]]


@dataclass
class _Worker:
    process: BaseProcess
    results: Connection


def run_in_processes(
    calls: Sequence[Call], on_killed: Callable[[], None] | None = None, on_wait: Callable[[], None] | None = None
) -> list[Any]:
    """Run each ``(function, args)`` in a worker process of its own; their results, in order.

    The functions and their arguments must pickle (module-level functions). The first
    exception a worker raises is raised here once every worker has stopped; so is
    Ctrl-C or SIGTERM of this process. ``on_killed`` runs when a worker had to be
    SIGKILLed, to remove what it could not clean up; ``on_wait`` every :data:`POLL_S` while
    they work (to tell progress the workers leave somewhere).
    """
    from multiprocessing import get_context, resource_tracker

    context = get_context("spawn")
    # It would unblock our signals when it first starts, inside Process.start(): start it now.
    resource_tracker.ensure_running()
    workers: list[_Worker] = []
    try:
        for n, call in enumerate(calls, 1):
            _start(context, call, n, workers)
        results = _collect(workers, on_wait)
    except BaseException:
        _stop(workers, on_killed)
        raise
    _stop(workers, on_killed)  # they are exiting by now: this only waits
    return results


def _start(context: Any, call: Call, n: int, workers: list[_Worker]) -> None:
    """Start a worker, listed first so that it is stopped even if a signal interrupts its start."""
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(
        target=_work, args=(sender, os.getpid(), pickle.dumps(call)), name=f"pgrace-worker-{n}", daemon=True
    )
    workers.append(_Worker(process, receiver))
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a signal that came meanwhile is raised here
        sender.close()


def _collect(workers: list[_Worker], on_wait: Callable[[], None] | None = None) -> list[Any]:
    """Each worker's result as it comes (a result larger than a pipe's buffer must be read to let it finish)."""
    from multiprocessing.connection import wait

    results: dict[int, Any] = {}
    waiting = {id(w.results): i for i, w in enumerate(workers)}
    while waiting:
        if on_wait is not None:
            on_wait()
        for ready in wait([workers[i].results for i in waiting.values()], None if on_wait is None else POLL_S):
            i = waiting.pop(id(ready))
            which = f"worker process {i + 1} of {len(workers)}"
            try:
                kind, value = workers[i].results.recv()
            except (EOFError, OSError):
                kind, value = "lost", None
            if kind == "done":
                results[i] = value
            elif kind == "failed":
                raise value
            elif kind == "stopped":
                raise RunAborted(f"{which} was stopped by a signal from outside pgrace")
            else:
                raise RunAborted(f"{which} ended without a result ({_end(workers[i])})")
    return [results[i] for i in range(len(workers))]


def _end(worker: _Worker) -> str:
    worker.process.join(STOP_DEADLINE_S)
    code = worker.process.exitcode
    if code is None:
        return "it stopped answering"
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"


def _stop(workers: list[_Worker], on_killed: Callable[[], None] | None) -> None:
    """SIGTERM every live worker, wait for them all up to the deadline, SIGKILL the rest."""
    from pgrace.servers import deferred_interrupts

    with deferred_interrupts():
        for worker in workers:
            if worker.process.pid is not None and worker.process.exitcode is None:
                with suppress(ProcessLookupError):
                    os.kill(worker.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_DEADLINE_S
        for worker in workers:
            if worker.process.pid is not None:
                worker.process.join(max(0.0, deadline - time.monotonic()))
        killed = [w for w in workers if w.process.pid is not None and w.process.exitcode is None]
        for worker in killed:
            worker.process.kill()
            worker.process.join()
        for worker in workers:
            worker.results.close()
        if killed and on_killed is not None:
            on_killed()


# -- in the worker ------------------------------------------------------------------------


def _work(results: Connection, parent: int, payload: bytes) -> None:
    """A worker's whole life: run the call, send back what came of it, exit (the spawn target)."""
    try:
        outcome = _outcome(parent, payload)
    except KeyboardInterrupt:  # stopped just as the call ended
        outcome = ("stopped", None)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # nothing left to clean up: a stop now just ends it
    try:
        try:
            results.send(outcome)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:  # an exception that does not pickle
            results.send(("failed", RuntimeError(f"{type(outcome[1]).__name__}: {outcome[1]} ({exc})")))
    except OSError:  # pgrace is gone: nobody to tell
        pass


def _outcome(parent: int, payload: bytes) -> tuple[str, Any]:
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: pgrace stops us
        signal.signal(signal.SIGTERM, _stop_once)
        _die_with(parent)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)  # a stop sent while we started ends us here
        _quiet()
        function, args = pickle.loads(payload)
        return "done", function(*args)
    except KeyboardInterrupt:
        return "stopped", None
    except BaseException as exc:
        from pgrace.engine.sqlerrors import lost_connection

        if (gone := lost_connection(exc)) is not None:  # said here: pickled, the error loses its connection's state
            return "failed", RunAborted.server_gone(gone)
        if not isinstance(exc, PgraceError):  # a bug: PGRACE_DEBUG=1 shows where it happened
            import traceback

            exc.add_note("in a worker process:\n" + "".join(traceback.format_exception(exc)).rstrip())
        return "failed", exc


def _stop_once(signum: int, frame: FrameType | None) -> None:
    """SIGTERM in a worker: raise :class:`Terminated` once (cleanup runs); later ones change nothing.

    Python swallows an exception raised where it cannot propagate (a weakref callback during
    an import, a ``__del__``): the alarm then ends the worker all the same once the deadline
    has passed, as pgrace's SIGKILL would. It matters when pgrace is dead and cannot.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.setitimer(signal.ITIMER_REAL, STOP_DEADLINE_S)  # SIGALRM's default action ends the process
    raise Terminated()


def _quiet() -> None:
    """No log record reaches the user's terminal (psycopg warns there when a stop interrupts a query)."""
    import logging

    logging.getLogger().addHandler(logging.NullHandler())


def _die_with(parent: int) -> None:
    """Have the kernel send SIGTERM when pgrace dies, even of SIGKILL (Linux only)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:  # pgrace died before the signal was armed
        raise Terminated()
