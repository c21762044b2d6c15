"""The libpq transport's part in scheduling: sockets to select on, sleeps, crashes, sessions the server ended."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from pgrace.engine.libpq.own_steps import OwnSteps
from pgrace.engine.libpq.waiting import SocketWaiting
from pgrace.model.timeline import Outcome

if TYPE_CHECKING:
    import psycopg

    from pgrace.engine.session import LiveSession
    from pgrace.engine.steps import Active
    from pgrace.engine.transport import LaunchedSteps
    from pgrace.model.timeline import Release


class LibpqTransport:
    """A scenario's libpq sessions, as the scheduler's :class:`~pgrace.engine.transport.Transport`.

    ``isolationtester``: a spec's run, which keeps isolationtester's view: one socket
    watched at a time, in its slices, and a session the server ended found by its next step.
    """

    def __init__(self, own: OwnSteps, isolationtester: bool) -> None:
        self.sessions = own.sessions
        self.isolationtester = isolationtester
        self.own = own
        self.waiting = SocketWaiting(isolationtester, own.sessions)

    def use_control(self, control: psycopg.Connection[Any]) -> None:
        """The control connection was opened again (a step had ended it)."""
        self.own.use_control(control)

    def quoting(self, session: LiveSession) -> psycopg.Connection[Any] | None:
        return self.sessions[session.name].conn

    def run_own(self, session: LiveSession, active: Active, launched: LaunchedSteps) -> Outcome | None:
        step = active.step
        if step.sleep is not None:
            self.own.sleep(step.sleep, launched)
            return Outcome()
        if step.crash is not None:
            self.own.crashes.add(active.seq)  # what it releases, the scenario's own crash did: nothing to add
            return self.own.crash(self.sessions[session.name], active, launched.idle)
        return None

    def others_ended(self, running: Active, others: list[Any], launched: LaunchedSteps) -> bool:
        self.own.others_ended(running, others, launched)
        return True

    def step_reported(self, last_done: int) -> None:
        if not self.isolationtester:  # a spec keeps isolationtester's view: a loss shows later
            self.own.look_for_ended_idle(last_done)

    def release_of(self, release: Release, own: str, last_done: int) -> Release:
        holder = self.sessions.get(release.session or "") if release.cause == "terminated" else None
        if holder is not None and holder.name != own and release.seq not in self.own.crashes:
            self.own.found_ended_idle(holder, last_done)  # no step of the scenario did it: the server says what did
            if (why := holder.lost or holder.ended) is not None:
                release = dataclasses.replace(release, reason=f"{why.sqlstate}: {why.message}")
        return release
