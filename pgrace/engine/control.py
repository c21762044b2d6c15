"""pgrace's own SQL (setup, teardown, final checks, resets): sent, waited for, bounded, cancellable.

Every driver runs its control SQL here: a scenario's runner, a code run, ``pgrace load``
and ``pgrace matrix``. The SQL is sent asynchronously and waited for with ``select``, so
Ctrl-C and SIGTERM are answered at once, and a statement still running after the step
timeout (say a teardown's DROP waiting on a session left inside a transaction, or a setup
waiting on a lock someone else holds) is cancelled, as a step would be; the error then
says pgrace cancelled it. PQexec's semantics: only the last result of a block is kept.
"""

from __future__ import annotations

import dataclasses
import re
import select
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any, TypeVar

import psycopg
from psycopg import pq

from pgrace.engine.results import result_set
from pgrace.engine.sqlerrors import cancelled_by_pgrace, first_line, result_error
from pgrace.errors import RunAborted, ScenarioError, SetupFailed, StepsStuck
from pgrace.model.timeline import Outcome

CONTROL = "pgrace's control connection"
# What a setup leaves on its connection beyond the data: lost with the control connection.
SESSION_STATE = re.compile(
    r"(^|;)\s*(SET|RESET|PREPARE|LISTEN|DECLARE)\b|\b(set_config|TEMP|TEMPORARY|pg_advisory_lock\w*)\b", re.IGNORECASE
)
T = TypeVar("T")


def _aborted(where: str, detail: str) -> Exception:
    return RunAborted(f"{where} was lost during the run ({detail})")


def _stuck(message: str) -> Exception:
    return StepsStuck(message)


def _nothing() -> None:
    return None


@dataclasses.dataclass
class ControlSql:
    """Runs control SQL on a connection, cutting it at ``step_timeout`` (``timeout_name`` says which knob).

    ``aborted(where, detail)``: the error for a connection lost meanwhile; ``stuck``: for SQL
    that outlives its cancel; ``idle``: called while waiting (a presenter redraws).
    """

    step_timeout: float
    timeout_name: str = "--step-timeout"
    idle: Callable[[], None] = _nothing
    aborted: Callable[[str, str], Exception] = _aborted
    stuck: Callable[[str], Exception] = _stuck

    def execute(self, pgconn: pq.abc.PGconn, text: str, where: str = "pgrace's control connection") -> Outcome:
        """The last result of ``text`` as an Outcome (an error is data); a lost connection raises ``aborted``."""
        return self.outcome(*self.result(pgconn, text, where))

    def execute_all(self, batch: Sequence[tuple[pq.abc.PGconn, str, str]]) -> list[Outcome]:
        """Each ``(pgconn, text, where)`` of ``batch`` (on different connections) at once: one round trip for all.

        Each is bounded by the step timeout from its own send, as :meth:`execute`; the
        outcomes come in ``batch``'s order.
        """
        sent = [self._send(pgconn, text, where) for pgconn, text, where in batch]
        return [
            self.outcome(*self._collect(pgconn, text, where, started))
            for (pgconn, text, where), started in zip(batch, sent, strict=True)
        ]

    def outcome(self, res: pq.abc.PGresult, cancelled: bool) -> Outcome:
        """A raw result as an Outcome; an error pgrace cancelled at the timeout says so."""
        if res.status in (pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.NONFATAL_ERROR):
            failed = Outcome(error=result_error(res))
            return cancelled_by_pgrace(failed, f"{self.timeout_name} {self.step_timeout:g} s") if cancelled else failed
        if res.status == pq.ExecStatus.TUPLES_OK:
            return Outcome((result_set(res),))
        return Outcome(commands=((res.command_status or b"").decode(),))

    def result(
        self, pgconn: pq.abc.PGconn, text: str, where: str = "pgrace's control connection"
    ) -> tuple[pq.abc.PGresult, bool]:
        """The last raw result of ``text``, and whether pgrace cancelled it at the timeout."""
        return self._collect(pgconn, text, where, self._send(pgconn, text, where))

    def _send(self, pgconn: pq.abc.PGconn, text: str, where: str) -> float:
        """Send ``text``; when it was sent (its timeout counts from there)."""
        try:
            pgconn.send_query(text.encode())
            while pgconn.flush():
                select.select([], [pgconn.socket], [], 0.1)
        except psycopg.OperationalError as exc:
            raise self.aborted(where, first_line(str(exc))) from None
        return time.perf_counter()

    def _collect(self, pgconn: pq.abc.PGconn, text: str, where: str, started: float) -> tuple[pq.abc.PGresult, bool]:
        try:
            cancelled = self._await_idle(pgconn, text, started)
        except psycopg.OperationalError as exc:
            raise self.aborted(where, first_line(str(exc))) from None
        res: pq.abc.PGresult | None = None
        while (latest := pgconn.get_result()) is not None:
            res = latest
            if latest.status in (pq.ExecStatus.COPY_IN, pq.ExecStatus.COPY_OUT, pq.ExecStatus.COPY_BOTH):
                break  # as PQexec: COPY ... STDIN/STDOUT has nobody to talk to here
        if pgconn.status == pq.ConnStatus.BAD or res is None:
            server_said = res.error_field(pq.DiagnosticField.MESSAGE_PRIMARY) if res is not None else None
            detail = server_said.decode("utf-8", "replace") if server_said else pgconn.get_error_message()
            raise self.aborted(where, first_line(detail))
        return res, cancelled

    def _await_idle(self, pgconn: pq.abc.PGconn, text: str, started: float) -> bool:
        """Wait until the connection's results are all in; cancel once at the step timeout.

        Returns whether pgrace cancelled the statement. A statement that outlives its
        cancel by twice the timeout again leaves the connection unusable: that ends the run.
        """
        cancelled = False
        while pgconn.is_busy():
            readable, _, _ = select.select([pgconn.socket], [], [], 0.05)
            if readable:
                pgconn.consume_input()
                continue
            self.idle()
            elapsed = time.perf_counter() - started
            if not cancelled and elapsed >= self.step_timeout:
                pgconn.get_cancel().cancel()
                cancelled = True
            elif cancelled and elapsed >= 3 * self.step_timeout:
                raise self.stuck(f"SQL did not finish even after it was cancelled: {first_line(text)}")
        return cancelled

    def check(self, pgconn: pq.abc.PGconn, text: str, where: str = "pgrace's control connection") -> Outcome:
        """As :meth:`execute`, for SQL that must succeed: its error raises RunAborted with the server's words."""
        outcome = self.execute(pgconn, text, where)
        if outcome.error is not None:
            raise RunAborted(f"{where}: {outcome.error.severity}:  {outcome.error.message}")
        return outcome


