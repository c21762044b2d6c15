"""How the scheduler waits for libpq sessions: ``select`` on their sockets."""

from __future__ import annotations

import select
from collections.abc import Callable, Iterable

from pgrace.engine.libpq.session import LibpqSession
from pgrace.engine.waiting import FIRST_SLICE_S, ISOLATIONTESTER_SLICE_S, LAST_SLICE_S


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
