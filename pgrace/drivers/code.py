"""Interleave the application's own Python functions, statement by statement, on a real server.

Each *session* is a callable that receives a psycopg 3 connection pgrace opened and tagged
(``application_name`` ``pgrace/<name>/<session>``). It runs in a thread of its own. The
connection is a :class:`TracedConnection`: every statement it is about to send (each
``execute``, ``executemany``, COPY start, ``commit`` and ``rollback``, the BEGIN,
SAVEPOINT and COMMIT of ``conn.transaction()``, a named cursor's DECLARE, FETCH and
CLOSE) is handed to the scheduler, and the
session's thread waits there until the scheduler lets it go. So the scheduler owns the
order, one statement at a time, and nothing depends on timing (the transport:
:mod:`pgrace.engine.threads.session`).

The scheduler (:class:`pgrace.engine.scheduler.Scheduler`, the one scenario steps run on, in the order
of :class:`pgrace.engine.threads.order.CodeOrder`) lets one statement go,
then waits until every session is settled: parked at its next statement, finished, or *seen blocked by the server* (the
runner's probe, :meth:`~pgrace.engine.observe.locks.LockInspector.is_blocked`, asked from the observer
connection while the session's thread is inside psycopg's ``execute``). A blocked session
stays pending while the others go on, exactly as in a scenario run. Each step is recorded
with the same timeline events as a scenario run (launched, waiting with the row and its
holder, finished with what released it, locks held), into a :class:`~pgrace.model.timeline.Run`
whose :class:`~pgrace.model.scenario.Scenario` is made from the steps as they were discovered, so
every renderer draws it. A step's note is its caller's ``file:line``: the innermost frame
outside psycopg, SQLAlchemy, Django, pgrace, the standard library and the modules named by
``framework_modules``. A call that sends nothing (``conn.autocommit = False`` and the other
attributes' setters, ``commit()`` when idle) is no step.

A callable's statements are only known by running it (they may depend on what it read),
so :func:`explore_code` searches the tree of "which session goes next" choices. Reduced
(the default), it is ``pgrace explore``'s search (:class:`pgrace.drivers.reduce.ChoiceSearch`):
each run follows a prefix of statements, then keeps the session going while it can
(:class:`pgrace.model.orders.choices.Follow`), and what every session held after each statement
says which statements commute. With ``reduce=False`` every schedule runs, depth first:
each run follows a prefix of choices, then takes the first ready session; the next run
changes the last choice that has an untried alternative
(:class:`pgrace.model.orders.choices.ChoiceTree`). The schema is reset between runs (one scratch
database, one backend per session, reset by DISCARD ALL and handed out as a new connection
object each run), runs are classified by
:func:`pgrace.model.outcomes.classify`, and the result is ``pgrace explore``'s
:class:`~pgrace.model.exploration.Exploration` of :class:`~pgrace.model.outcomes.OutcomeClass` es.

A run proves only what the scheduler ordered: a statement that reaches the run's database
past it fails the run with a :class:`~pgrace.errors.CodeError` naming the connection (a
connect of psycopg, psycopg2 or asyncpg from a session's thread, or to the run's database
from any thread; pgrace's connection used from another thread, or kept from an earlier run;
any other client backend the server lists in the run's database before a step or at the
end). Other bad input is a ``CodeError`` naming the function's ``file:line``: a session
that sends no statement, one that raises before its first statement, Python that
runs longer than the step timeout without sending anything. Setup, the final query and
teardown are bounded by the step timeout as a scenario's are, and a setup that fails is
:class:`~pgrace.errors.SetupFailed` (exit 1). A statement that runs longer than the step
timeout is cancelled, as a scenario step is (57014, an outcome), and one that outlives its
cancel ends the run (:class:`~pgrace.errors.StepsStuck`). Threads are joined, connections
closed, the scratch database dropped, whatever happens.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import itertools
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from pgrace.engine.threads.frames import display_name
from pgrace.engine.threads.order import Chooser
from pgrace.engine.threads.runner import CODE_SCHEMA, CodeRunner
from pgrace.engine.threads.session import SessionCode, TracedConnection
from pgrace.errors import CodeError
from pgrace.model.exploration import Exploration
from pgrace.model.orders.choices import Choices, ChoiceTree, Follow, NamedOrder
from pgrace.model.outcomes import Observed, OutcomeClass, add_observed, classify, ordered
from pgrace.model.timeline import Run
from pgrace.scratch import scratch_database_with_schema
from pgrace.servers import ServerInfo, open_server

__all__ = ["TracedConnection", "explore_code", "run_code", "shared_server"]

EXPLORE_LIMIT = 10_000  # runs; a bigger tree is explored up to this many and says so

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
    framework_modules: Sequence[str] = (),
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
            framework_modules=framework_modules,
        ) as runner,
    ):
        runner.has_row_locks = db.has_pgrowlocks
        yield runner


def _name_of(sessions: Mapping[str, SessionCode], name: str | None) -> str:
    """The run's name (in application_name and the timeline's title): the function's, when all sessions share it."""
    if name:
        return name
    names = {display_name(fn) for fn in sessions.values()}
    only = names.pop() if len(names) == 1 else ""
    return only if only.isidentifier() else "code"


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
    framework_modules: Sequence[str] = (),
) -> Run:
    """Run the sessions' code once, in ``order`` (session names, one per statement), fully observed.

    A session named in ``order`` that is blocked or finished is passed over until it can go
    (the next statement of it then comes first); after ``order``, the first session ready goes.
    ``final`` is a query run after the sessions; ``expect``, its rows, if they are checked.
    ``framework_modules``: module prefixes (``"myapp.db"``) whose frames a step's note passes
    over to name the application's line, besides psycopg's, SQLAlchemy's, Django's, pgrace's
    and the standard library's.
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
        framework_modules=framework_modules,
    )
    return _observed_run(runner, NamedOrder(order, list(sessions)), expect is not None)


def _observed_run(runner: contextlib.AbstractContextManager[CodeRunner], chooser: Chooser, expected: bool) -> Run:
    """One run watched in full (waits, locks), judged as code runs are (see `_verdict`)."""
    from pgrace.model.checks import evaluate

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
    reduce: bool = True,
    framework_modules: Sequence[str] = (),
) -> Exploration:
    """Run the sessions under every order of their statements (a blocked one is no choice); group the outcomes.

    The outcome key is ``pgrace explore``'s: the final query's rows, whether ``expect`` held
    (if given), and the SQLSTATEs of failed statements. Python exceptions that escape a
    session count as errors named by their class. Each class's ``statements`` are its
    simplest schedule, as ``(session, sql)`` pairs; ``found.replay(cls)`` runs it again.

    ``reduce`` (the default): orders that differ only by swapping statements that commute
    (by what the server showed each one touched, as ``pgrace explore``'s reduction) are run
    once; ``complete`` says every order was covered. Without, every order is run. Either way
    ``explored`` and ``runs`` count the runs, at most ``limit``. ``framework_modules``: as
    ``run_code``'s.
    """
    info = shared_server(server)
    name = _name_of(sessions, name)
    classes: dict[str, OutcomeClass] = {}
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
        framework_modules=framework_modules,
    )

    def count(run: Run, taken: Sequence[int], runs: int) -> None:
        observed = _observed(run, expect is not None)
        pairs = tuple((s.session, s.sql) for s in run.scenario.steps)
        before = classes.get(observed.key)
        previous = before.example if before is not None else None
        add_observed(classes, observed, (observed_switches(pairs), runs), run.scenario)
        found = classes[observed.key]
        if found.example is not previous:
            found.statements, found.choices = pairs, tuple(taken)

    with runner_for() as runner:
        if reduce:
            runs, why = _explore_reduced(runner, list(sessions), count, limit)
        else:
            tree = ChoiceTree(limit)
            for choices in tree:
                run, _ = runner.run_once(choices, observe=False)
                count(run, choices.taken, tree.explored + 1)
            runs, why = tree.explored, None if tree.complete else f"stopped at the limit of {limit} runs"

    def replay(cls: OutcomeClass) -> Run:
        return _observed_run(runner_for(), Choices(cls.choices), expect is not None)

    shown = ordered(classes.values())
    if expect is None:
        shown = [dataclasses.replace(c, summary=c.summary.replace(" · checks hold", "")) for c in shown]
    return Exploration(
        name, "code", runs, runs, None, shown, runs=runs, complete=why is None, incomplete=why, replayer=replay
    )


class Rerunnable(Protocol):
    """What the reduced search needs of a runner: one run under a chooser, and which steps were no statement."""

    raised: list[str]

    def run_once(
        self, chooser: Chooser, observe: bool, footprints: bool = False
    ) -> tuple[Run, list[tuple[str, ...]]]: ...


def _explore_reduced(
    runner: Rerunnable, names: Sequence[str], count: Callable[[Run, Sequence[int], int], None], limit: int
) -> tuple[int, str | None]:
    """The reduced search over the sessions' choices (:class:`~pgrace.drivers.reduce.ChoiceSearch`): the runs, and
    why they do not cover every order (None: they do).

    Each run follows a prefix of statements the search asks for, then keeps the session
    going while it can; what every session held after each statement says which commute.
    The search takes the code to send the same statement after the same statements: one
    that sends another (Python reading the clock, chance, state of its own) leaves the
    exploration incomplete.
    """
    from pgrace.drivers.reduce import ChoiceSearch, Trace, code_trace
    from pgrace.drivers.reduce.search import session_of

    last: list[tuple[Run, list[int]]] = []
    texts: dict[tuple[str, ...], str] = {}  # a prefix of launches: the statement its last one sent
    changed: str | None = None

    def execute(order: tuple[str, ...], avoid: frozenset[str]) -> Trace:
        nonlocal changed
        chooser = Follow([session_of(step) for step in order], avoid)
        run, _ = runner.run_once(chooser, observe=False, footprints=True)
        last[:] = [(run, chooser.taken)]
        trace = code_trace(run, runner.raised)
        sent = [s.sql for s in run.scenario.steps if s.name not in runner.raised]
        for k, sql in enumerate(sent):
            before = texts.setdefault(trace.launched[: k + 1], sql)
            if before != sql and changed is None:
                changed = (
                    f"run {search.runs + 1} sent another statement after the same statements ({sql!r}, where an"
                    f" earlier run sent {before!r}): the code depends on something besides the database"
                )
                break
        return trace

    search = ChoiceSearch(execute, names[0])

    def on_trace(trace: Trace) -> None:
        run, taken = last[0]
        count(run, taken, search.runs)

    complete = search.run(on_trace, limit)
    if changed is not None:
        return search.runs, changed
    if search.cut:
        return search.runs, f"stopped at the limit of {limit} runs"
    if not complete:
        return search.runs, (
            f"{search.diverged} of the runs did not follow the statements an earlier run sent in the same order"
            " (the code or the server answered differently)"
        )
    return search.runs, None


def observed_switches(pairs: Sequence[tuple[str, str]]) -> int:
    return sum(1 for a, b in itertools.pairwise(pairs) if a[0] != b[0])


def _observed(run: Run, expected: bool) -> Observed:
    """:func:`classify` (escaped Python exceptions are steps whose error is the class name); a final
    query without expected rows is not a check that can fail. The application's statements
    declare nothing (its own code handles an error or does not): their errors are data,
    never unexpected."""
    observed = dataclasses.replace(classify(run), unexpected=())
    if not expected:
        observed = dataclasses.replace(observed, ok=True, failed_checks=(), reproduces=None)
    return observed
