"""Explore with partial-order reduction: run one interleaving of each class of equivalent ones.

Two steps of different sessions *commute* when running them in either order leaves the
same state and gives each the same result; interleavings that differ only by swapping
commuting neighbours are one execution. The search is source-set DPOR with sleep sets
(Abdulla, Aronis, Jonsson, Sagonas, "Optimal dynamic partial order reduction", POPL 2014,
algorithm 1; Flanagan and Godefroid 2005) over real runs: each run is one interleaving,
and what every session held after each step (``pg_locks``, whether it keeps a snapshot,
and the rows its transaction locked or changed, from ``pgrowlocks``, each named by its
primary key so that runs compare) says which of its steps depend on which; the races
between dependent steps decide which prefixes must be run on with another session's step
next.

The dependence relation errs one way only: two steps of different sessions are
*dependent* when

* either one is *opaque*: a sleep or crash step, SQL that reads chance, the
  server's own state (``pg_*`` functions and views but advisory locks, ``txid_*``, system
  columns), that is not plain DML, a query, a lock, a cursor, a setting or transaction
  control (DDL, ``DO``, ``CALL``, ``PREPARE TRANSACTION`` ...), that pglast cannot parse,
  that failed, that ran a transaction of its own (autocommit: its locks are gone before
  they can be read), that began and ended transactions in one step, that never finished,
  or that ended a transaction (or rolled back to a savepoint) when the scenario defers
  constraints or triggers, or when the transaction kept a snapshot (REPEATABLE READ,
  SERIALIZABLE);
* both read the clock: a step whose SQL reads it as it runs (``clock_timestamp()``,
  ``statement_timestamp()``, ``timeofday()``), or the step in which a transaction began
  when a step of its session from there on reads its start time (``now()``,
  ``current_timestamp``, ``current_date``, ``localtimestamp``, ``'now'``, ``age(x)`` ...:
  fixed by the transaction's first statement, so the order of the starts orders those
  times, not the order of the steps that read them); every transaction's start when the
  setup leaves now() to a default, a function, a view or a trigger, and every step when it
  leaves clock_timestamp() to one (a setup query reads the clock once, before every step).
  Only the order of the readings is the interleaving's doing: the time between two of
  them is a sleep step's (opaque) or the machine's, not the order's;
* both run in transactions that keep a snapshot (REPEATABLE READ, SERIALIZABLE:
  serialization failures are decided by the order of all their steps);
* one ends a transaction or releases a lock (COMMIT, ROLLBACK, ROLLBACK TO SAVEPOINT,
  an advisory unlock) and the other takes a snapshot, or touches anything but a table the
  ending transaction held, or a table whose locks or rows conflict with the other's (as
  below), or reads a row of a table the ending transaction changed: the keys it deleted,
  updated or locked, and those it inserted or moved a row to (``reads.py`` says which rows
  a step's text reads and which keys it makes; any other read is of every row, an
  unknown key any key);
* the scenario's final checks may see rows in the order they lie on disk (``reads.in_physical_order``),
  and both write a common table, or one of them ends a transaction and they share a table;
* they touch a common advisory key, object, or relation other than a table (a sequence,
  a view, a TOAST table ...), and one of them more than reads it;
* they touch a common table (plain or partitioned; an index counts as its table) and
  their table locks conflict by the eight-mode table (LOCK TABLE, a write against a
  SHARE lock ...), or both lock or write rows of it (an INSERT too) and a row of one
  conflicts with a row of the other by the row-lock table (FOR KEY SHARE, FOR SHARE, FOR
  NO KEY UPDATE, FOR UPDATE; an UPDATE takes one of the last two, a DELETE FOR UPDATE, a
  foreign key's check FOR KEY SHARE on the parent). A plain read and another open
  transaction's change commute: neither order lets the read see it; what orders them is
  the writer's COMMIT or ROLLBACK, dependent on the read when it read a row the writer
  changed. Rows inserted by the transaction are not in its rows (its made keys are): no
  one else sees them, and a clash of keys shows as a wait.

A step's rows are every row of the table (dependent on every other step that locks or
writes rows of it) when they cannot all be named (no primary key, a row version the
observer cannot see, ``pgrowlocks`` missing, a table under ACCESS EXCLUSIVE), and for
SKIP LOCKED, NOWAIT, ON CONFLICT and MERGE: their result hangs on rows they examined and
may leave alone. A step that waited falls back to the relation-level rule on every table
it touched (the conflict the run's order hit need not be a row: two inserts of one key),
unless every reading while it was blocked shows it waiting on rows (a tuple lock), each
named by its key: then each counts as a FOR UPDATE lock of that row.

What a step touches is every lock and row its session holds after it, before it and,
when it waited, while it waited: a transaction's locks only grow until it ends, so
earlier steps' relations and rows count again (coarse, never short). A client's step through
the proxy that only parses and describes (asyncpg's Parse/Describe/Flush) runs nothing: it
touches the locks it took (parsing locks the relations its SQL names, held after it and not
before), each by its mode alone, and no row; it takes the snapshot when the backend keeps one
after it, still reading the rest of its cycle (a parse in REPEATABLE READ). A step during which
a waiting step went on carries the waiter's footprint too, and the waiter's session's
next step can only come after it (the wait's release enables it; a step using another
session's capture likewise comes after the step that captured it). The interleavings of
a scenario whose final checks read system columns are all run (every step opaque); a final
check's clock reads come after every step's in any order, and the times it shows classify
by their order (:func:`pgrace.model.outcomes.classify`), never by the wall clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager

from pgrace.drivers.reduce.moves import Access, Move, Trace, dependent, moves_of
from pgrace.drivers.reduce.nature import Nature, every_order_differs, nature_of, opaque_orders
from pgrace.drivers.reduce.search import ChoiceSearch, Search
from pgrace.model.outcomes import Observed, classify
from pgrace.model.scenario import PermutationStep, Scenario
from pgrace.model.timeline import PermutationStarted, Run, StepFinished, StepLaunched
from pgrace.servers import ServerInfo

__all__ = [
    "Access",
    "ChoiceSearch",
    "Move",
    "Nature",
    "Search",
    "Trace",
    "code_trace",
    "dependent",
    "every_order_differs",
    "executor",
    "explore_part",
    "explore_reduced",
    "explore_roots",
    "moves_of",
    "nature_of",
    "opaque_orders",
]


@contextmanager
def executor(
    scenario: Scenario, server: ServerInfo, step_timeout: float, footprints: bool = True
) -> Iterator[Callable[[tuple[str, ...]], Trace]]:
    """Runs one interleaving at a time on one set of connections, in one scratch database.

    Without ``footprints`` nothing is read after each step: every move is opaque, and the
    trace says only the launch order and who could go when (what the bounded searches need).
    """
    from pgrace.drivers.exploring import EXPLORE_SCHEMA, explore_options, prepared
    from pgrace.engine.libpq.runner import Runner
    from pgrace.model.orders.space import Space
    from pgrace.scratch import scratch_database_with_schema

    runnable = dataclasses.replace(prepared(scenario), permutations=())
    options = explore_options(step_timeout, footprints=footprints)
    space = Space(scenario)
    natures = {s.name: nature_of(s, scenario) for s in scenario.steps}
    needs = {name: tuple(space.chains[i][k] for i, k in pairs) for name, pairs in space.needs.items()}
    with scratch_database_with_schema(server, f"explore_{scenario.name}", EXPLORE_SCHEMA, footprints) as db:
        run = Run(runnable, server.version, server.label, False)
        with Runner(runnable, db.dsn, run, options, None, db.observer_dsn) as runner:
            count = 0

            def execute(order: tuple[str, ...]) -> Trace:
                nonlocal count
                del run.events[:]
                runner.run_one(count, tuple(PermutationStep(name) for name in order))
                count += 1
                one = Run(runnable, server.version, server.label, False)
                one.events = [e for e in run.events]
                assert one.events and isinstance(one.events[0], PermutationStarted)
                return moves_of(one, scenario, natures, needs)

            yield execute


def code_trace(run: Run, raised: Collection[str]) -> Trace:
    """A run of the application's code as the moves :class:`ChoiceSearch` reads (``raised``: its exception steps).

    Its scenario is the one made from the statements as they were met, each one's nature
    read from its SQL. An exception that escaped a session's code is no move: it sends
    nothing, and no choice launches it (it comes as the session's last statement ends), so
    only its outcome counts. The other steps are named again ``session.k``, a session's
    k-th statement, so that a name says which choice of the session it was.
    """
    scenario = run.scenario
    names: dict[str, str] = {}
    counts: dict[str, int] = {}
    for step in scenario.steps:
        if step.name not in raised:
            counts[step.session] = counts.get(step.session, 0) + 1
            names[step.name] = f"{step.session}.{counts[step.session]}"
    steps = tuple(dataclasses.replace(s, name=names[s.name]) for s in scenario.steps if s.name in names)
    moved = dataclasses.replace(scenario, steps=steps, permutations=(tuple(PermutationStep(s.name) for s in steps),))
    dropped = {e.seq for e in run.events if isinstance(e, StepLaunched) and e.step not in names}
    one = Run(moved, run.server_version, run.server_label, run.row_locks_available)
    for event in run.events:
        if isinstance(event, StepLaunched | StepFinished) and event.seq in dropped:
            continue
        if isinstance(event, StepLaunched):
            event = dataclasses.replace(event, step=names[event.step])
        one.events.append(event)
    natures = {s.name: nature_of(s, moved) for s in steps}
    return dataclasses.replace(moves_of(one, moved, natures, {}), observed=classify(run))


def explore_reduced(
    scenario: Scenario,
    server: ServerInfo,
    step_timeout: float,
    on_observed: Callable[[Observed], None],
    on_progress: Callable[[int, int], None] | None = None,
    max_runs: int | None = None,
) -> tuple[int, bool]:
    """Run the reduced search; ``on_observed`` gets each run's outcome. Returns (runs, complete).

    ``on_progress(runs, runs + known to be left)`` after each run.
    """
    ((runs, complete),) = explore_roots(scenario, server, step_timeout, [()], on_observed, on_progress, max_runs)
    return runs, complete


def explore_roots(
    scenario: Scenario,
    server: ServerInfo,
    step_timeout: float,
    roots: Sequence[tuple[str, ...]],
    on_observed: Callable[[Observed], None],
    on_progress: Callable[[int, int], None] | None = None,
    max_runs: int | None = None,
) -> list[tuple[int, bool]]:
    """The reduced search rooted at each prefix in turn, on one set of connections: (runs, complete) each.

    ``complete``: every interleaving that begins with the root is covered (by a run of this
    search, by the search of the prefix those interleavings do launch as when the root cannot
    be launched as it is, or by an earlier-numbered root's, which the partition's other roots
    must then cover). ``max_runs`` bounds the runs of all the roots; ``on_progress`` counts
    them all, each root not begun as one run to come.
    """
    if not roots:
        return []
    taken = iter(range(len(roots)))
    total = [0, 0]  # runs, roots searched

    def progress(runs: int, known: int) -> None:
        if on_progress is not None:
            on_progress(total[0] + runs, total[0] + known + len(roots) - total[1] - 1)

    def ran(runs: int) -> None:
        total[0] += runs
        total[1] += 1

    done = _search_roots(
        scenario, server, step_timeout, roots, lambda: next(taken, None), on_observed, progress, ran, max_runs
    )
    return [done.get(i, (0, False)) for i in range(len(roots))]


def _search_roots(
    scenario: Scenario,
    server: ServerInfo,
    step_timeout: float,
    roots: Sequence[tuple[str, ...]],
    take: Callable[[], int | None],
    on_observed: Callable[[Observed], None],
    on_progress: Callable[[int, int], None],
    on_done: Callable[[int], int | None],
    max_runs: int | None,
    share: bool = True,
) -> dict[int, tuple[int, bool]]:
    """Search the roots ``take()`` hands out (by index, None: no more) until the runs reach ``max_runs``.

    ``on_done(runs)`` after each root; it may return the runs all the searches have made so far.
    ``share``: the moves one root's search saw spare the next ones runs; without, each root's
    runs are the same whichever went before it (roots taken in any order).
    """
    done: dict[int, tuple[int, bool]] = {}
    known: dict[tuple[tuple[str, ...], str], Move] = {}
    total = 0
    with executor(scenario, server, step_timeout) as execute:
        while (max_runs is None or total < max_runs) and (i := take()) is not None:
            search = Search(scenario, execute, on_progress, roots[i], known if share else {})
            complete = search.run(
                lambda trace: on_observed(trace.observed), None if max_runs is None else max_runs - total
            )
            done[i] = (search.runs, complete)
            total = on_done(search.runs) or total + search.runs
    return done


class Claims:
    """A file worker processes share, under a lock: the next root to take, and the runs made so far."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "w") as f:
            f.write("0 0")

    def _add(self, claimed: int, runs: int) -> tuple[int, int]:
        import fcntl

        with open(self.path, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # released as the file closes
            taken, made = (int(n) for n in f.read().split())
            f.seek(0)
            f.truncate()
            f.write(f"{taken + claimed} {made + runs}")
        return taken, made + runs

    def take(self) -> int:
        return self._add(1, 0)[0]

    def ran(self, runs: int) -> int:
        return self._add(0, runs)[1]

    def read(self) -> tuple[int, int]:
        return self._add(0, 0)


def explore_part(
    scenario: Scenario,
    server: ServerInfo,
    step_timeout: float,
    roots: list[tuple[str, ...]],
    claims: Claims,
    max_runs: int,
) -> tuple[list[Observed], dict[int, tuple[int, bool]]]:
    """A worker process's share of a reduced search: the roots it takes from ``claims`` as it gets free.

    Module level, so it can be pickled; the runs are counted in ``claims`` as they end (the
    parent's progress), and no root is taken once all the workers' runs reach ``max_runs``.
    Which worker takes which root is chance: no root's search uses another's moves, so that
    the runs, and the classes' counts, are the same from one exploration to the next.
    """
    observed: list[Observed] = []

    def take() -> int | None:
        i = claims.take()
        return i if i < len(roots) else None

    def observe(one: Observed) -> None:
        observed.append(one)
        claims.ran(1)

    def nothing(runs: int, known: int) -> None:
        pass

    def made(runs: int) -> int:
        return claims.read()[1]

    done = _search_roots(scenario, server, step_timeout, roots, take, observe, nothing, made, max_runs, share=False)
    return observed, done
