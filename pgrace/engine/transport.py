"""What a session transport adds to the one scheduler: how it waits, and the steps it runs itself.

The :class:`~pgrace.engine.scheduler.Scheduler` is written once; each transport hands it a
:class:`Transport`: its :class:`~pgrace.engine.waiting.Waiting` strategy, and hooks the
scheduler calls at fixed points (a step about to be sent, other sessions that spoke while
one runs, a step reported, a release by a session the server terminated). A scenario's
libpq sessions fill them in (sleeps, crashes, sessions the server ended, the sockets to
watch: :class:`pgrace.engine.libpq.transport.LibpqTransport`); a transport with nothing of
its own to add is a :class:`Plain` one (the application's threads).

While a hook works it may hand steps back to the scheduler, through :class:`LaunchedSteps`: it
reads the scheduler's state there and never writes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import psycopg

    from pgrace.engine.session import LiveSession
    from pgrace.engine.steps import Active
    from pgrace.engine.waiting import Waiting
    from pgrace.model.timeline import Outcome, Release


class LaunchedSteps(Protocol):
    """The scheduler's launched steps, as a transport's hook may see and end them."""

    @property
    def last_done(self) -> int:
        """The step reported done most recently."""
        ...

    def is_pending(self, active: Active) -> bool:
        """Whether ``active`` is pending: launched, not reported."""
        ...

    def collect(self, session: LiveSession, active: Active) -> None:
        """Collect a step's results that are in (it is not reported yet)."""
        ...

    def report_unless_held(self, session: LiveSession, active: Active) -> None:
        """A collected waiting step: reported now, with the locks then, unless a completion marker holds it."""
        ...

    def idle(self) -> None:
        """Let a presenter redraw while the hook waits."""
        ...


class Transport(Protocol):
    """A transport's part in scheduling: its waiting strategy and its hooks."""

    @property
    def waiting(self) -> Waiting[Any]: ...

    def quoting(self, session: LiveSession) -> psycopg.Connection[Any] | None:
        """The connection that quotes the values of a step's ``:variables``; None: steps are sent as written."""
        ...

    def run_own(self, session: LiveSession, active: Active, launched: LaunchedSteps) -> Outcome | None:
        """Run a step that is the transport's own (a sleep, a crash): its outcome; None when it is SQL to send."""
        ...

    def others_ended(self, running: Active, others: list[Any], launched: LaunchedSteps) -> bool:
        """Other sessions spoke while ``running`` runs: True when told here, False when the scheduler decides."""
        ...

    def step_reported(self, last_done: int) -> None:
        """After each reported step: what the transport finds meanwhile (a session the server ended)."""
        ...

    def release_of(self, release: Release, own: str, last_done: int) -> Release:
        """A release as the transport knows it: a session terminated outside the scenario gets the server's reason."""
        ...


class Plain:
    """A transport with nothing of its own: its steps are SQL as written, its sessions watched by ``waiting``."""

    def __init__(self, waiting: Waiting[Any]) -> None:
        self.waiting = waiting

    def quoting(self, session: LiveSession) -> psycopg.Connection[Any] | None:
        return None

    def run_own(self, session: LiveSession, active: Active, launched: LaunchedSteps) -> Outcome | None:
        return None

    def others_ended(self, running: Active, others: list[Any], launched: LaunchedSteps) -> bool:
        return False

    def step_reported(self, last_done: int) -> None:
        return None

    def release_of(self, release: Release, own: str, last_done: int) -> Release:
        return release
