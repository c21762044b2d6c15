"""The libpq transport's own steps (a deliberate sleep, a crash) and the sessions the server ended meanwhile.

A sleep is what lets ``lock_timeout``, ``statement_timeout``, the deadlock detector and
``idle_in_transaction_session_timeout`` fire at a chosen point, while the other sessions
are still watched; a crash kills a session as a dying worker would; and a session the
server ends while it runs nothing is noted when found, with the server's reason.

The scheduler's steps are given to each call (:class:`~pgrace.engine.transport.LaunchedSteps`):
a waiting step that ends meanwhile is handed back to it, never reported from here.
"""

from __future__ import annotations

import os
import select
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import pq

from pgrace.engine.libpq.session import LibpqSession, sockets
from pgrace.engine.sqlerrors import exception_error, first_line
from pgrace.engine.steps import Active
from pgrace.errors import PgraceError, RunAborted
from pgrace.model.timeline import Outcome, SessionLost, SqlError

# A step whose reply comes this soon after another step it released is reported first.
RELEASER_GRACE_S = 0.05

if TYPE_CHECKING:
    from pgrace.engine.steps import Recorder
    from pgrace.engine.transport import LaunchedSteps


class OwnSteps:
    """The steps that send no SQL (sleeps, crashes) and the sessions the server ended, for one set of libpq sessions."""

    def __init__(
        self,
        sessions: dict[str, LibpqSession],
        control: psycopg.Connection[Any],
        aborted: Callable[[str, str], PgraceError],
        recorder: Recorder,
        step_timeout: float,
    ) -> None:
        self.sessions = sessions
        self.control = control
        self.aborted = aborted
        self.recorder = recorder
        self.step_timeout = step_timeout
        self.crashes: set[int] = set()  # the seqs of crash steps

    def use_control(self, control: psycopg.Connection[Any]) -> None:
        """The control connection was opened again (a step had ended it)."""
        self.control = control

    def sleep(self, seconds: float, launched: LaunchedSteps) -> None:
        """A deliberate pause: the schedule stands still while the other sessions are still watched.

        A waiting step that ends meanwhile is reported as it ends (its time, who released it,
        the locks then), and a session the server ends meanwhile is noted lost then, with the
        server's reason.
        """
        deadline = time.perf_counter() + seconds
        while (left := deadline - time.perf_counter()) > 0:
            watched = sockets(s for s in self.sessions.values() if s.lost is None and s.ended is None)
            if not watched:
                time.sleep(min(left, 0.1))  # nothing to watch: only the clock
                launched.idle()
                continue
            readable, _, _ = select.select(list(watched), [], [], min(left, 0.1))
            for fd in readable:
                session = watched[fd]
                active = session.active
                if active is not None and launched.is_pending(active) and active.outcome is None:
                    session.consume()
                    if not session.pgconn.is_busy():
                        launched.collect(session, active)
                        launched.report_unless_held(session, active)
                else:
                    self.found_ended_idle(session, launched.last_done)
            launched.idle()

    def others_ended(self, running: Active, sessions: list[LibpqSession], launched: LaunchedSteps) -> None:
        """While ``running`` runs on, other steps ended (a lock_timeout, a release) or the server ended a session.

        Each is reported as it ends, with the locks then, as during a sleep. When
        ``running`` itself ends right after (it released them: a COMMIT), its end comes
        first, as without it: what a step releases follows it. "Right after" is within
        :data:`RELEASER_GRACE_S`, a bound on ordering near-simultaneous replies, not a wait
        for anything to happen. A waiting step whose session the server ended is collected
        and told after the running step, whatever the timing: the running step is what
        ended it (``pg_terminate_backend``), and the order must not depend on load.
        """
        graced = False
        for session in sessions:
            other = session.active
            if other is None:
                self.found_ended_idle(session, launched.last_done, during=running.seq)
                continue
            session.consume()
            if session.pgconn.is_busy() or not launched.is_pending(other):
                continue
            if not graced:  # one grace for all that ended together, not one each
                if self._ends_within(running, RELEASER_GRACE_S):
                    return  # reported after it, by whoever polls the waiting steps next
                graced = True
            launched.collect(session, other)
            if other.lost is not None:
                continue  # collected now, told after the running step (which polls the waiting steps)
            launched.report_unless_held(session, other)

    def _ends_within(self, active: Active, seconds: float) -> bool:
        """Whether ``active``'s result is all in within ``seconds``."""
        session = self.sessions[active.step.session]
        pgconn = session.pgconn
        deadline = time.perf_counter() + seconds
        while pgconn.is_busy() and (left := deadline - time.perf_counter()) > 0:
            if select.select([pgconn.socket], [], [], left)[0]:
                session.consume()
        return not pgconn.is_busy()

    def look_for_ended_idle(self, last_done: int) -> None:
        """After each step: has the server ended a session that runs nothing (a readable idle socket)?"""
        idle = sockets(s for s in self.sessions.values() if s.active is None and s.lost is None and s.ended is None)
        if idle:
            readable, _, _ = select.select(list(idle), [], [], 0)
            for fd in readable:
                self.found_ended_idle(idle[fd], last_done)

    def _ended(self, session: LibpqSession) -> bool:
        """Whether the server ended ``session``, not yet noted: it said why (FATAL) or hung up."""
        if session.lost is not None or session.ended is not None:
            return False
        session.consume()
        session.pgconn.is_busy()  # hands an idle connection's error to the notice handler
        return session.pgconn.status == pq.ConnStatus.BAD or session.fatal is not None

    def found_ended_idle(self, session: LibpqSession, last_done: int, during: int | None = None) -> None:
        """A session with no statement running whose connection the server ended: noted now, with its reason.

        ``idle_in_transaction_session_timeout`` or a terminate from outside the scenario: the
        server says why (25P03, 57P01) before it hangs up, and libpq hands that to the notice
        handler. Its locks are gone with it, so what it held must not be shown as held after.
        It is told with ``during``, the step that still runs as it is found, or else with the
        latest step done (``last_done``).
        """
        if not self._ended(session):
            return
        error = session.fatal or SqlError("08006", "connection to the server was lost", "FATAL")
        if during is None:
            during = session.active.seq if session.active is not None else max(last_done, session.last_seq)
        recorder = self.recorder
        session.ended = SessionLost(session.name, error.message, error.sqlstate, recorder.now(), during, idle=True)
        recorder.add(session.ended)  # when it was found, before what it released

    def crash(self, session: LibpqSession, active: Active, idle: Callable[[], None]) -> Outcome:
        """Kill the session as a dying worker process would, and see it lost at once.

        ``terminate``: the control connection calls ``pg_terminate_backend`` and waits until
        the backend is gone (its transaction rolled back, its locks released).
        ``disconnect``: the client's socket is shut down under libpq, as the kernel does
        when a process dies: no goodbye message; the server sees EOF, possibly inside a
        transaction. pgrace waits until the backend has left ``pg_stat_activity``.
        """
        pid = session.pid
        timeout = self.step_timeout
        wait_ms = max(1, int(timeout * 1000))
        try:
            if active.step.crash == "terminate":
                row = self.control.execute("SELECT pg_terminate_backend(%s, %s)", (pid, wait_ms)).fetchone()
                gone = row is not None and row[0] is True
            else:
                with socket.socket(fileno=os.dup(session.pgconn.socket)) as wire:
                    wire.shutdown(socket.SHUT_RDWR)
                gone = self._backend_gone(pid, timeout, idle)
        except psycopg.OperationalError as exc:
            raise self.aborted("pgrace's control connection", first_line(str(exc))) from None
        except psycopg.Error as exc:  # e.g. 42501: not allowed to signal that backend
            return Outcome(error=exception_error(exc))
        if not gone:
            raise RunAborted(
                f"step {active.step.name}: session {session.name}'s backend did not end"
                f" within {timeout:g} s of its crash"
            )
        session.consume()  # the server's last word (57P01), if it sent one: parsing it
        session.pgconn.is_busy()  # hands an idle connection's error to the notice handler
        libpq = "connection closed by pgrace (crash)" if active.step.crash == "disconnect" else ""
        session.lose(active, None, libpq)
        return Outcome()

    def _backend_gone(self, pid: int, timeout: float, idle: Callable[[], None]) -> bool:
        """Wait (bounded) until a backend has exited: its locks are released before it leaves pg_stat_activity."""
        deadline = time.perf_counter() + timeout
        pause = 0.001
        while time.perf_counter() < deadline:
            if self.control.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() is None:
                return True
            time.sleep(pause)  # polling a condition the server offers no notification for
            pause = min(pause * 2, 0.02)
            idle()
        return False
