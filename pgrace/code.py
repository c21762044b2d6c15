"""Interleave the application's own Python functions, statement by statement, on a real server.

Each *session* is a callable that receives a psycopg 3 connection pgrace opened and tagged
(``application_name`` ``pgrace/<name>/<session>``). It runs in a thread of its own. The
connection is a :class:`TracedConnection`: every statement it is about to send (each
``execute``, ``executemany``, COPY start, ``commit`` and ``rollback``, the BEGIN,
SAVEPOINT and COMMIT of ``conn.transaction()``, a named cursor's DECLARE, FETCH and
CLOSE) is handed to the scheduler, and the
session's thread waits there until the scheduler lets it go. So the scheduler owns the
order, one statement at a time, and nothing depends on timing.

The scheduler (:class:`CodeRunner`) lets one statement go, then waits until every session
is settled: parked at its next statement, finished, or *seen blocked by the server* (the
runner's probe, :meth:`~pgrace.locks.LockInspector.is_blocked`, asked from the observer
connection while the session's thread is inside psycopg's ``execute``). A blocked session
stays pending while the others go on, exactly as in a scenario run. Each step is recorded
with the same timeline events as a scenario run (launched, waiting with the row and its
holder, finished with what released it, locks held), into a :class:`~pgrace.timeline.Run`
whose :class:`~pgrace.model.Scenario` is made from the steps as they were discovered, so
every renderer draws it. A step's note is its caller's ``file:line``: the first frame
outside psycopg, SQLAlchemy and pgrace.

A callable's statements are only known by running it (they may depend on what it read),
so :func:`explore_code` walks the tree of "which session goes next" choices depth first:
each run follows a prefix of choices, then takes the first ready session, and records the
choices it met; the next run changes the last choice that has an untried alternative. The
schema is reset between runs (one scratch database, one set of connections, as ``pgrace
explore``) and runs are classified by :func:`pgrace.outcomes.classify`.

Bad input is a :class:`~pgrace.errors.CodeError` naming the function's ``file:line``: a
session that never sends a statement, one that raises before its first statement, one that
opens a connection of its own (``psycopg.connect`` is guarded while sessions run: a session
thread calling it is refused), Python that runs longer than the step timeout without
sending anything. A statement that runs longer than the step timeout is cancelled, as a
scenario step is (57014, an outcome), and one that outlives its cancel ends the run
(:class:`~pgrace.errors.StepsStuck`). Threads are joined, connections closed, the scratch
database dropped, whatever happens.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import inspect
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import psycopg
from psycopg import pq, sql

from pgrace.errors import CodeError, RunAborted, StepsStuck
from pgrace.locks import LockInspector, LockSnapshot
from pgrace.model import FinalCheck, PermutationStep, Scenario, Session, Step
from pgrace.outcomes import Observed, OutcomeClass, add_observed, classify, ordered
from pgrace.releases import ReleaseTracker
from pgrace.runner import Recorder, result_set
from pgrace.scratch import schema_reset_sql, scratch_database_with_schema
from pgrace.servers import ServerInfo, open_server
from pgrace.timeline import (
    CheckQueried,
    Holder,
    LocksObserved,
    Outcome,
    PermutationStarted,
    Run,
    SetupRan,
    SqlError,
    StepCancelled,
    StepFinished,
    StepLaunched,
    StepWaiting,
)

__all__ = ["CodeClass", "CodeExploration", "TracedConnection", "explore_code", "run_code"]

SessionCode = Callable[[Any], object]
CODE_SCHEMA = "pgrace_code"
EXPLORE_LIMIT = 10_000  # runs; a bigger tree is explored up to this many and says so
_SKIPPED_MODULES = ("psycopg", "sqlalchemy", "pgrace", "threading", "contextlib")


# -- the session's side: a connection that asks before it sends -------------------------------


class _Stop(BaseException):
    """Unwinds a session's thread when the run ends early (not an Exception: code rarely catches it)."""


@dataclass
class _Request:
    sql: str
    where: str  # file:line of the caller, as shown
    line: int | None


@dataclass
class _Gate:
    """One session's meeting point with the scheduler; every field is guarded by the scheduler's condition."""

    name: str
    cond: threading.Condition
    thread: threading.Thread | None = None
    state: Literal["python", "ready", "running", "done"] = "python"
    since: float = 0.0  # when it entered its state
    request: _Request | None = None
    permitted: bool = False
    stopping: bool = False
    in_step: bool = False  # only touched by the session's own thread
    finished: tuple[Outcome, pq.TransactionStatus] | None = None  # a step's result not reported yet
    step_error: BaseException | None = None  # the exception the last step raised in the session
    raised: BaseException | None = None  # what the callable raised
    steps: int = 0
    intruded: str | None = None  # where it opened a connection of its own
    end_location: _Request | None = None  # the implicit rollback's place
    reported: bool = False  # its escaped exception is in the timeline


_GATES: dict[int, _Gate] = {}  # thread ident -> the gate of the session running there


