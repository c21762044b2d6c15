"""The thread transport: the application's code runs in a thread per session, parked at each statement.

Each *session* is a callable that receives a psycopg 3 connection pgrace opened and tagged.
The connection is a :class:`TracedConnection`: every statement it is about to send (each
``execute``, ``executemany``, COPY start, ``commit`` and ``rollback``, the BEGIN,
SAVEPOINT and COMMIT of ``conn.transaction()``, a named cursor's DECLARE, FETCH and
CLOSE) is handed to the scheduler, and the session's thread waits at its :class:`Gate`
until the scheduler lets it go. So the scheduler owns the order, one statement at a time,
and nothing depends on timing. A send it could not order is refused: on the connection
from a thread that is not its session's, or on an earlier run's connection object, and a
connect (psycopg, psycopg2, asyncpg) from a session's thread or to a running code run's
database. A call that sends nothing (an attribute's setter, commit() when idle) is no step:
the server cannot tell its order. A step's note is its caller's ``file:line``: the first
frame outside the frameworks (:mod:`pgrace.engine.threads.frames`: the standard library, the known
ones, and the modules a run names besides).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import psycopg
from psycopg import pq, sql

from pgrace.engine.results import result_set
from pgrace.engine.sqlerrors import cancelled_by_pgrace, exception_error
from pgrace.engine.threads.frames import caller
from pgrace.errors import CodeError
from pgrace.model.timeline import Outcome, SessionLost, SqlError

if TYPE_CHECKING:
    from pgrace.engine.session import Inspector
    from pgrace.engine.steps import Active, Recorder
    from pgrace.model.variables import Value

SessionCode = Callable[[Any], object]
# -- the session's side: a connection that asks before it sends -------------------------------


class Stop(BaseException):
    """Unwinds a session's thread when the run ends early (not an Exception: code rarely catches it)."""


@dataclass
class Request:
    sql: str
    where: str  # file:line of the caller, as shown
    line: int | None
    prepares_only: bool = False  # a proxy step that only parses (see Step.prepares_only)


@dataclass
class Gate:
    """One session's meeting point with the scheduler; every field is guarded by the scheduler's condition."""

    name: str
    cond: threading.Condition
    framework: tuple[str, ...] = ()  # module prefixes whose frames are not the application's, besides the known ones
    thread: threading.Thread | None = None
    state: Literal["python", "ready", "running", "done"] = "python"
    since: float = 0.0  # when it entered its state
    request: Request | None = None
    permitted: bool = False
    stopping: bool = False
    in_step: bool = False  # only touched by the session's own thread
    finished: tuple[Outcome, pq.TransactionStatus] | None = None  # a step's result not reported yet
    step_error: BaseException | None = None  # the exception the last step raised in the session
    raised: BaseException | None = None  # what the callable raised
    steps: int = 0
    intruded: str | None = None  # where it opened a connection of its own, and with what
    strayed: str | None = None  # where and how a connection was used past the scheduler (another thread, a stale one)
    end_location: Request | None = None  # the implicit rollback's place
    reported: bool = False  # its escaped exception is in the timeline

    def permit(self) -> None:
        """The scheduler lets the parked statement go: whoever waits at the gate sends it."""
        with self.cond:
            self.state, self.since, self.request = "running", time.perf_counter(), None
            self.permitted = True
            self.cond.notify_all()


def release_held(cond: threading.Condition) -> None:
    """Give up every hold the calling thread has on ``cond``'s lock (none: nothing happens).

    For a run's cleanup, where the thread is in no ``with cond`` block: a hold then was left by a KeyboardInterrupt
    that landed just as a ``with`` acquired the lock (CPython looks for signals between the two), and every session
    thread the cleanup joins would wait for it.
    """
    while True:
        try:
            cond.release()
        except RuntimeError:  # not (or no longer) this thread's
            return


