"""pgrace's connections for one run, whatever the transport: control, the sessions', the observer and its inspector.

They are opened at once (each is a round trip or three and a backend's start) and closed
together, on every exit. How one is opened (where it lands, as whom, with which options)
is the transport's :data:`Opener`; what the observer is set to is the same for all: it
gives up on a lock after 200 ms, and plans its catalog questions once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import psycopg

from pgrace.engine.observe.locks import LockInspector
from pgrace.engine.sqlerrors import first_line
from pgrace.errors import RunAborted

# Open one connection: its application_name, and whether it is the observer.
Opener = Callable[[str, bool], psycopg.Connection[Any]]


class RunConnections:
    """The control connection, one per session (``sessions``: name -> application_name), the observer.

    Use as a context manager: entered, every connection is open and ``inspector`` reads
    the sessions' backends; left, every one is closed, including those :meth:`connect` opened.
    """

    def __init__(
        self,
        opener: Opener,
        control: str,
        observer: str,
        sessions: Mapping[str, str] | None = None,
        schema: str | None = None,
    ) -> None:
        self.opener = opener
        self.names = (control, *(sessions or {}).values(), observer)
        self.session_names = tuple(sessions or {})
        self.schema = schema  # a scratch schema in the user's database: the inspector reads only its tables
        self.stack = ExitStack()

    def __enter__(self) -> RunConnections:
        try:
            control, *conns, observer = self._open_all()
            self.control = control
            self.sessions = dict(zip(self.session_names, conns, strict=True))
            observer.execute("SET lock_timeout = '200ms'")
            observer.prepare_threshold = 0  # it asks the same catalog questions after every step: plan them once
            self.observer = observer
            pids = {conn.pgconn.backend_pid: name for name, conn in self.sessions.items()}
            self.inspector = LockInspector(observer, pids, self.schema)
        except psycopg.Error as exc:  # e.g. a connection ended by someone else while it was being set up
            self.stack.close()
            raise RunAborted(f"could not set up pgrace's connections: {first_line(str(exc))}") from None
        except BaseException:
            self.stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def connect(self, application_name: str, observer: bool = False) -> psycopg.Connection[Any]:
        """One more connection of the run (a lost session's, the control connection again), closed with the rest."""
        conn = self.opener(application_name, observer)
        self.stack.callback(conn.close)
        return conn

    def _open_all(self) -> list[psycopg.Connection[Any]]:
        """Every connection, opened at once; the first failure, in the order named, is raised."""
        last = len(self.names) - 1
        with ThreadPoolExecutor(max_workers=len(self.names), thread_name_prefix="pgrace connect") as pool:
            futures = [pool.submit(self.opener, name, i == last) for i, name in enumerate(self.names)]
        opened = []
        failure: BaseException | None = None
        for future in futures:
            if (exc := future.exception()) is not None:
                failure = failure or exc
                continue
            conn = future.result()
            self.stack.callback(conn.close)
            opened.append(conn)
        if failure is not None:
            raise failure
        return opened