class TracedCursor(psycopg.Cursor[Any]):
    """A cursor whose statements are steps."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        conn = cast(TracedConnection, self.connection)
        return conn._step(
            _describe(self, query, params), self, lambda: super(TracedCursor, self).execute(query, params, **kwargs)
        )

    def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> None:
        conn = cast(TracedConnection, self.connection)
        seq = list(params_seq)
        shown = f"{_describe(self, query, None)} -- ×{len(seq)}"
        conn._step(shown, self, lambda: super(TracedCursor, self).executemany(query, seq, **kwargs))

    def copy(self, statement: Any, params: Any = None, **kwargs: Any) -> Any:
        conn = cast(TracedConnection, self.connection)
        conn._label = _describe(self, statement, params)  # the COPY's start is the step (its data is not)
        return super().copy(statement, params, **kwargs)


class TracedServerCursor(psycopg.ServerCursor[Any]):
    """A named (server-side) cursor: its DECLARE and each FETCH are steps."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        conn = cast(TracedConnection, self.connection)
        conn._label = f"DECLARE {self.name} CURSOR FOR {_describe(self, query, params)}"
        return super().execute(query, params, **kwargs)


class TracedConnection(psycopg.Connection[Any]):
    """pgrace's connection for a session: each statement waits for the scheduler's permission.

    Outside a session thread (pgrace's own setup, a connection lent to SQLAlchemy being
    initialised) it is an ordinary connection.
    """

    _label: str | None = None
    _untracked: bool = False
    _lent: bool = False  # in a session's hands: close() is pgrace's to do
    pgrace_engine: Any = None  # the SQLAlchemy engine made for it (see pgrace.code_sqlalchemy)

    def _gate(self) -> _Gate | None:
        gate = _GATES.get(threading.get_ident())
        return None if gate is None or self._untracked or gate.in_step else gate

    def _step(self, label: str, cursor: psycopg.Cursor[Any] | None, call: Callable[[], Any]) -> Any:
        gate = self._gate()
        if gate is None:
            return call()
        gate.in_step = True
        try:
            _ask(gate, label)
            try:
                result = call()
            except psycopg.Error as exc:
                gate.step_error = exc
                _finish(gate, Outcome(error=_sql_error(exc)), self)
                raise
            except BaseException as exc:
                gate.step_error = exc
                _finish(gate, Outcome(error=SqlError("XX000", f"{type(exc).__name__}: {exc}")), self)
                raise
            _finish(gate, _outcome(cursor, label), self)
            return result
        finally:
            gate.in_step = False

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        gate = self._gate()
        name = getattr(gen, "__name__", "")
        if gate is None or name in ("copy_to", "copy_end", "copy_from"):
            return super().wait(gen, interval, timeout)
        label, self._label = self._label or _GEN_LABELS.get(name, name or "psycopg"), None
        return self._step(label, None, lambda: super(TracedConnection, self).wait(gen, interval, timeout))

    def commit(self) -> None:
        if self.pgconn.transaction_status == pq.TransactionStatus.IDLE:
            with self.untracked():  # psycopg sends nothing: not a step
                return super().commit()
        self._step("COMMIT", None, super().commit)

    def rollback(self) -> None:
        if self.pgconn.transaction_status == pq.TransactionStatus.IDLE:
            with self.untracked():  # e.g. a pool's reset of an idle connection: nothing sent
                return super().rollback()
        self._step("ROLLBACK", None, super().rollback)

    def close(self) -> None:
        if not self._lent:  # a session closing (or SQLAlchemy disposing) pgrace's connection: kept open
            super().close()

    def close_for_good(self) -> None:
        self._lent = False
        super().close()

    @contextlib.contextmanager
    def untracked(self) -> Iterator[None]:
        """Statements sent here are pgrace's or a library's own set-up, not the application's steps."""
        was, self._untracked = self._untracked, True
        try:
            yield
        finally:
            self._untracked = was  # nested (a rollback inside a library's set-up): still untracked after


_GEN_LABELS = {
    "_enter_gen": "BEGIN (conn.transaction())",
    "_exit_gen": "COMMIT (end of conn.transaction())",
    "_fetch_gen": "FETCH (server-side cursor)",
    "_scroll_gen": "MOVE (server-side cursor)",
    "_close_gen": "CLOSE (server-side cursor)",
}


def _describe(cursor: psycopg.Cursor[Any] | psycopg.ServerCursor[Any], query: Any, params: Any) -> str:
    """The statement as the server runs it, values in place (psycopg's client-side quoting), for people."""
    try:
        text = query.as_string(cursor.connection) if isinstance(query, sql.Composable) else query
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        if params is not None:
            return psycopg.ClientCursor(cursor.connection).mogrify(text, params)
        return str(text)
    except Exception:  # a value psycopg cannot quote as text: show the statement as written
        return str(query)


def _caller() -> tuple[str, int | None]:
    """The first frame outside psycopg, SQLAlchemy and pgrace: the application's line."""
    frame = sys._getframe(1)
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module.split(".")[0] not in _SKIPPED_MODULES:
            return _shown_path(frame.f_code.co_filename), frame.f_lineno
        frame = frame.f_back  # type: ignore[assignment]
    return "?", None