GATES: dict[int, Gate] = {}  # thread ident -> the gate of the session running there


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
    _owner: Gate | None = None  # the session it is lent to: only that session's thread may send on it
    _stale: bool = False  # an earlier run's: its backend now serves another connection object
    pgrace_engine: Any = None  # the SQLAlchemy engine made for it (see pgrace.drivers.code_sqlalchemy)

    def _gate(self) -> Gate | None:
        gate = GATES.get(threading.get_ident())
        if self._stale:
            _strayed(gate, "a connection pgrace passed to an earlier run was used again")
        if self._untracked:
            return None
        if self._owner is not None and gate is not self._owner:
            _strayed(self._owner, "it was used from a thread that is not its session's")
        return None if gate is None or gate.in_step else gate

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
                _finish(gate, Outcome(error=exception_error(exc)), self)
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
        label, self._label = self._label or _sent_by(self, gen), None
        if label is None:  # client-side state only: the server sees nothing, so there is nothing to order
            return super().wait(gen, interval, timeout)
        return self._step(label, None, lambda: super(TracedConnection, self).wait(gen, interval, timeout))

    def commit(self) -> None:
        if self._sends_nothing_to_end():
            with self.untracked():  # psycopg sends nothing (or refuses before sending): not a step
                return super().commit()
        self._step("COMMIT", None, super().commit)

    def rollback(self) -> None:
        if self._sends_nothing_to_end(rollback=True):
            with self.untracked():  # e.g. a pool's reset of an idle connection: nothing sent
                return super().rollback()
        self._step("ROLLBACK", None, super().rollback)

    def _sends_nothing_to_end(self, rollback: bool = False) -> bool:
        """commit() and rollback() send nothing when idle (but a rollback syncs a pipeline first), and
        refuse before sending inside ``conn.transaction()`` or a two-phase transaction."""
        idle = self.pgconn.transaction_status == pq.TransactionStatus.IDLE
        syncs = rollback and self._pipeline is not None
        return (idle and not syncs) or bool(self._num_transactions) or self._tpc is not None

    def close(self) -> None:
        if not self._lent and not self._stale:  # a session closing (or SQLAlchemy disposing) it: kept open
            super().close()

    def __del__(self, *args: Any) -> None:
        if not self._stale:  # a stale object's backend lives on in the next run's object
            super().__del__(*args)

    def stale(self) -> None:
        """This object is done with: its backend, reset, goes to a new object for the next run."""
        self._stale, self._lent, self._owner = True, False, None

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
_SETTERS = {
    "_set_autocommit_gen": "autocommit",
    "_set_isolation_level_gen": "isolation_level",
    "_set_read_only_gen": "read_only",
    "_set_deferrable_gen": "deferrable",
}


def _sent_by(conn: TracedConnection, gen: Any) -> str | None:
    """What a psycopg generator is about to send, as a step's label; None when it sends nothing.

    Decided before it runs, from the state its code reads: a connection attribute's setter
    only checks the transaction status (and refuses inside a transaction, still sending
    nothing) unless a pipeline must be synced first; a pipeline's outermost entry only
    switches libpq's mode; a server-side cursor without HOLD is gone once its transaction
    ended, so closing it is client-side.
    """
    name = getattr(gen, "__name__", "")
    owner = _generator_self(gen)
    status = conn.pgconn.transaction_status
    if name in _SETTERS:
        if conn._pipeline is None or status != pq.TransactionStatus.IDLE:
            return None
        return f"SYNC (pipeline, before setting {_SETTERS[name]})"
    if isinstance(owner, psycopg.Pipeline):
        if name == "_enter_gen":
            syncs = owner.level > 0 and (owner.command_queue or status == pq.TransactionStatus.ACTIVE)
            return "SYNC (nested conn.pipeline())" if syncs else None
        return "SYNC (end of conn.pipeline())" if name == "_exit_gen" else "SYNC (pipeline)"
    if name == "_declare_gen" and isinstance(owner, psycopg.ServerCursor):
        # A library's own server-side cursor class (conn.cursor(name) is labelled by TracedServerCursor);
        # its name is left out: Django's carries the thread's ident, another in every run.
        query = _describe(owner, _generator_local(gen, "query"), _generator_local(gen, "params"))
        return f"DECLARE CURSOR FOR {query}"
    if name == "_close_gen" and isinstance(owner, psycopg.ServerCursor):
        sane = status in (pq.TransactionStatus.IDLE, pq.TransactionStatus.INTRANS)
        if not sane or (status == pq.TransactionStatus.IDLE and not owner.withhold):
            return None
    if isinstance(owner, psycopg.Transaction):
        if name == "_enter_gen":
            return _GEN_LABELS[name] if status == pq.TransactionStatus.IDLE else "SAVEPOINT (conn.transaction())"
        if name == "_exit_gen":
            kept = _generator_local(gen, "exc_val") is None and not owner.force_rollback
            if owner._outer_transaction:
                return _GEN_LABELS[name] if kept else "ROLLBACK (end of conn.transaction())"
            return "RELEASE (end of conn.transaction())" if kept else "ROLLBACK TO (end of conn.transaction())"
    return _GEN_LABELS.get(name, name or "psycopg")


def _generator_self(gen: Any) -> object:
    """The object whose method made ``gen`` (its ``self``, bound before the generator starts)."""
    return _generator_local(gen, "self")