class ControlLost(RunAborted):
    """The control connection alone was lost (the server is up): it can be opened again."""


class ControlLink:
    """pgrace's control connection, opened again when a step ended it.

    It runs as the scenario's role, so a step can end it (``pg_terminate_backend`` over
    ``pg_stat_activity``). It holds nothing of the scenario's: what the setup ran on it is
    done. Settings the setup made would go with it, so a setup that makes any (SET,
    set_config, a temporary table, a session advisory lock) stops the run instead, saying why.
    ``on_new`` hears of each new connection (a crash step terminates sessions from it).
    """

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        connect: Callable[[], psycopg.Connection[Any]],
        setup: Sequence[str],
        source: str,
    ) -> None:
        self.conn = conn
        self._connect = connect
        self._keeps_settings = any(SESSION_STATE.search(text) for text in setup)
        self._source = source
        self.on_new: Callable[[psycopg.Connection[Any]], None] = lambda conn: None

    def live(self) -> psycopg.Connection[Any]:
        """The connection, opened again if it was ended since its last use."""
        pgconn = self.conn.pgconn
        with suppress(psycopg.Error):  # a closed socket: the status below says so
            pgconn.consume_input()
        if pgconn.status == pq.ConnStatus.OK:
            return self.conn
        return self.reopen(pgconn.error_message.decode(errors="replace"))

    def reopen(self, why: str) -> psycopg.Connection[Any]:
        if self._keeps_settings:
            raise ScenarioError(
                f"a step ended pgrace's control connection ({first_line(why) or 'terminated'}), and the setup's"
                " session settings went with it; leave the connections named 'pgrace/.../control connection' alone",
                self._source,
            )
        self.conn = self._connect()
        self.on_new(self.conn)
        return self.conn

    def call(self, send: Callable[[pq.abc.PGconn], T]) -> T:
        """``send`` on the live connection; once more on a new one if it turns out lost meanwhile."""
        try:
            return send(self.live().pgconn)
        except ControlLost as lost:
            return send(self.reopen(str(lost)).pgconn)


def setup_failed(where: str, outcome: Outcome, source: str, line: int | None) -> SetupFailed:
    """A setup's error as every driver tells it: the server's words, and whether pgrace cancelled it."""
    error = outcome.error
    assert error is not None, "a setup that failed"
    cancelled = f" ({error.detail})" if error.detail and error.detail.startswith("pgrace cancelled") else ""
    return SetupFailed(f"{where} failed: {error.severity}:  {error.message}{cancelled}", source, line)