def _shown_path(path: str) -> str:
    """Relative to the working directory when under it: the text timeline must not depend on the machine."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


def _ask(gate: _Gate, label: str) -> None:
    """In the session's thread: park at a statement until the scheduler lets it go."""
    if gate.end_location is not None:
        request = dataclasses.replace(gate.end_location, sql=label)
    else:
        path, line = _caller()
        request = _Request(label, f"{path}:{line}", line)
    with gate.cond:
        gate.request, gate.state, gate.since = request, "ready", time.perf_counter()
        gate.cond.notify_all()
        while not gate.permitted and not gate.stopping:
            gate.cond.wait()
        if gate.stopping:
            raise _Stop
        gate.permitted = False


def _finish(gate: _Gate, outcome: Outcome, conn: TracedConnection) -> None:
    after = pq.TransactionStatus(conn.pgconn.transaction_status)
    with gate.cond:
        gate.finished = (outcome, after)
        gate.state, gate.since = "python", time.perf_counter()
        gate.cond.notify_all()


def _outcome(cursor: psycopg.Cursor[Any] | None, label: str) -> Outcome:
    res = cursor.pgresult if cursor is not None else None
    if res is None:  # commit, rollback, a transaction block's or a server-side cursor's statement
        return Outcome(commands=(label.split(" ")[0],))
    command = (res.command_status or b"").decode()
    if res.status == pq.ExecStatus.TUPLES_OK:
        return Outcome((result_set(res),))
    return Outcome(commands=(command,))


def _sql_error(exc: psycopg.Error) -> SqlError:
    diag = exc.diag
    message = diag.message_primary or str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return SqlError(
        exc.sqlstate or "XX000",
        message,
        diag.severity_nonlocalized or "ERROR",
        diag.message_detail or None,
    )


# -- connections opened behind pgrace's back ----------------------------------------------------

_GUARD_LOCK = threading.Lock()
_GUARD_DEPTH = 0
_ORIGINAL_CONNECT: Any = None


def _guarded_connect(cls: Any, *args: Any, **kwargs: Any) -> Any:
    gate = _GATES.get(threading.get_ident())
    if gate is not None:
        path, line = _caller()
        with gate.cond:
            gate.intruded = gate.intruded or f"{path}:{line}"
        raise CodeError(
            f"session {gate.name} opened a connection of its own; use the connection pgrace passes it", path, line
        )
    return _ORIGINAL_CONNECT.__func__(cls, *args, **kwargs)


@contextlib.contextmanager
def _connections_guarded() -> Iterator[None]:
    """While sessions run, psycopg.connect from a session's thread is refused (and remembered)."""
    global _GUARD_DEPTH, _ORIGINAL_CONNECT
    with _GUARD_LOCK:
        if _GUARD_DEPTH == 0:
            _ORIGINAL_CONNECT = psycopg.Connection.__dict__["connect"]
            psycopg.Connection.connect = classmethod(_guarded_connect)  # type: ignore[method-assign,assignment]
            psycopg.connect = psycopg.Connection.connect
        _GUARD_DEPTH += 1
    try:
        yield
    finally:
        with _GUARD_LOCK:
            _GUARD_DEPTH -= 1
            if _GUARD_DEPTH == 0:
                psycopg.Connection.connect = _ORIGINAL_CONNECT  # type: ignore[method-assign]
                psycopg.connect = psycopg.Connection.connect


# -- the scheduler ------------------------------------------------------------------------------


Chooser = Callable[[list[str]], str]


@dataclass
class _Active:
    seq: int
    name: str  # the step's name
    session: str
    tx_before: pq.TransactionStatus
    sent: float
    waiting_reported: bool = False
    cancelled: bool = False