def _generator_local(gen: Any, name: str) -> object:
    frame = getattr(gen, "gi_frame", None)  # None for psycopg's C generators: none of them is client-side
    return None if frame is None else frame.f_locals.get(name)


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


def _ask(gate: Gate, label: str) -> None:
    """In the session's thread: park at a statement until the scheduler lets it go."""
    if gate.end_location is not None:
        request = dataclasses.replace(gate.end_location, sql=label)
    else:
        path, line = caller(gate.framework)
        request = Request(label, f"{path}:{line}", line)
    with gate.cond:
        gate.request, gate.state, gate.since = request, "ready", time.perf_counter()
        gate.cond.notify_all()
        while not gate.permitted and not gate.stopping:
            gate.cond.wait()
        if gate.stopping:
            raise Stop
        gate.permitted = False


def _strayed(gate: Gate | None, why: str) -> None:
    """A send the scheduler cannot order (another thread's, an earlier run's connection): refused, and remembered."""
    path, line = caller(gate.framework if gate is not None else ())
    if gate is not None:
        with gate.cond:
            gate.strayed = gate.strayed or f"at {path}:{line}: {why}"
    raise CodeError(f"{why}; pgrace did not order that statement", path, line)


def _finish(gate: Gate, outcome: Outcome, conn: TracedConnection) -> None:
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


# -- connections opened behind pgrace's back ----------------------------------------------------

_GUARD_LOCK = threading.Lock()
_GUARD_DEPTH = 0
_GUARDED: dict[str, list[str]] = {}  # a running code run's database -> connections to it refused outside sessions
_PATCHED: list[tuple[Any, str, Any]] = []  # (owner, attribute, original) to put back
DRIVERS = ("psycopg2", "asyncpg")  # imported (if installed) when a run starts, so that their connect is guarded
_MISSING: set[str] = set()  # drivers not installed: not looked for again at every run


