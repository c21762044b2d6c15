"""The libpq transport: a scenario session is a raw libpq connection its steps are sent on, asynchronously.

A step is sent with ``PQsendQuery`` and waited for with ``select`` on the connection's
socket (the scheduler's waiting strategy, :mod:`pgrace.engine.scheduler`); this module
holds what belongs to one connection: its notices, its results, and the loss of it.
"""

from __future__ import annotations

import dataclasses
import select
from collections.abc import Iterable
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import pq

from pgrace.engine.results import result_set
from pgrace.engine.sqlerrors import field as diag_field
from pgrace.engine.sqlerrors import first_line, raw_message, result_error
from pgrace.engine.steps import Active
from pgrace.model.timeline import NoticeReceived, NotifyReceived, Outcome, ResultSet, SessionLost, SqlError
from pgrace.model.variables import Value

if TYPE_CHECKING:
    from pgrace.engine.session import Inspector
    from pgrace.engine.steps import Recorder


class LibpqSession:
    """One scenario session: a raw libpq connection driven asynchronously."""

    def __init__(self, name: str, conn: psycopg.Connection[Any], recorder: Recorder) -> None:
        self.name = name
        self.notices = 0
        self.active: Active | None = None
        self.last_seq = 0  # its latest step, the one a loss found while idle is told with
        self.variables: dict[str, Value] = {}  # what its steps captured, by variable name
        self.attempts: dict[str, int] = {}  # a retry loop (its last step) -> the attempt of it to run now
        self._recorder = recorder
        self.attach(conn)

    def attach(self, conn: psycopg.Connection[Any]) -> None:
        """Use ``conn`` from now on (a new session, or a lost one reconnected)."""
        self.conn = conn
        self.pgconn = conn.pgconn
        self.pid = self.pgconn.backend_pid
        self.pgconn.notice_handler = self._on_notice
        self.lost: SessionLost | None = None
        self.ended: SessionLost | None = None  # the server ended it while idle: told then, found by its next step
        self.fatal: SqlError | None = None  # why the server said it would close the connection

    def _on_notice(self, res: pq.abc.PGresult) -> None:
        severity = diag_field(res, pq.DiagnosticField.SEVERITY_NONLOCALIZED) or "NOTICE"
        if severity in ("FATAL", "PANIC") or diag_field(res, pq.DiagnosticField.SQLSTATE).startswith("57"):
            # libpq hands an error that arrives while the connection is idle to the
            # notice processor: the server telling us why it is about to hang up.
            self.fatal = self.fatal or result_error(res)
            if severity in ("FATAL", "PANIC"):
                return  # reported with the loss of the connection, not as a notice
        self.notices += 1
        self._recorder.add(
            NoticeReceived(
                self.name,
                severity,
                diag_field(res, pq.DiagnosticField.MESSAGE_PRIMARY),
                diag_field(res, pq.DiagnosticField.SQLSTATE),
                self._recorder.now(),
            )
        )

    @property
    def busy(self) -> bool:
        return self.active is not None

    def transaction_status(self) -> pq.TransactionStatus:
        return pq.TransactionStatus(self.pgconn.transaction_status)

    def cancel(self) -> None:
        with suppress(psycopg.OperationalError):  # the session may have died meanwhile: nothing to cancel
            self.pgconn.get_cancel().cancel()

    def consume(self) -> None:
        with suppress(psycopg.OperationalError):  # collecting the result reports a broken connection
            self.pgconn.consume_input()

    def send(self, text: str, active: Active) -> Outcome | None:
        """Send a step's SQL; the outcome at once when the connection turns out lost."""
        try:
            self.pgconn.send_query(text.encode())
            while self.pgconn.flush():
                select.select([], [self.pgconn.socket], [], 0.01)
        except psycopg.OperationalError:
            return Outcome(error=self.lose(active, None, raw_message(self.pgconn.error_message)))
        return None

    def collect(self, active: Active) -> tuple[Outcome, str | None]:
        """Every result of the step, and a deadlock's DETAIL when it was the victim (for its cycle).

        A lost connection ends it with the server's FATAL, if one came.
        """
        pgconn = self.pgconn
        results: list[ResultSet] = []
        commands: list[str] = []
        error: SqlError | None = None
        libpq = ""  # libpq's own error text, whole: it has no SQLSTATE
        while (res := pgconn.get_result()) is not None:
            status = res.status
            if status == pq.ExecStatus.TUPLES_OK:
                results.append(result_set(res))
            elif status == pq.ExecStatus.COMMAND_OK:
                commands.append((res.command_status or b"").decode())
            elif status in (pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.NONFATAL_ERROR):
                if res.error_field(pq.DiagnosticField.SQLSTATE) is None:
                    libpq = libpq or raw_message(res.error_message)
                    error = error or result_error(res)
                else:
                    error = result_error(res)
            elif status != pq.ExecStatus.EMPTY_QUERY:
                error = SqlError("0A000", f"unexpected result status: PGRES_{pq.ExecStatus(status).name}", "ERROR")
        deadlock = None
        if pgconn.status == pq.ConnStatus.BAD:
            error = self.lose(active, error, libpq or raw_message(pgconn.error_message))
        elif error is not None and error.sqlstate == "40P01" and error.detail:
            deadlock = error.detail
        return Outcome(tuple(results), tuple(commands), error), deadlock

    def ended_status(self, active: Active) -> tuple[bool, pq.TransactionStatus]:
        """Whether the step ended the session, and the transaction state it left."""
        lost = active.lost is not None or self.pgconn.status == pq.ConnStatus.BAD
        return lost, pq.TransactionStatus(pq.TransactionStatus.UNKNOWN if lost else self.pgconn.transaction_status)

    def heard(self, recorder: Recorder, inspector: Inspector) -> None:
        """As isolationtester after a step's result: read what arrived since, and record its notifications."""
        self.consume()
        while (notify := self.pgconn.notifies()) is not None:
            pid = notify.be_pid
            sender = inspector.name_of(pid) if pid in inspector.sessions else f"PID {pid}"
            recorder.add(
                NotifyReceived(self.name, notify.relname.decode(), notify.extra.decode(), sender, recorder.now())
            )

    def lose(self, active: Active, received: SqlError | None, libpq: str) -> SqlError:
        """The session's connection is gone: why (the server's FATAL, else libpq's words), noted once.

        Never XX000: a lost connection is 08006 unless the server said more. libpq's own
        words (``libpq``, whole) are kept after the server's: isolationtester prints both.
        """
        if received is not None and received.severity in ("FATAL", "PANIC"):
            error = dataclasses.replace(received, libpq=libpq)
        elif self.fatal is not None:
            error = dataclasses.replace(self.fatal, severity="FATAL", libpq=libpq)
        else:
            said = first_line(libpq) or "connection to the server was lost"
            error = SqlError("08006", said, "FATAL", text=libpq, libpq=libpq)
        if self.lost is None and self.ended is not None:  # told already, when the server ended it
            self.lost = self.ended
        elif self.lost is None:
            self.lost = SessionLost(self.name, error.message, error.sqlstate, self._recorder.now(), active.seq)
            active.lost = self.lost
        return error


def sockets(sessions: Iterable[LibpqSession]) -> dict[int, LibpqSession]:
    """The sessions by their connection's socket, for select(); a lost connection has none."""
    found: dict[int, LibpqSession] = {}
    for session in sessions:
        with suppress(psycopg.OperationalError):
            found[session.pgconn.socket] = session
    return found