@dataclass
class _Discovered:
    """A step as it was met in one run, for the run's Scenario."""

    name: str
    session: str
    sql: str
    where: str
    line: int | None


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
    ) -> None:
        self.name = name
        self.code = dict(sessions)
        self.dsn = dsn
        self.observer_dsn = observer_dsn or dsn  # pgrace's own watcher: out of the sessions' reach
        self.setup = setup
        self.final = final
        self.expect = expect
        self.teardown = teardown
        self.step_timeout = step_timeout
        self.server = server
        self.cond = threading.Condition()
        self.stack = contextlib.ExitStack()
        self.conns: dict[str, TracedConnection] = {}
        self.has_row_locks = True

    def __enter__(self) -> CodeRunner:
        try:
            self.control = self._connect(psycopg.Connection, "control connection")
            for session in self.code:
                conn = self._connect(TracedConnection, session)
                self.conns[session] = conn
            self.cancels = {s: c.pgconn.get_cancel() for s, c in self.conns.items()}
            self.observer = self._connect(psycopg.Connection, "observer")
            self.observer.execute("SET lock_timeout = '200ms'")
            self.observer.prepare_threshold = 0  # the same catalog questions at every step: planned once
            self.inspector = LockInspector(self.observer, {c.pgconn.backend_pid: s for s, c in self.conns.items()})
        except psycopg.Error as exc:
            self.stack.close()
            raise RunAborted(f"could not set up pgrace's connections: {str(exc).strip().splitlines()[0]}") from None
        except BaseException:
            self.stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def _connect(self, cls: Any, who: str) -> Any:
        conn = cls.connect(
            self.observer_dsn if who == "observer" else self.dsn,
            application_name=f"pgrace/{self.name}/{who}"[:63],
            client_encoding="UTF8",
            autocommit=who in ("control connection", "observer"),
            **({"cursor_factory": TracedCursor} if cls is TracedConnection else {}),
        )

        if isinstance(conn, TracedConnection):
            conn.server_cursor_factory = TracedServerCursor
            self.stack.callback(conn.close_for_good)
        else:
            self.stack.callback(conn.close)
        return conn

    # -- one run -------------------------------------------------------------------------

    def run_once(self, chooser: Chooser, observe: bool) -> tuple[Run, list[tuple[str, ...]]]:
        """Setup, the sessions under ``chooser``'s order, the final query, teardown.

        Returns the run and the options met at each choice (the ready sessions, in order).
        """
        locks = observe and self.has_row_locks
        self.run = Run(Scenario(self.name, self.name, ""), self.server.version, self.server.label, locks)
        self.recorder = Recorder(self.run, None)
        self.releases = ReleaseTracker()
        self.observe = observe
        self.seq = 0
        self.steps: list[_Discovered] = []
        self.active: dict[str, _Active] = {}
        self.counts: dict[str, int] = {}
        met: list[tuple[str, ...]] = []
        self.recorder.add(PermutationStarted(0, (), self.recorder.now()))
        if self.setup:
            self._control(self.setup, "setup")
        gates = {name: _Gate(name, self.cond) for name in self.code}
        self.gates = gates
        try:
            with _connections_guarded():
                for name, fn in self.code.items():
                    self._start(gates[name], fn)
                self._settle(None)
                while True:
                    with self.cond:
                        ready = [n for n, g in gates.items() if g.state == "ready"]
                        done = all(g.state == "done" for g in gates.values())
                    if done:
                        break
                    if not ready:
                        self._wait_blocked()
                        continue
                    met.append(tuple(ready))
                    chosen = chooser(ready)
                    launched = self._launch(gates[chosen])
                    self._settle(launched)
        except BaseException:
            self._stop_all(quiet=True)  # the error that ended the run is the one to report
            raise
        self._stop_all()
        self._check_input(gates)
        if self.final:
            outcome = self._exec(self.control, self.final)
            self.recorder.add(CheckQueried(0, outcome, self.recorder.now(), self.final))
        self._reset()
        self.run.scenario = self._scenario()
        return self.run, met

    def _start(self, gate: _Gate, fn: SessionCode) -> None:
        conn = self.conns[gate.name]

        def main() -> None:
            _GATES[threading.get_ident()] = gate
            try:
                try:
                    fn(conn)
                except _Stop:
                    return
                except BaseException as exc:
                    gate.raised = exc
                if not gate.stopping and conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
                    # what a pool or a context manager does with a transaction left open: roll it back
                    gate.end_location = _Request("ROLLBACK", f"(end of {gate.name})", None)
                    with contextlib.suppress(Exception, _Stop):
                        conn.rollback()
            finally:
                _GATES.pop(threading.get_ident(), None)
                with gate.cond:
                    gate.state, gate.since = "done", time.perf_counter()
                    gate.cond.notify_all()

        conn._lent = True
        gate.since = time.perf_counter()
        gate.thread = threading.Thread(target=main, name=f"pgrace session {gate.name}", daemon=True)
        gate.thread.start()

    def _stop_all(self, quiet: bool = False) -> None:
        """Release every parked session (it unwinds), wait for them, and leave the connections idle.

        A thread still running after its statement was cancelled is stuck (``quiet``: left, as a daemon).
        """
        with self.cond:
            for gate in self.gates.values():
                gate.stopping = True
            self.cond.notify_all()
        for name, gate in self.gates.items():
            if gate.thread is None:
                continue
            gate.thread.join(self.step_timeout)
            if gate.thread.is_alive():  # inside a statement: cancel it, then give it one more chance
                with contextlib.suppress(psycopg.Error):
                    self.cancels[name].cancel()
                gate.thread.join(self.step_timeout)
            if gate.thread.is_alive():
                if quiet:
                    continue
                raise StepsStuck(f"session {gate.name} did not return, even after its statement was cancelled")
            conn = self.conns[name]
            conn._lent = False
            if conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
                with contextlib.suppress(psycopg.Error):
                    conn.rollback()

    def _check_input(self, gates: dict[str, _Gate]) -> None:
        """The session code's mistakes that make the run meaningless: one message each."""
        for name, gate in gates.items():
            fn = self.code[name]
            path, line = _where_defined(fn)
            if gate.intruded is not None:
                raise CodeError(
                    f"session {name} opened a connection of its own at {gate.intruded}; pgrace cannot schedule"
                    " its statements: use the connection pgrace passes to the session",
                    path,
                    line,
                )
            if gate.steps == 0 and gate.raised is not None:
                exc = gate.raised
                raise CodeError(
                    f"session {name} raised {type(exc).__name__} before its first statement: {exc}", path, line
                )
            if gate.steps == 0:
                raise CodeError(f"session {name} never sent a statement to the database", path, line)

    def _scenario(self) -> Scenario:
        first = next(iter(self.code.values()))
        path, line = _where_defined(first)
        steps = tuple(Step(s.name, s.session, s.sql, note=s.where, line=s.line) for s in self.steps)
        sessions = tuple(Session(name, line=_where_defined(fn)[1]) for name, fn in self.code.items())
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
            permutations=(tuple(PermutationStep(s.name) for s in self.steps),),
            checks=checks,
        )

    # -- scheduling ----------------------------------------------------------------------

    def _launch(self, gate: _Gate) -> _Active:
        self._report_raised()  # an exception comes before the rollback of what it left open
        with self.cond:
            request = gate.request
            assert request is not None
            self.seq += 1
            gate.steps += 1
            self.counts[gate.name] = self.counts.get(gate.name, 0) + 1
            step_name = f"{gate.name}.{self.counts[gate.name]}"
            conn = self.conns[gate.name]
            active = _Active(
                self.seq,
                step_name,
                gate.name,
                pq.TransactionStatus(conn.pgconn.transaction_status),
                time.perf_counter(),
            )
            self.steps.append(_Discovered(step_name, gate.name, request.sql, request.where, request.line))
            self.recorder.add(StepLaunched(active.seq, step_name, gate.name, request.sql, self.recorder.now()))
            self.releases.launched(active.seq, gate.name)
            self.active[gate.name] = active
            gate.state, gate.since, gate.request = "running", time.perf_counter(), None
            gate.permitted = True
            self.cond.notify_all()
        return active

    def _settle(self, launched: _Active | None) -> None:
        """Wait until every session is parked, done or seen blocked; report completions as they come.

        The step just launched is reported first, then the others in launch order (as the runner).
        """
        slice_s = 0.0001
        while True:
            self._report_finished(launched)
            with self.cond:
                moving = [g for g in self.gates.values() if g.state == "python" or g.finished is not None]
                running = [g for g in self.gates.values() if g.state == "running" and g.finished is None]
            now = time.perf_counter()
            for gate in moving:
                if gate.finished is None and now - gate.since > self.step_timeout:
                    path, line = _where_defined(self.code[gate.name])
                    raise CodeError(
                        f"session {gate.name} ran Python for more than {self.step_timeout:g} s without sending"
                        " a statement or returning",
                        path,
                        line,
                    )
            unblocked = []
            for gate in running:
                active = self.active[gate.name]
                if self.inspector.is_blocked(self.conns[gate.name].pgconn.backend_pid):
                    with self.cond:
                        if gate.finished is not None:
                            continue
                    if not active.waiting_reported:
                        self._report_waiting(active)
                else:
                    unblocked.append(active)
            for active in unblocked:
                self._bound(active, now)
            if not moving and not unblocked:
                return
            with self.cond:
                self.cond.wait(slice_s)
            slice_s = min(slice_s * 2, 0.001)

    def _bound(self, active: _Active, now: float) -> None:
        """A statement running (not blocked) past the step timeout is cancelled once; past three, the run ends."""
        elapsed = now - active.sent
        if not active.cancelled and elapsed >= self.step_timeout:
            self._cancel(active, blocked=False)
        elif active.cancelled and elapsed >= 3 * self.step_timeout:
            step = next(s for s in self.steps if s.name == active.name)
            raise StepsStuck(f"step {active.name} did not finish even after it was cancelled: {step.sql}", step.where)

    def _wait_blocked(self) -> None:
        """No session can go on: every one left waits for a lock. Wait for the server to end a wait
        (deadlock detector, lock_timeout), up to the step timeout; then cancel the oldest waiter."""
        started = time.perf_counter()
        while True:
            with self.cond:
                if any(
                    g.finished is not None or g.state != "running" for g in self.gates.values() if g.state != "done"
                ):
                    break
                self.cond.wait(0.001)
            if time.perf_counter() - started >= self.step_timeout:
                oldest = min(self.active.values(), key=lambda a: a.seq)
                if oldest.cancelled:
                    raise StepsStuck(f"step {oldest.name} did not finish even after it was cancelled")
                oldest.sent = time.perf_counter() - self.step_timeout
                self._cancel(oldest, blocked=True)
                started = time.perf_counter()
        self._settle(None)

    def _cancel(self, active: _Active, blocked: bool) -> None:
        """pgrace's own cancel at the step timeout, recorded with who blocked whom at that moment
        (``blocked``: the step waited for a lock, and its holders are named)."""
        active.cancelled = True
        graph = self.inspector.blocking_graph()
        holders = tuple(Holder(n, "") for _, on in graph for n in on) if blocked else ()
        self.recorder.add(StepCancelled(active.seq, self.step_timeout, graph, self.recorder.now(), holders))
        with contextlib.suppress(psycopg.Error):
            self.cancels[active.session].cancel()

    def _report_waiting(self, active: _Active) -> None:
        detected = self.recorder.now()
        active.waiting_reported = True
        pid = self.conns[active.session].pgconn.backend_pid
        waits = self.inspector.describe_waits(pid) if self.observe else ()
        self.releases.waiting(active.seq, waits)
        self.recorder.add(StepWaiting(active.seq, waits, detected))

    def _settle_blockers(self, names: Iterable[str]) -> None:
        """Note the completions of the blockers' steps the server has finished but the scheduler not yet reported.

        A holder's COMMIT frees the waiter before its own answer reaches its thread, so the
        waiter's thread can report first. A blocker whose backend is no longer active has
        its answer on the wire: it is waited for, and noted for the release (its report
        follows). One still active has not finished, and is not waited for.
        """
        pending = {n: self.active[n] for n in names if n in self.active}
        if not pending:
            return
        states = self.inspector.states([self.conns[n].pgconn.backend_pid for n in pending])
        for name, active in pending.items():
            gate = self.gates[name]
            with self.cond:
                if states.get(self.conns[name].pgconn.backend_pid) != "active":
                    deadline = time.perf_counter() + self.step_timeout
                    while gate.finished is None and (left := deadline - time.perf_counter()) > 0:
                        self.cond.wait(left)
                finished = gate.finished
            if finished is not None:
                outcome, after = finished
                self.releases.completed(active.seq, active.tx_before, after, outcome.error, False)

    def _report_raised(self) -> None:
        """An exception that escaped a session's code (not the one a statement raised) is its last outcome."""
        with self.cond:
            ended = [
                g
                for g in self.gates.values()
                if g.raised is not None and not g.reported and (g.state == "done" or g.end_location is not None)
            ]
            for gate in ended:
                gate.reported = True
        for gate in ended:
            exc = gate.raised
            assert exc is not None
            if exc is gate.step_error or getattr(exc, "orig", None) is gate.step_error is not None:
                continue  # the statement's own error, already in the timeline (SQLAlchemy wraps it)
            if gate.steps == 0:
                continue  # bad input, said by _check_input
            self.seq += 1
            self.counts[gate.name] = self.counts.get(gate.name, 0) + 1
            name = f"{gate.name}.{self.counts[gate.name]}"
            kind = type(exc).__name__
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else kind
            path, line = _raised_at(exc)
            text = f"raise {kind}({message!r})"
            self.steps.append(_Discovered(name, gate.name, text, f"{path}:{line}", line))
            self.recorder.add(StepLaunched(self.seq, name, gate.name, text, self.recorder.now()))
            self.releases.launched(self.seq, gate.name)
            error = SqlError(kind, message, "ERROR", "raised by the session's Python code")
            self.recorder.add(StepFinished(self.seq, Outcome(error=error), self.recorder.now()))

    def _report_finished(self, launched: _Active | None) -> None:
        self._report_raised()
        with self.cond:
            done = [(g, g.finished) for g in self.gates.values() if g.finished is not None]
            for gate, _ in done:
                gate.finished = None
        if not done:
            return
        first = launched.session if launched is not None else None
        done.sort(key=lambda pair: (pair[0].name != first, self.active[pair[0].name].seq))
        for gate, finished in done:
            assert finished is not None
            outcome, after = finished
            active = self.active.pop(gate.name)
            if active.cancelled and outcome.error is not None and outcome.error.sqlstate == "57014":
                why = f"pgrace cancelled it after the step timeout {self.step_timeout:g} s"
                outcome = dataclasses.replace(outcome, error=dataclasses.replace(outcome.error, detail=why))
            self.releases.completed(active.seq, active.tx_before, after, outcome.error, False)
            release = None
            if active.waiting_reported:
                release = self.releases.attribute(
                    active.seq,
                    outcome.error,
                    cancelled_by_pgrace=active.cancelled,
                    lost=False,
                    collect_finished=self._settle_blockers,
                    gone=lambda names: set(),
                )
            self.recorder.add(StepFinished(active.seq, outcome, self.recorder.now(), active.waiting_reported, release))
            if self.observe:
                self._observe_locks(active.seq)

    def _observe_locks(self, seq: int) -> None:
        snapshot = self.inspector.row_locks() if self.run.row_locks_available else LockSnapshot(None, ())
        self.recorder.add(
            LocksObserved(seq, snapshot.locks, self.recorder.now(), snapshot.skipped, self.inspector.other_locks())
        )

    # -- pgrace's own SQL ----------------------------------------------------------------

    def _exec(self, conn: psycopg.Connection[Any], text: str) -> Outcome:
        try:
            cur = conn.execute(text.encode())
        except psycopg.Error as exc:
            return Outcome(error=_sql_error(exc))
        res = cur.pgresult
        if res is not None and res.status == pq.ExecStatus.TUPLES_OK:
            return Outcome((result_set(res),))
        return Outcome(commands=((res.command_status or b"").decode() if res is not None else "",))

    def _control(self, text: str, phase: Literal["setup", "teardown"]) -> None:
        outcome = self._exec(self.control, text)
        if outcome.error is not None and phase == "setup":
            path, line = _where_defined(next(iter(self.code.values())))
            raise CodeError(f"setup failed: {outcome.error.severity}:  {outcome.error.message}", path, line)
        self.recorder.add(SetupRan(phase, None, outcome, self.recorder.now()))

    def _reset(self) -> None:
        """Back to an empty schema for the next run: the caller's teardown, else the schema dropped and made again."""
        if self.teardown:
            self._control(self.teardown, "teardown")
        self._exec(self.control, schema_reset_sql(CODE_SCHEMA))