def _refuse(call: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A connection the scheduler would not see: refused from a session's thread, or to a running run's database."""
    gate = GATES.get(threading.get_ident())
    path, line = caller(gate.framework if gate is not None else ())
    if gate is not None:
        with gate.cond:
            gate.intruded = gate.intruded or f"{path}:{line} ({call})"
        raise CodeError(
            f"session {gate.name} opened a connection of its own; use the connection pgrace passes it", path, line
        )
    target = " ".join(map(str, args)) + " " + " ".join(f"{k}={v}" for k, v in kwargs.items())
    with _GUARD_LOCK:
        database = next((db for db in _GUARDED if db in target), None)
        if database is not None:
            _GUARDED[database].append(f"{path}:{line} ({call})")
    if database is not None:
        raise CodeError("a thread that is no session's opened a connection to a code run's database", path, line)


def _guard_sync(call: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _refuse(call, args[1:] if args and isinstance(args[0], type) else args, kwargs)
        return original(*args, **kwargs)

    return guarded


def _guard_async(call: str, original: Callable[..., Any]) -> Callable[..., Any]:
    async def guarded(*args: Any, **kwargs: Any) -> Any:
        _refuse(call, args[1:] if args and isinstance(args[0], type) else args, kwargs)
        return await original(*args, **kwargs)

    return guarded


def _patch_connects() -> None:
    """Every connect pgrace knows of, guarded: psycopg's (sync and async), psycopg2's, asyncpg's."""
    for cls, kind in ((psycopg.Connection, _guard_sync), (psycopg.AsyncConnection, _guard_async)):
        original = cls.__dict__["connect"]
        _PATCHED.append((cls, "connect", original))
        cls.connect = classmethod(kind(f"{cls.__module__}.{cls.__name__}.connect", original.__func__))  # type: ignore[method-assign,assignment]
    _PATCHED.append((psycopg, "connect", psycopg.connect))
    psycopg.connect = psycopg.Connection.connect
    for name in DRIVERS:
        if name in _MISSING:
            continue
        try:
            module = importlib.import_module(name)
        except ImportError:
            _MISSING.add(name)
            continue
        owners: list[Any] = [module, getattr(module, "connection", None)] if name == "asyncpg" else [module]
        for owner in owners:
            original = getattr(owner, "connect", None)
            if owner is None or original is None:
                continue
            kind = _guard_async if inspect.iscoroutinefunction(original) else _guard_sync
            _PATCHED.append((owner, "connect", original))
            owner.connect = kind(f"{name}.connect", original)


@contextlib.contextmanager
def connections_guarded(database: str) -> Iterator[list[str]]:
    """While sessions run, no connection pgrace could not order: a connect from a session's thread is refused,
    and so is one to ``database`` from any thread; yields where the latter were tried."""
    global _GUARD_DEPTH
    with _GUARD_LOCK:
        if _GUARD_DEPTH == 0:
            _patch_connects()
        _GUARD_DEPTH += 1
        refused = _GUARDED.setdefault(database, [])
    try:
        yield refused
    finally:
        with _GUARD_LOCK:
            _GUARDED.pop(database, None)
            _GUARD_DEPTH -= 1
            if _GUARD_DEPTH == 0:
                while _PATCHED:
                    owner, attribute, original = _PATCHED.pop()
                    setattr(owner, attribute, original)


class ThreadSession:
    """The application's session as a :class:`~pgrace.engine.session.LiveSession`: its connection and gate."""

    lost: SessionLost | None = None  # pgrace never loses a code session's connection on purpose
    ended: SessionLost | None = None

    def __init__(self, name: str, conn: TracedConnection, step_timeout: float = 10.0) -> None:
        self.name = name
        self.conn = conn
        self.pid = conn.pgconn.backend_pid
        self.step_timeout = step_timeout
        self._cancel = conn.pgconn.get_cancel()  # made here: a thread inside execute holds the connection
        self.gate = Gate(name, threading.Condition())  # each run gives it a new one, on the scheduler's condition
        self.active: Active | None = None
        self.last_seq = 0
        self.notices = 0
        self.variables: dict[str, Value] = {}
        self.attempts: dict[str, int] = {}

    @property
    def busy(self) -> bool:
        return self.active is not None

    def transaction_status(self) -> pq.TransactionStatus:
        return pq.TransactionStatus(self.conn.pgconn.transaction_status)

    def cancel(self) -> None:
        with contextlib.suppress(psycopg.Error):  # the statement may have ended meanwhile
            self._cancel.cancel()

    def send(self, text: str, active: Active) -> Outcome | None:
        """Let the thread parked at this statement go."""
        self.gate.permit()
        return None

    def collect(self, active: Active) -> tuple[Outcome, str | None]:
        """The statement's outcome as its thread saw it; pgrace's cancel says so."""
        with self.gate.cond:
            assert self.gate.finished is not None
            outcome, _ = self.gate.finished
        if active.cancelled:
            outcome = cancelled_by_pgrace(outcome, f"the step timeout {self.step_timeout:g} s")
        return outcome, None

    def ended_status(self, active: Active) -> tuple[bool, pq.TransactionStatus]:
        with self.gate.cond:
            assert self.gate.finished is not None
            return False, self.gate.finished[1]

    def heard(self, recorder: Recorder, inspector: Inspector) -> None:
        """The step is reported: its thread's answer is taken (the connection is the thread's, not read here)."""
        with self.gate.cond:
            self.gate.finished = None

    def lose(self, active: Active, received: SqlError | None, libpq: str) -> SqlError:
        raise AssertionError("a code session's connection is never sent on by the scheduler")

    def start(self, fn: SessionCode) -> None:
        """Run ``fn`` on the connection in a thread of its own; it parks at its first statement."""
        gate, conn = self.gate, self.conn

        def main() -> None:
            GATES[threading.get_ident()] = gate
            try:
                try:
                    fn(conn)
                except Stop:
                    return
                except BaseException as exc:
                    gate.raised = exc
                if not gate.stopping and conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
                    # what a pool or a context manager does with a transaction left open: roll it back
                    gate.end_location = Request("ROLLBACK", f"(end of {gate.name})", None)
                    with contextlib.suppress(Exception, Stop):
                        conn.rollback()
            finally:
                GATES.pop(threading.get_ident(), None)
                with gate.cond:
                    gate.state, gate.since = "done", time.perf_counter()
                    gate.cond.notify_all()

        conn._lent, conn._owner = True, gate
        gate.since = time.perf_counter()
        gate.thread = threading.Thread(target=main, name=f"pgrace session {gate.name}", daemon=True)
        gate.thread.start()

    def join(self, timeout: float) -> bool:
        """Wait for the thread (already told to stop); cancel a statement it is inside. False: it is stuck.

        The connection is left idle for the next run.
        """
        thread = self.gate.thread
        if thread is None:
            return True
        thread.join(timeout)
        if thread.is_alive():  # inside a statement: cancel it, then give it one more chance
            self.cancel()
            thread.join(timeout)
        if thread.is_alive():
            return False
        self.conn._lent, self.conn._owner = False, None
        if self.conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                self.conn.rollback()
        return True
