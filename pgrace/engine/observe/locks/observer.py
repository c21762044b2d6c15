"""The observer connection and the sessions it watches: blocked or not, by whom, in which state."""

from __future__ import annotations

from typing import Any, Literal

import psycopg

from pgrace.engine.observe.locks.queries import BLOCKED_QUERY, BLOCKING_QUERY


class SessionObserver:
    """Backend pids named as the scenario's sessions, and the server's verdict on who blocks whom."""

    def __init__(self, observer: psycopg.Connection[Any], sessions: dict[int, str], schema: str | None = None) -> None:
        self.schema = schema  # only this schema's tables are read (a scratch schema in a user's database)
        self._advisory_levels: dict[tuple[int, tuple[int, ...], bool], Literal["session", "transaction"]] = {}
        self.observer = observer
        self.set_sessions(sessions)
        self.pgconn = observer.pgconn
        self.pgconn.prepare(b"pgrace_is_blocked", BLOCKED_QUERY.encode())

    def set_sessions(self, sessions: dict[int, str]) -> None:
        """Backend pid -> session name; replaced when a lost session is reconnected.

        A terminated session's pid may stay in the list meanwhile: the blocking probe
        and ``pg_blocking_pids`` simply find no process for it.
        """
        self.sessions = sessions
        self.pid_array = "{" + ",".join(str(pid) for pid in sessions) + "}"

    def name_of(self, pid: int) -> str:
        return self.sessions.get(pid, f"pid {pid}")

    def states(self, pids: list[int]) -> dict[int, str]:
        """``pg_stat_activity.state`` of these backends ("idle in transaction", "active", ...)."""
        if not pids:
            return {}
        rows = self.observer.execute(
            "SELECT pid, state FROM pg_catalog.pg_stat_activity WHERE pid = ANY(%s)", (pids,)
        ).fetchall()
        return {pid: state or "" for pid, state in rows}

    def _who(self, pid: int) -> str:
        return self.sessions.get(pid, "another backend")

    def _relation_name(self, oid: int) -> str:
        """The table's name (an oid, unlike a name, changes from run to run)."""
        row = self.observer.execute("SELECT %s::oid::regclass::text", (oid,)).fetchone()
        return str(row[0]) if row else "an unknown table"

    def is_blocked(self, pid: int) -> bool:
        """The server's own verdict, restricted to this scenario's sessions (as isolationtester)."""
        result = self.pgconn.exec_prepared(b"pgrace_is_blocked", [str(pid).encode(), self.pid_array.encode()])
        value = result.get_value(0, 0) if result.ntuples else None
        if value is None:
            message = result.get_error_message() or "probe returned nothing"
            raise psycopg.OperationalError(message)
        return value == b"t"

    def blocking_graph(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Who waits on whom right now, among the sessions (for timeout diagnoses)."""
        rows = self.observer.execute(
            BLOCKING_QUERY,
            (list(self.sessions),),
        ).fetchall()
        return tuple(
            (self.name_of(pid), tuple(self.name_of(b) for b in blockers)) for pid, blockers in rows if blockers
        )