def _raised_at(exc: BaseException) -> tuple[str, int | None]:
    """The innermost frame of the traceback in the application's code."""
    found: tuple[str, int | None] = ("?", None)
    tb = exc.__traceback__
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        if module.split(".")[0] not in _SKIPPED_MODULES:
            found = (_shown_path(tb.tb_frame.f_code.co_filename), tb.tb_lineno)
        tb = tb.tb_next
    return found


def _underlying(fn: Any) -> Any:
    """The function a session callable runs: through ``functools.partial``, decorators and bound methods."""
    seen = 0
    while seen < 100:  # a partial of a partial of ...; never a loop forever
        seen += 1
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        elif inspect.ismethod(fn):
            fn = fn.__func__
        elif not inspect.isfunction(fn) and not inspect.isbuiltin(fn) and callable(fn):
            fn = type(fn).__call__
            break
        else:
            break
    return fn


def _display_name(fn: Any) -> str:
    """A session callable's name: its function's, or its class's for an object with ``__call__``."""
    target = _underlying(fn)
    if getattr(target, "__name__", "") == "__call__":
        return str(target.__qualname__.rsplit(".", 1)[0])
    return str(getattr(target, "__name__", ""))


def _where_defined(fn: Any) -> tuple[str, int | None]:
    """Where a session's code is, as ``path`` and line; its name when the source cannot be found (never a repr,
    which carries a memory address that changes every run)."""
    target = _underlying(fn)
    try:
        path = inspect.getsourcefile(target) or inspect.getfile(target)
        _, line = inspect.getsourcelines(target)
    except (TypeError, OSError):
        return str(getattr(target, "__qualname__", type(target).__qualname__)), None
    return _shown_path(path), line


