"""Run the application's code: one set of connections on one database, the sessions run as often as asked.

Connections are opened by :func:`pgrace.scratch.connect`, as a scenario's; setup, the final
query, teardown and the reset between runs are control SQL (:class:`~pgrace.engine.control.ControlSql`,
bounded by the step timeout and cancellable), and a setup that fails is
:class:`~pgrace.errors.SetupFailed`, as a scenario's. Bad input is a
:class:`~pgrace.errors.CodeError` naming the function's ``file:line``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict

from pgrace import scratch
from pgrace.engine.connections import RunConnections
from pgrace.engine.control import ControlSql, setup_failed
from pgrace.engine.sqlerrors import first_line
from pgrace.engine.steps import Recorder, StepBook
from pgrace.engine.threads.frames import where_defined
from pgrace.engine.threads.order import Chooser, CodeOrder
from pgrace.engine.threads.session import (
    Gate,
    SessionCode,
    ThreadSession,
    TracedConnection,
    TracedCursor,
    TracedServerCursor,
    connections_guarded,
    release_held,
)
from pgrace.errors import CodeError, RunAborted, ScenarioFailed, StepsStuck
from pgrace.model.scenario import FinalCheck, PermutationStep, Scenario, Session, Step
from pgrace.model.timeline import CheckQueried, PermutationStarted, Run, SetupRan
from pgrace.scratch import schema_reset_sql
from pgrace.servers import ServerInfo

CODE_SCHEMA = "pgrace_code"


class CodeRunner:
    """One set of connections on one database; runs the sessions as many times as asked."""

    def __init__(
        self,
        name: str,
        sessions: Mapping[str, SessionCode],
        dsn: str,
        *,
        setup: str | None,
        final: str | None,
        teardown: str | None,
        step_timeout: float,
        server: ServerInfo,
        expect: Sequence[Sequence[Any]] | None = None,
        observer_dsn: str | None = None,
        framework_modules: Sequence[str] = (),
    ) -> None:
        """``framework_modules``: module prefixes a step's note passes over, besides the known frameworks'."""
        self.name = name
        self.code = dict(sessions)
        self.dsn = dsn
        self.observer_dsn = observer_dsn or dsn  # pgrace's own watcher: out of the sessions' reach
        self.setup = setup
        self.final = final
        self.expect = expect
        self.teardown = teardown
        self.framework_modules = tuple(framework_modules)
        self.step_timeout = step_timeout
        self.server = server
        self.cond = threading.Condition()
        self.stack = contextlib.ExitStack()
        self.sessions: dict[str, ThreadSession] = {}
        self.has_row_locks = True
        self.raised: list[str] = []
        self.sql = ControlSql(step_timeout, timeout_name="the step timeout")
        self.database = str(conninfo_to_dict(dsn).get("dbname") or "")
        self.retired: set[int] = set()  # backends of closed session connections, pgrace's until they are gone
        self.kept: dict[str, TracedConnection] = {}  # a session's last connection, reset for the next run
        self.refused: list[str] = []  # connections to the run's database refused outside sessions' threads

    def __enter__(self) -> CodeRunner:
        try:
            connections = self.stack.enter_context(
                RunConnections(
                    lambda name, observer: self._connect(name, observer=observer),
                    f"pgrace/{self.name}/control connection",
                    f"pgrace/{self.name}/observer",
                )
            )
            self.stack.callback(self._close_kept)
            self.stack.callback(self._close_sessions)
        except BaseException:
            self.stack.close()
            raise
        self.control = connections.control
        self.observer = connections.observer
        self.inspector = connections.inspector
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def _connect(self, application_name: str, traced: bool = False, observer: bool = False) -> Any:
        """A connection of the run, where :func:`pgrace.scratch.connect` puts it; a session's is traced.

        Closing it is the caller's: the run's connections close theirs, a session's closes for good.
        """
        extra: dict[str, Any] = {}
        if traced:
            extra = {"connection_class": TracedConnection, "autocommit": False, "cursor_factory": TracedCursor}
        conn = scratch.connect(
            self.observer_dsn if observer else self.dsn,
            None,
            observer=observer,
            application_name=application_name[:63],
            client_encoding="UTF8",
            **extra,
        )
        if isinstance(conn, TracedConnection):
            _traced(conn)
        return conn

    # -- one run -------------------------------------------------------------------------

    def run_once(self, chooser: Chooser, observe: bool, footprints: bool = False) -> tuple[Run, list[tuple[str, ...]]]:
        """Setup, the sessions under ``chooser``'s order, the final query, teardown.

        Returns the run and the options met at each choice (the ready sessions, in order);
        ``raised`` is then the steps that were a session's escaped exception, not a statement.
        ``footprints``: what every session holds is recorded after each statement.
        """
        locks = observe and self.has_row_locks
        self.run = Run(Scenario(self.name, self.name, ""), self.server.version, self.server.label, locks)
        self.recorder = Recorder(self.run, None)
        book = StepBook(self.recorder, self.inspector, self.step_timeout)
        self.recorder.add(PermutationStarted(0, (), self.recorder.now()))
        try:
            if self.setup:
                self._setup(self.setup)
        except ScenarioFailed as failed:
            failed.run = self.run  # what happened up to the failure, for whoever reports it
            raise
        self._open_sessions()
        order = CodeOrder(
            self.sessions,
            self.code,
            self.cond,
            book,
            self.inspector,
            self.run,
            step_timeout=self.step_timeout,
            observe=observe,
            footprints=footprints,
        )
        self.raised = order.raised

        def checked(ready: list[str]) -> str:
            self._check_ordered()  # before each choice: what ran since the last one went through the scheduler
            return chooser(ready)

        try:
            with connections_guarded(self.database) as self.refused:
                for name, fn in self.code.items():
                    self.sessions[name].start(fn)
                met = order.run(checked)
        except BaseException:
            self._stop_all(quiet=True)  # the error that ended the run is the one to report
            self._close_sessions()
            raise
        self._stop_all()
        self._check_ordered()
        self._check_input()
        self._close_sessions()
        if self.final:
            outcome = self.sql.execute(self.control.pgconn, self.final)
            self.recorder.add(CheckQueried(0, outcome, self.recorder.now(), self.final))
        self._reset()
        self.run.scenario = self._scenario(order.steps)
        return self.run, met

    def _stop_all(self, quiet: bool = False) -> None:
        """Release every parked session (it unwinds), wait for them, and leave the connections idle.

        A thread still running after its statement was cancelled is stuck (``quiet``: left, as a daemon).
        Called in no ``with self.cond`` block: what this thread holds of the lock then, a Ctrl-C left
        (:func:`release_held`), is given up, or every session thread joined here would wait for it.
        """
        release_held(self.cond)
        with self.cond:
            for session in self.sessions.values():
                session.gate.stopping = True
            self.cond.notify_all()
        for name, session in self.sessions.items():
            if not session.join(self.step_timeout) and not quiet:
                raise StepsStuck(f"session {name} did not return, even after its statement was cancelled")

    # -- every statement through the scheduler -------------------------------------------

    def _open_sessions(self) -> None:
        """Each run's sessions on new connection objects, on backends reset by DISCARD ALL (or new): nothing a run
        leaves (settings, prepared statements, temporary tables, advisory locks, Python state kept per connection
        object) reaches the next."""
        self._close_sessions()
        kept, self.kept = self.kept, {}
        try:
            for name in self.code:
                old = kept.pop(name, None)
                conn = (
                    self._connect(f"pgrace/{self.name}/{name}", traced=True)
                    if old is None
                    else _traced(TracedConnection(old.pgconn))
                )
                self.sessions[name] = ThreadSession(name, conn, self.step_timeout)
        except psycopg.Error as exc:
            raise RunAborted(f"could not open the sessions' connections: {first_line(str(exc))}") from None
        for session in self.sessions.values():
            session.gate = Gate(session.name, self.cond, self.framework_modules)
        self.inspector.set_sessions({s.pid: name for name, s in self.sessions.items()})

    def _close_sessions(self) -> None:
        """Each session's backend reset by DISCARD ALL, kept for the next run's new object; closed if it cannot be.

        A session whose thread is stuck keeps its connection until the runner closes.
        """
        for name, session in self.sessions.items():
            conn = session.conn
            if session.gate.thread is not None and session.gate.thread.is_alive():
                self.stack.callback(conn.close_for_good)
                continue
            if not conn.closed and conn.pgconn.transaction_status == pq.TransactionStatus.IDLE:
                with contextlib.suppress(psycopg.Error, RunAborted, StepsStuck):  # then closed: a new one next run
                    if self.sql.execute(conn.pgconn, "DISCARD ALL").error is None:
                        conn.stale()
                        self.kept[name] = conn
                        continue
            conn.close_for_good()
            self.retired.add(session.pid)
        self.sessions = {}

    def _close_kept(self) -> None:
        for conn in self.kept.values():
            conn.pgconn.finish()
        self.kept = {}

    def _check_ordered(self) -> None:
        """A statement that reached the run's database without the scheduler's leave makes the run no proof."""
        for name, session in self.sessions.items():
            gate = session.gate
            if gate.intruded is not None:
                raise CodeError(
                    f"session {name} opened a connection of its own at {gate.intruded}; pgrace did not order its"
                    " statements: use the connection pgrace passes to the session",
                    *where_defined(self.code[name]),
                )
            if gate.strayed is not None:
                raise CodeError(
                    f"session {name} sent a statement past the scheduler {gate.strayed}; pgrace did not order it:"
                    " send on the connection pgrace passes, from the session's own thread (async code is not"
                    " supported yet)",
                    *where_defined(self.code[name]),
                )
        if self.refused:
            raise CodeError(
                f"a thread that is no session's opened a connection to the run's database at {self.refused[0]};"
                " pgrace did not order its statements: use the connection pgrace passes to each session",
                *where_defined(next(iter(self.code.values()))),
            )
        for pid, application, query in self._foreign_backends():
            said = f"sending {first_line(query)!r}" if query else "no statement seen yet"
            if query == "<insufficient privilege>":
                said = "another role's, its statements hidden from pgrace's role"
            raise CodeError(
                f"a connection pgrace did not open reached the run's database (application_name {application!r},"
                f" backend {pid}, {said}); pgrace did not order its statements: use the connection pgrace passes"
                " to each session",
                *where_defined(next(iter(self.code.values()))),
            )

    def _foreign_backends(self) -> list[tuple[int, str, str]]:
        """Client backends of the run's database that are not pgrace's (the server's answer, any driver).

        Another role's backend shows no type and no statement to pgrace's role, only its user: a backend with a
        user and no other type is a client's (autovacuum has no user).
        """
        own = [self.control.pgconn.backend_pid, self.observer.pgconn.backend_pid]
        own += [s.pid for s in self.sessions.values()]
        rows = self.observer.execute(
            "SELECT pid, coalesce(application_name, ''), coalesce(query, '') FROM pg_catalog.pg_stat_activity"
            " WHERE datname = current_database() AND usesysid IS NOT NULL"
            " AND coalesce(backend_type, 'client backend') = 'client backend' AND pid <> ALL(%s)"
            " ORDER BY backend_start, pid",
            (own,),
        ).fetchall()
        self.retired &= {row[0] for row in rows}  # a closed session's backend, once gone, is gone for good
        return [(int(pid), str(app), str(query)) for pid, app, query in rows if pid not in self.retired]

    def _check_input(self) -> None:
        """The session code's mistakes that make the run meaningless: one message each."""
        for name, session in self.sessions.items():
            gate = session.gate
            path, line = where_defined(self.code[name])
            if gate.steps == 0 and gate.raised is not None:
                exc = gate.raised
                raise CodeError(
                    f"session {name} raised {type(exc).__name__} before its first statement: {exc}", path, line
                )
            if gate.steps == 0:
                raise CodeError(
                    f"session {name} sent no statement: none on the connection pgrace passed it, and the server"
                    " showed none elsewhere",
                    path,
                    line,
                )

    def _scenario(self, discovered: list[Step]) -> Scenario:
        first = next(iter(self.code.values()))
        path, line = where_defined(first)
        steps = tuple(discovered)
        sessions = tuple(Session(name, line=where_defined(fn)[1]) for name, fn in self.code.items())
        checks: tuple[FinalCheck, ...] = ()
        if self.final:
            rows = tuple(tuple(r) for r in self.expect) if self.expect is not None else ()
            checks = (FinalCheck(self.final, self.final, rows),)
        return Scenario(
            self.name,
            f"{', '.join(self.code)} interleaved ({path})",
            path,
            variant="code",
            setup=(self.setup,) if self.setup else (),
            setup_line=line,
            sessions=sessions,
            steps=steps,
            permutations=(tuple(PermutationStep(s.name) for s in discovered),),
            checks=checks,
        )

    # -- pgrace's own SQL ----------------------------------------------------------------

    def _setup(self, text: str) -> None:
        """The caller's setup, bounded by the step timeout; its failure is the scenario's SetupFailed (exit 1)."""
        outcome = self.sql.execute(self.control.pgconn, text)
        self.recorder.add(SetupRan("setup", None, outcome, self.recorder.now()))
        if outcome.error is not None:
            path, line = where_defined(next(iter(self.code.values())))
            raise setup_failed("setup", outcome, path, line)

    def _reset(self) -> None:
        """Back to an empty schema for the next run: the caller's teardown, else the schema dropped and made again."""
        if self.teardown:
            outcome = self.sql.execute(self.control.pgconn, self.teardown)
            self.recorder.add(SetupRan("teardown", None, outcome, self.recorder.now()))
        self.sql.execute(self.control.pgconn, schema_reset_sql(CODE_SCHEMA))


def _traced(conn: TracedConnection) -> TracedConnection:
    """A session's connection as pgrace hands it out: traced cursors, nothing prepared."""
    conn.cursor_factory = TracedCursor
    conn.server_cursor_factory = TracedServerCursor
    # Every run sends its statements alike: psycopg prepares a query it met five times, and the
    # portal of a prepared one keeps its snapshot (backend_xmin) while the session idles in its
    # transaction, which would read as a REPEATABLE READ transaction's from the sixth run on.
    conn.prepare_threshold = None
    return conn
