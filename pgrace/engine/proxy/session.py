"""The proxy transport: each client connection is a session of the one scheduler, held at each statement.

The relay (:mod:`pgrace.engine.proxy.relay`) calls :class:`ProxyHooks` from its threads, one per
client connection. A connection's thread that has a statement parks in :meth:`ProxyHooks.ready`
at its :class:`~pgrace.engine.threads.Gate`, as an application's thread parks in psycopg: the
scheduler lets it go, waits for it on the gate (:class:`~pgrace.engine.waiting.GateWaiting`),
sees it blocked on the server by its backend pid, cancels it at the step timeout, and records
the same events as every run. :class:`ProxySession` is that connection as the scheduler sees it.

A connection is named by its ``application_name`` when the client set one, else ``NAME#N``:
the ``--exec`` command's name and the order in which that command's processes opened it.
Pooled connections are sessions like any other: an idle one beside a parked one is the
client's turn, settled when its process is provably waiting (:func:`~pgrace.engine.proxy.processes.quiet`);
only connections that send a statement become steps.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from psycopg import pq

from pgrace.engine.proxy.processes import SELECTOR_WAITS, Actor
from pgrace.engine.proxy.relay import Refused
from pgrace.engine.sqlerrors import cancelled_by_pgrace
from pgrace.engine.threads.session import Gate, Request, release_held
from pgrace.model.timeline import Outcome, ResultSet, SessionLost, SqlError
from pgrace.text import visible

if TYPE_CHECKING:
    from pgrace.engine.proxy.relay import Client, Reply, Statement
    from pgrace.engine.session import Inspector
    from pgrace.engine.steps import Active, Recorder
    from pgrace.model.variables import Value

_STATUS = {b"I": pq.TransactionStatus.IDLE, b"T": pq.TransactionStatus.INTRANS, b"E": pq.TransactionStatus.INERROR}
SHOWN_PARAMS = 20  # bound parameters shown after a statement's text
#: A Sync or a Flush sent alone (psycopg's pipeline sends both as it ends) runs no SQL: its text is an SQL comment
#: that names it, so the reduction reads it as a step with no statement, not as one it cannot read.
ALONE = {b"S\x00\x00\x00\x04": "-- Sync", b"H\x00\x00\x00\x04": "-- Flush"}


class ProxySession:
    """One client connection as the scheduler sees it (:class:`~pgrace.engine.session.LiveSession`)."""

    lost: SessionLost | None = None  # a client connection is the client's: pgrace never loses it
    ended: SessionLost | None = None

    def __init__(
        self,
        name: str,
        client: Client,
        gate: Gate,
        owner: Actor | None,
        cancel: Callable[[int], None],
        step_timeout: float,
    ) -> None:
        self.name = name
        self.step_timeout = step_timeout
        self.client = client
        self.pid = client.backend_pid
        self.gate = gate
        self.owner = owner  # the --exec command whose process opened it (None: not one of them)
        self.relay_tid: int | None = None  # the relay thread serving it (its own waits are read in /proc)
        self.status = pq.TransactionStatus.IDLE
        self._cancel = cancel
        self.active: Active | None = None
        self.last_seq = 0
        self.notices = 0
        self.variables: dict[str, Value] = {}
        self.attempts: dict[str, int] = {}

    @property
    def busy(self) -> bool:
        return self.active is not None

    def transaction_status(self) -> pq.TransactionStatus:
        return self.status

    def send(self, text: str, active: Active) -> Outcome | None:
        """Let the statement held in the relay go upstream."""
        self.gate.permit()
        return None

    def collect(self, active: Active) -> tuple[Outcome, str | None]:
        """The statement's outcome as the relay saw it; pgrace's cancel says so."""
        with self.gate.cond:
            assert self.gate.finished is not None
            outcome, self.status = self.gate.finished
        if active.cancelled:
            outcome = cancelled_by_pgrace(outcome, f"the step timeout {self.step_timeout:g} s")
        return outcome, None

    def ended_status(self, active: Active) -> tuple[bool, pq.TransactionStatus]:
        with self.gate.cond:
            assert self.gate.finished is not None
            return False, self.gate.finished[1]

    def heard(self, recorder: Recorder, inspector: Inspector) -> None:
        with self.gate.cond:
            self.gate.finished = None

    def cancel(self) -> None:
        self._cancel(self.pid)

    def lose(self, active: Active, received: SqlError | None, libpq: str) -> SqlError:
        raise AssertionError("a proxy session's connection is never sent on by the scheduler")


def shown(statement: Statement) -> str:
    """A step's text: the SQL as sent, then its bound parameters as the client sent them."""
    text = statement.sql.strip() or ALONE.get(statement.data) or f"({statement.kind})"
    if statement.params:
        values = ", ".join("NULL" if p is None else repr(p) for p in statement.params[:SHOWN_PARAMS])
        more = ", …" if len(statement.params) > SHOWN_PARAMS else ""
        text = f"{text} -- ({values}{more})"
    return visible(text)


def outcome_of(reply: Reply) -> Outcome:
    """The step's outcome from the relay's reply: rows (text), command tags, the server's error as data."""
    results: tuple[ResultSet, ...] = ()
    tags = tuple(reply.tags)
    if reply.columns:
        results = (ResultSet(tuple(reply.columns), tuple(reply.rows), (), tags[-1] if tags else ""),)
    error = None
    if reply.error is not None:
        fields = reply.error
        error = SqlError(
            fields.get("C", "XX000"), fields.get("M", ""), fields.get("V", fields.get("S", "ERROR")), fields.get("D")
        )
    return Outcome(results, tags, error)