# -- the public functions -----------------------------------------------------------------------


@dataclass
class CodeClass:
    """Interleavings that ended alike (the same key as ``pgrace explore``'s classes).

    ``final``: the rows of the final query; ``example``: the simplest schedule that ends so,
    as ``(session, sql)`` pairs in launch order; ``errors``: the SQLSTATEs of failed statements
    (and the Python exceptions that escaped a session, by class name).
    """

    count: int
    final: tuple[tuple[Any, ...], ...]
    example: list[tuple[str, str]]
    errors: tuple[str, ...]
    waits: int
    ok: bool
    summary: str
    choices: tuple[int, ...] = ()
    outcome: OutcomeClass | None = field(default=None, repr=False)


@dataclass
class CodeExploration:
    """Every schedule of the sessions' statements that ``explore_code`` ran, grouped by outcome."""

    name: str
    explored: int
    complete: bool  # False: the tree had more than ``limit`` schedules; these are the first ones
    classes: list[CodeClass]
    replay: Callable[[CodeClass], Run] = field(repr=False)

    def timeline(self, cls: CodeClass) -> str:
        """The class's example run again, fully observed (waits, rows, holders), as the text timeline."""
        from pgrace.render.text import render_text

        return render_text(self.replay(cls))


_SERVERS: dict[str, ServerInfo] = {}
_SERVER_STACK = contextlib.ExitStack()
_SERVER_LOCK = threading.Lock()


