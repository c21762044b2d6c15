"""What the scheduler needs of a session at run time (a :class:`LiveSession`), whatever carries its statements.

As psycopg keeps its protocol (``psycopg/generators.py``) apart from how it waits
(``psycopg/waiting.py``), the one :class:`~pgrace.engine.scheduler.Scheduler` is written
over this protocol, and each transport brings its own way to wait
(:mod:`pgrace.engine.waiting`):

* :class:`pgrace.engine.libpq.session.LibpqSession`: a scenario's session, a raw libpq connection
  the scheduler sends each step on and selects on;
* :class:`pgrace.engine.threads.session.ThreadSession`: the application's code, a thread parked at
  each statement until the scheduler lets it go, waited for on a condition.

What the scheduler asks the server about its sessions is an :class:`Inspector`:
:class:`~pgrace.engine.observe.locks.LockInspector` answers from ``pg_locks`` on the
observer connection; a test of the scheduler alone may answer from a script.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from psycopg import pq

if TYPE_CHECKING:
    import psycopg

    from pgrace.engine.observe.locks import LockSnapshot
    from pgrace.engine.steps import Active, Graph, Recorder
    from pgrace.model.timeline import HeldLock, Outcome, SessionLost, SqlError, Wait
    from pgrace.model.variables import Value


class Inspector(Protocol):
    """What the scheduler and its step book ask about the sessions' backends, by pid."""

    sessions: dict[int, str]  # backend pid -> session name
    observer: psycopg.Connection[Any]  # read for footprints (explore's reduction) only

    def name_of(self, pid: int) -> str: ...

    def states(self, pids: list[int]) -> dict[int, str]:
        """``pg_stat_activity.state`` of those backends still there."""
        ...

    def is_blocked(self, pid: int) -> bool:
        """The server's verdict: the backend waits for another session of the scenario."""
        ...

    def describe_waits(self, pid: int) -> tuple[Wait, ...]: ...

    def blocking_graph(self) -> Graph: ...

    def deadlock_cycle(self, detail: str) -> tuple[str, ...]: ...

    def row_locks(self) -> LockSnapshot: ...

    def other_locks(self) -> tuple[HeldLock, ...]: ...


class LiveSession(Protocol):
    """One session of a run: its step, its backend, a way to send, collect and cancel a statement."""

    name: str
    active: Active | None  # its step not reported yet
    last_seq: int  # its latest step
    notices: int  # notices received so far (completion markers count them)
    variables: dict[str, Value]  # what its steps captured
    attempts: dict[str, int]  # a retry loop -> the attempt of it to run now
    lost: SessionLost | None  # its connection is gone: its later steps are not sent
    ended: SessionLost | None  # the server ended it while idle

    @property
    def pid(self) -> int:
        """The backend's pid: what the observer asks ``pg_locks`` and ``pg_blocking_pids`` about."""
        ...

    @property
    def busy(self) -> bool:
        """A step of it has not been reported yet."""
        ...

    def transaction_status(self) -> pq.TransactionStatus:
        """libpq's view of the session's transaction (before and after a step: did it end one?)."""
        ...

    def send(self, text: str, active: Active) -> Outcome | None:
        """Let the step's statement go; its outcome at once when it cannot be sent."""
        ...

    def collect(self, active: Active) -> tuple[Outcome, str | None]:
        """The finished statement's outcome, and a deadlock's DETAIL when it was the victim."""
        ...

    def ended_status(self, active: Active) -> tuple[bool, pq.TransactionStatus]:
        """Whether the step ended the session, and the transaction state it left."""
        ...

    def heard(self, recorder: Recorder, inspector: Inspector) -> None:
        """After the step's report: what the server sent since (notifications)."""
        ...

    def cancel(self) -> None:
        """Ask the server to cancel the running statement; nothing when the session has died meanwhile."""
        ...

    def lose(self, active: Active, received: SqlError | None, libpq: str) -> SqlError:
        """The session's connection is gone: why, noted once."""
        ...