class ProxyHooks:
    """The relay's :class:`~pgrace.engine.proxy.relay.Hooks`: client connections become gated sessions.

    Every field is guarded by ``cond``, the scheduler's condition. ``commands`` are this run's
    started ``--exec`` processes; a connection from one of their process trees is theirs.
    """

    def __init__(self, cond: threading.Condition, cancel: Callable[[int], None], step_timeout: float) -> None:
        self.cond = cond
        self.cancel = cancel
        self.step_timeout = step_timeout
        self.commands: list[Actor] = []
        self.sessions: dict[str, ProxySession] = {}  # this run's, by name, in the order they opened
        self.by_number: dict[int, ProxySession] = {}
        self.fresh: list[ProxySession] = []  # opened since the scheduler last looked
        self.stopping = False
        self.strays: list[str] = []  # connections after the run ended, or before it began

    def begin(self, commands: list[Actor]) -> None:
        with self.cond:
            self.commands, self.sessions, self.by_number, self.fresh = commands, {}, {}, []
            self.stopping = False

    def stop(self) -> None:
        """The run is over: held statements are refused, their connections end.

        Called where the calling thread is in no ``with self.cond`` block: what it holds of the lock then, a
        Ctrl-C left (:func:`release_held`), is given up, or the relay threads the cleanup joins would wait for it.
        """
        release_held(self.cond)
        with self.cond:
            self.stopping = True
            for session in self.sessions.values():
                session.gate.stopping = True
            self.cond.notify_all()

    # -- called from the relay's threads ---------------------------------------------------

    def opened(self, client: Client) -> None:
        with self.cond:
            owner = next((a for a in self.commands if a.owns(client.peer_pid, client.application_name)), None)
            name = self._name(client, owner)
            session = ProxySession(name, client, Gate(name, self.cond), owner, self.cancel, self.step_timeout)
            session.relay_tid = threading.get_native_id()
            session.gate.since = time.perf_counter()
            if self.stopping:
                session.gate.stopping = True
            self.sessions[name] = session
            self.by_number[client.number] = session
            self.fresh.append(session)
            self.cond.notify_all()

    def ready(self, client: Client, statement: Statement) -> None:
        with self.cond:
            session = self.by_number.get(client.number)
            if session is None:  # opened in an earlier run, or after this one ended
                raise Refused("pgrace's run this connection belonged to has ended")
            gate = session.gate
            session.relay_tid = threading.get_native_id()
            owner = session.owner.name if session.owner is not None else "client"
            gate.request, gate.state, gate.since = (
                Request(shown(statement), f"({owner})", None, statement.prepares_only),
                "ready",
                time.perf_counter(),
            )
            self.cond.notify_all()
            while not gate.permitted and not gate.stopping:
                self.cond.wait()
            if gate.stopping and not gate.permitted:
                gate.state = "done"
                self.cond.notify_all()
                raise Refused(f"the run ended while session {session.name}'s statement was held")
            gate.permitted = False

    def done(self, client: Client, statement: Statement, reply: Reply) -> None:
        with self.cond:
            session = self.by_number.get(client.number)
            if session is None:
                return
            gate = session.gate
            status = _STATUS.get(reply.status or b"", session.status)
            gate.finished = (outcome_of(reply), status)
            gate.state, gate.since = "python", time.perf_counter()
            self.cond.notify_all()

    def closed(self, client: Client, why: str | None) -> None:
        with self.cond:
            session = self.by_number.get(client.number)
            if session is None:
                return
            gate = session.gate
            if gate.state == "running" and gate.finished is None:  # the client left while its statement ran
                error = SqlError("08006", why or "the client closed the connection during the statement")
                gate.finished = (Outcome(error=error), pq.TransactionStatus.IDLE)
            gate.state, gate.since = "done", time.perf_counter()
            self.cond.notify_all()

    # -- naming -----------------------------------------------------------------------------

    def _name(self, client: Client, owner: Actor | None) -> str:
        wanted = (client.application_name or "").strip()
        if wanted in DRIVER_DEFAULT_NAMES:
            wanted = ""
        if not wanted:
            prefix = owner.name if owner is not None else "client"
            if owner is not None:
                owner.opened += 1
                wanted = f"{prefix}#{owner.opened}"
            else:
                wanted = f"{prefix}#{client.number}"
        name, k = wanted, 1
        while name in self.sessions:
            k += 1
            name = f"{wanted}#{k}"
        return name


DRIVER_DEFAULT_NAMES = frozenset({"PostgreSQL JDBC Driver"})
"""``application_name`` values a driver sends for every connection unless told otherwise (pgjdbc's, in its
start-up when ``assumeMinServerVersion`` allows): they name no one, and taken as names they would follow which
command connected first, so a connection that sends one is named as one that sends none (``alice#1``)."""


def relay_asleep(tid: int | None) -> bool:
    """Whether pgrace's own relay thread for a connection waits for input: no client bytes are being read."""
    if tid is None:
        return False
    try:
        with open(f"/proc/{os.getpid()}/task/{tid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{os.getpid()}/task/{tid}/syscall") as f:
            call = f.read().split()[0]
    except (OSError, IndexError):
        return True  # the thread is gone: it reads nothing more
    # Asleep in its selector, not on a lock or Python's GIL: a relay thread that waits for one of those is
    # about to go on (with a statement the client sent, or the start-up's last bytes to send).
    return state == "S" and call.isdigit() and int(call) in SELECTOR_WAITS