def shared_server(server: ServerInfo | str | None = None) -> ServerInfo:
    """``server`` as ``--server`` takes it; one per target and per process, stopped at exit."""
    if isinstance(server, ServerInfo):
        return server
    key = server or os.environ.get("PGRACE_DSN") or "embedded"
    with _SERVER_LOCK:
        if key not in _SERVERS:
            if not _SERVERS:
                atexit.register(_SERVER_STACK.close)
            _SERVERS[key] = _SERVER_STACK.enter_context(open_server(None if key == "embedded" else key))
        return _SERVERS[key]


@contextlib.contextmanager
def _runner(
    name: str,
    sessions: Mapping[str, SessionCode],
    server: ServerInfo,
    *,
    setup: str | None,
    final: str | None,
    teardown: str | None,
    step_timeout: float,
    expect: Sequence[Sequence[Any]] | None,
) -> Iterator[CodeRunner]:
    if len(sessions) < 1 or not all(callable(fn) for fn in sessions.values()):
        raise CodeError("sessions: a mapping of session names to callables that take a connection")
    with (
        scratch_database_with_schema(server, f"code_{name}", CODE_SCHEMA) as db,
        CodeRunner(
            name,
            sessions,
            db.dsn,
            setup=setup,
            final=final,
            teardown=teardown,
            step_timeout=step_timeout,
            server=server,
            expect=expect,
            observer_dsn=db.observer_dsn,
        ) as runner,
    ):
        runner.has_row_locks = db.has_pgrowlocks
        yield runner


def _name_of(sessions: Mapping[str, SessionCode], name: str | None) -> str:
    """The run's name (in application_name and the timeline's title): the function's, when all sessions share it."""
    if name:
        return name
    names = {_display_name(fn) for fn in sessions.values()}
    only = names.pop() if len(names) == 1 else ""
    return only if only.isidentifier() else "code"


def _ordered_chooser(order: Sequence[str] | None, names: Sequence[str]) -> Chooser:
    """Sessions in ``order``; a session not ready (blocked, finished) is skipped until it is; then the first ready."""
    pending = list(order or ())
    unknown = [n for n in pending if n not in names]
    if unknown:
        raise CodeError(f"order names {unknown[0]!r}, which is not a session (sessions: {', '.join(names)})")

    def choose(ready: list[str]) -> str:
        for i, name in enumerate(pending):
            if name in ready:
                del pending[i]
                return name
        return ready[0]

    return choose


