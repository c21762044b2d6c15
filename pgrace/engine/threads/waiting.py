"""How the scheduler waits for thread sessions: on the condition their threads notify."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from pgrace.engine.waiting import FIRST_SLICE_S, LAST_SLICE_S

if TYPE_CHECKING:
    from pgrace.engine.observe.locks import LockInspector
    from pgrace.engine.threads.session import ThreadSession


class GateWaiting:
    """Thread sessions: wait on the condition their threads notify when a statement ends."""

    first_slice = FIRST_SLICE_S

    def __init__(
        self,
        sessions: Mapping[str, ThreadSession],
        cond: threading.Condition,
        inspector: LockInspector,
        step_timeout: float,
    ) -> None:
        self.sessions = sessions
        self.cond = cond
        self.inspector = inspector
        self.step_timeout = step_timeout

    def running(self, session: ThreadSession, read: bool = False) -> bool:
        with self.cond:
            return session.gate.state == "running" and session.gate.finished is None

    def wait(self, session: ThreadSession, slice_s: float) -> tuple[bool, list[ThreadSession]]:
        """Any session's statement that ends notifies the condition: the others' ends are news too."""
        with self.cond:
            if session.gate.finished is None and session.gate.state == "running":
                self.cond.wait(slice_s)
            others = [s for s in self.sessions.values() if s is not session and s.gate.finished is not None]
            return session.gate.finished is not None or session.gate.state != "running", others

    def next_slice(self, slice_s: float) -> float:
        return min(slice_s * 2, LAST_SLICE_S)

    def answered(self, sessions: Iterable[ThreadSession]) -> list[ThreadSession]:
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
