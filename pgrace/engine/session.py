"""What the scheduler needs of a session, whatever carries its statements.

As psycopg keeps its protocol (``psycopg/generators.py``) apart from how it waits
(``psycopg/waiting.py``), the scheduler's bookkeeping (:class:`~pgrace.engine.steps.StepBook`)
is written once over this protocol, and each transport brings its own way to wait:

* :class:`pgrace.engine.libpq.LibpqSession`: a scenario's session, a raw libpq connection
  the scheduler sends each step on and ``select``s on;
* :class:`pgrace.engine.threads.ThreadSession`: the application's code, a thread parked at
  each statement until the scheduler lets it go, waited for on a condition.
"""

from __future__ import annotations

from typing import Protocol

from psycopg import pq


class Session(Protocol):
    """One session of a run: a name, a backend, a transaction state, a way to cancel its statement."""

    name: str

    @property
    def pid(self) -> int:
        """The backend's pid: what the observer asks ``pg_locks`` and ``pg_blocking_pids`` about."""
        ...

    def transaction_status(self) -> pq.TransactionStatus:
        """libpq's view of the session's transaction (before and after a step: did it end one?)."""
        ...

    def cancel(self) -> None:
        """Ask the server to cancel the running statement; nothing when the session has died meanwhile."""
        ...