def _replaying(choices: Sequence[int]) -> tuple[Chooser, list[int]]:
    """Follow ``choices`` (indices into the ready sessions), then take the first ready one; record all."""
    taken: list[int] = []

    def choose(ready: list[str]) -> str:
        k = choices[len(taken)] if len(taken) < len(choices) else 0
        k = min(k, len(ready) - 1)
        taken.append(k)
        return ready[k]

    return choose, taken


def run_code(
    sessions: Mapping[str, SessionCode],
    *,
    setup: str | None = None,
    final: str | None = None,
    order: Sequence[str] | None = None,
    teardown: str | None = None,
    expect: Sequence[Sequence[Any]] | None = None,
    server: ServerInfo | str | None = None,
    name: str | None = None,
    step_timeout: float = 10.0,
) -> Run:
    """Run the sessions' code once, in ``order`` (session names, one per statement), fully observed.

    A session named in ``order`` that is blocked or finished is passed over until it can go
    (the next statement of it then comes first); after ``order``, the first session ready goes.
    ``final`` is a query run after the sessions; ``expect``, its rows, if they are checked.
    """
    runner = _runner(
        _name_of(sessions, name),
        sessions,
        shared_server(server),
        setup=setup,
        final=final,
        teardown=teardown,
        step_timeout=step_timeout,
        expect=expect,
    )
    return _observed_run(runner, _ordered_chooser(order, list(sessions)), expect is not None)


def _observed_run(runner: contextlib.AbstractContextManager[CodeRunner], chooser: Chooser, expected: bool) -> Run:
    """One run watched in full (waits, locks), judged as code runs are (see `_verdict`)."""
    from pgrace.checks import evaluate

    with runner as entered:
        run, _ = entered.run_once(chooser, observe=True)
    run.checks = _verdict(evaluate(run), expected)
    return run


def _verdict(checks: list[Any], expected: bool) -> list[Any]:
    """Only ``expect`` is judged: a final query without expected rows is reported, and a failed
    statement is an outcome of the code (a scenario file's steps say which errors they allow; code cannot)."""
    return [c for c in checks if c.step is None] if expected else []


def explore_code(
    sessions: Mapping[str, SessionCode],
    *,
    setup: str | None = None,
    final: str | None = None,
    teardown: str | None = None,
    expect: Sequence[Sequence[Any]] | None = None,
    server: ServerInfo | str | None = None,
    name: str | None = None,
    step_timeout: float = 10.0,
    limit: int = EXPLORE_LIMIT,
) -> CodeExploration:
    """Run the sessions under every order of their statements (a blocked one is no choice); group the outcomes.

    The outcome key is ``pgrace explore``'s: the final query's rows, whether ``expect`` held
    (if given), and the SQLSTATEs of failed statements. Python exceptions that escape a
    session count as errors named by their class.
    """
    info = shared_server(server)
    name = _name_of(sessions, name)
    classes: dict[str, OutcomeClass] = {}
    examples: dict[str, tuple[list[tuple[str, str]], tuple[int, ...]]] = {}
    explored = 0
    complete = True
    runner_for = functools.partial(
        _runner,
        name,
        sessions,
        info,
        setup=setup,
        final=final,
        teardown=teardown,
        step_timeout=step_timeout,
        expect=expect,
    )
    with runner_for() as runner:
        prefix: list[int] = []
        while True:
            chooser, taken = _replaying(prefix)
            run, met = runner.run_once(chooser, observe=False)
            explored += 1
            observed = _observed(run, expect is not None)
            pairs = [(s.session, s.sql) for s in run.scenario.steps]
            key = observed.key
            before = classes.get(key)
            previous = before.example if before is not None else None
            add_observed(classes, observed, (observed_switches(pairs), explored), run.scenario)
            if classes[key].example is not previous:
                examples[key] = (pairs, tuple(taken))
            # the next schedule: the last choice with an untried alternative, advanced
            while taken and taken[-1] + 1 >= len(met[len(taken) - 1]):
                taken.pop()
            if not taken:
                break
            if explored >= limit:
                complete = False
                break
            prefix = [*taken[:-1], taken[-1] + 1]

    def replay(cls: CodeClass) -> Run:
        return _observed_run(runner_for(), _replaying(cls.choices)[0], expect is not None)

    found = [
        CodeClass(
            c.count,
            c.final[0] if c.final else (),
            examples[c.key][0],
            c.errors,
            c.waits,
            c.ok,
            c.summary if expect is not None else c.summary.replace(" · checks hold", ""),
            examples[c.key][1],
            c,
        )
        for c in ordered(classes.values())
    ]
    return CodeExploration(name, explored, complete, found, replay)


def observed_switches(pairs: Sequence[tuple[str, str]]) -> int:
    return sum(1 for a, b in itertools.pairwise(pairs) if a[0] != b[0])


def _observed(run: Run, expected: bool) -> Observed:
    """:func:`classify` (escaped Python exceptions are steps whose error is the class name); a final
    query without expected rows is not a check that can fail."""
    observed = classify(run)
    if not expected:
        observed = dataclasses.replace(observed, ok=True, failed_checks=())
    return observed
