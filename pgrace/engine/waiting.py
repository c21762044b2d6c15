"""How the scheduler waits for a step, apart from what it does with the answer.

As psycopg keeps its protocol (``psycopg/generators.py``) apart from its waiting strategy
(``psycopg/waiting.py``), the one :class:`~pgrace.engine.scheduler.Scheduler` asks a
strategy two things and decides the rest itself (probe, cancel, completion, release):

* :meth:`Waiting.running`: is the session's statement still running, as far as we know now?
* :meth:`Waiting.wait`: wait up to a slice for the statement (or another watched session)
  to say something.

:class:`SocketWaiting` waits in ``select`` on libpq sockets (a scenario's steps);
:class:`GateWaiting` waits on the condition the application's session threads notify
when a statement ends.
"""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from pgrace.engine.libpq import LibpqSession

if TYPE_CHECKING:
    from pgrace.engine.observe.locks import LockInspector
    from pgrace.engine.threads import Gate

# isolationtester's wait loop: select() on the step's socket for this long, then probe.
ISOLATIONTESTER_SLICE_S = 0.01
FIRST_SLICE_S = 0.0001  # pgrace's own: a wait is seen as soon as it starts
LAST_SLICE_S = 0.001

S = TypeVar("S")


class Waiting(Protocol[S]):
    """A transport's way to wait for its sessions' statements."""

    def running(self, session: S, read: bool = False) -> bool:
        """Whether the session's statement has not finished yet (``read``: what arrived is read first)."""
        ...

    def wait(self, session: S, slice_s: float) -> tuple[bool, list[S]]:
        """Wait up to ``slice_s`` for news: whether ``session`` spoke (read), and which watched others did."""
        ...

    def next_slice(self, slice_s: float) -> float:
        """The slice after ``slice_s`` (the first is :attr:`first_slice`)."""
        ...

    @property
    def first_slice(self) -> float: ...

    def answered(self, sessions: Iterable[S]) -> list[S]:
        """Of sessions whose step has not been settled, those whose answer is in (or on the wire: then waited for)."""
        ...


class SocketWaiting:
    """libpq sessions: ``select`` on the step's socket, and (``watch``) on the other sessions' too.

    A spec waits as isolationtester does, in 10 ms slices on its one socket before each
    probe: which of several steps freed by one server event is reported first depends on
    it (while it polls each waiting step for 10 ms, a deadlock may be detected). pgrace's
    own scenarios start at 0.1 ms, to see a wait as soon as it starts, and watch the other
    sessions meanwhile.
    """

    def __init__(self, spec: bool, watched: Callable[[LibpqSession], dict[int, LibpqSession]]) -> None:
        self.spec = spec
        self.watched = watched
        self.first_slice = ISOLATIONTESTER_SLICE_S if spec else FIRST_SLICE_S

    def running(self, session: LibpqSession, read: bool = False) -> bool:
        if read:
            session.consume()
        return bool(session.pgconn.is_busy())

    def wait(self, session: LibpqSession, slice_s: float) -> tuple[bool, list[LibpqSession]]:
        others = {} if self.spec else self.watched(session)  # a spec: isolationtester's one socket
        readable, _, _ = select.select([session.pgconn.socket, *others], [], [], slice_s)
        spoke = session.pgconn.socket in readable
        if spoke:
            session.consume()
        return spoke, [others[fd] for fd in readable if fd in others]

    def next_slice(self, slice_s: float) -> float:
        return slice_s if self.spec else min(slice_s * 2, LAST_SLICE_S)

    def answered(self, sessions: Iterable[LibpqSession]) -> list[LibpqSession]:
        """Results that already arrived (a deadlock victim's): what is read, never waited for."""
        found = []
        for session in sessions:
            session.consume()
            if not session.pgconn.is_busy():
                found.append(session)
        return found


class Gated(Protocol):
    """A session parked at a gate: an application's thread, or the relay's thread of a client connection."""

    gate: Gate

    @property
    def pid(self) -> int: ...


G = TypeVar("G", bound=Gated)


class GateWaiting(Generic[G]):
    """Gated sessions: wait on the condition their threads notify when a statement ends."""

    first_slice = FIRST_SLICE_S

    def __init__(
        self,
        sessions: Mapping[str, G],
        cond: threading.Condition,
        inspector: LockInspector,
        step_timeout: float,
    ) -> None:
        self.sessions = sessions
        self.cond = cond
        self.inspector = inspector
        self.step_timeout = step_timeout

    def running(self, session: G, read: bool = False) -> bool:
        with self.cond:
            return session.gate.state == "running" and session.gate.finished is None

    def wait(self, session: G, slice_s: float) -> tuple[bool, list[G]]:
        """Any session's statement that ends notifies the condition: the others' ends are news too."""
        with self.cond:
            if session.gate.finished is None and session.gate.state == "running":
                self.cond.wait(slice_s)
            others = [s for s in self.sessions.values() if s is not session and s.gate.finished is not None]
            return session.gate.finished is not None or session.gate.state != "running", others

    def next_slice(self, slice_s: float) -> float:
        return min(slice_s * 2, LAST_SLICE_S)

    def answered(self, sessions: Iterable[G]) -> list[G]:
        """A holder's COMMIT frees the waiter before its own answer reaches its thread, so the
        waiter's thread can report first. A blocker whose backend is no longer active has
        its answer on the wire: it is waited for. One still active has not finished.
        """
        pending = list(sessions)
        if not pending:
            return []
        states = self.inspector.states([s.pid for s in pending])
        found = []
        for session in pending:
            gate = session.gate
            with self.cond:
                if states.get(session.pid) != "active":
                    deadline = time.perf_counter() + self.step_timeout
                    while gate.finished is None and (left := deadline - time.perf_counter()) > 0:
                        self.cond.wait(left)
                if gate.finished is not None:
                    found.append(session)
        return found
