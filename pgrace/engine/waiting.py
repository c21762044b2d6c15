"""How the scheduler waits for a step, apart from what it does with the answer.

As psycopg keeps its protocol (``psycopg/generators.py``) apart from its waiting strategy
(``psycopg/waiting.py``), the one :class:`~pgrace.engine.scheduler.Scheduler` asks a
strategy two things and decides the rest itself (probe, cancel, completion, release):

* :meth:`Waiting.running`: is the session's statement still running, as far as we know now?
* :meth:`Waiting.wait`: wait up to a slice for the statement (or another watched session)
  to say something.

:class:`~pgrace.engine.libpq.waiting.SocketWaiting` waits in ``select`` on libpq sockets
(a scenario's steps); :class:`~pgrace.engine.threads.waiting.GateWaiting` waits on the
condition the application's session threads notify when a statement ends.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from pgrace.engine.steps import Active

# isolationtester's wait loop: select() on the step's socket for this long, then probe.
ISOLATIONTESTER_SLICE_S = 0.01
FIRST_SLICE_S = 0.0001  # pgrace's own: a wait is seen as soon as it starts
LAST_SLICE_S = 0.001
PATIENT_SLICE_S = 0.02  # the longest a poll of something slow to come (a client's start-up) sleeps


def backoff(slice_s: float, waited_s: float) -> float:
    """The poll after a ``slice_s`` one, ``waited_s`` into a wait for news nobody notifies (a process's threads,
    the kernel's socket tables, the server's statistics): doubling up to a millisecond, then a tenth of the time
    waited so far, up to 20 ms. A short wait is seen within a millisecond; a long one (an interpreter starting)
    costs its pollers a few dozen looks a second, not a thousand, on cores the clients need.
    """
    return min(slice_s * 2, max(LAST_SLICE_S, min(waited_s / 10, PATIENT_SLICE_S)))


S = TypeVar("S")


class Waiting(Protocol[S]):
    """A transport's way to wait for its sessions' statements."""

    def running(self, session: S, read: bool = False) -> bool:
        """Whether the session's statement has not finished yet (``read``: what arrived is read first)."""
        ...

    def wait(self, session: S, slice_s: float, pending: Collection[Active]) -> tuple[bool, list[S]]:
        """Wait up to ``slice_s`` for news: whether ``session`` spoke (read), and which watched others did.

        ``pending``: the steps the scheduler still waits for (their sessions may be watched too).
        """
        ...

    def next_slice(self, slice_s: float) -> float:
        """The slice after ``slice_s`` (the first is :attr:`first_slice`)."""
        ...

    @property
    def first_slice(self) -> float: ...

    def answered(self, sessions: Iterable[S]) -> list[S]:
        """Of sessions whose step has not been collected, those whose answer is in (or on the wire: then waited for)."""
        ...
