"""``pgrace explore``: run every interleaving of a scenario's steps and group the outcomes.

An *interleaving* is an order of all the scenario's steps that keeps each session's own
order, and runs a step that uses a variable another session captures after the step that
captures it. The :class:`~pgrace.model.orders.space.Space` counts them and numbers them 0 … size-1 in a fixed order
(session by session, like counting in a mixed radix), so that a seeded sample
(``--max N --seed S``) and a shard of it or of every interleaving (``--shard K/N``: every
N-th of the chosen numbers) are both just sets of numbers, and shards add up to the whole.
The reduced search (the default, see :mod:`pgrace.drivers.reduce`) is split by prefixes
of the numbering instead (:func:`_explore_reduced`).

Each interleaving is one permutation for the ordinary runner, which runs many of them on
one set of connections in one scratch database, with the scenario's setup and teardown
around each, as isolationtester does. The final checks run after every permutation. A
step whose session is still blocked cannot be sent (one statement at a time per
connection): it is deferred until its session is free, while the other sessions' steps go
ahead, so the launch order may differ from the interleaving's own; examples show the
launch order. Each session is reset after each interleaving (an open transaction rolled
back, then ``DISCARD ALL``: advisory locks, settings, temporary tables), and
a scenario without a teardown gets one: the objects its setup made (in a schema of their
own) are dropped.

``-j N`` runs the chosen interleavings in N processes, each with its own scratch database,
in rounds of up to 2,000 interleavings per process: a round's end is the progress the
parent can tell (reduced, workers count their runs in a file the parent reads).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from pgrace.bounds import check_jobs, check_sample
from pgrace.drivers.exploring import EXPLORE_SCHEMA, choose, explore_options, prepared
from pgrace.drivers.searches import REDUCED, Pct, PreemptionBounded, Reduced, Sample, SearchMode, runs_asked
from pgrace.engine.libpq.runner import run_scenario
from pgrace.engine.options import RunOptions
from pgrace.errors import OptionError, PgraceError, ScenarioError
from pgrace.model.exploration import Exploration, SearchIdentity
from pgrace.model.orders.space import Space
from pgrace.model.outcomes import (
    Observed,
    OutcomeClass,
    add_observed,
    claim_of,
    classify,
    ordered,
    split_run,
)
from pgrace.model.scenario import PermutationStep, Scenario
from pgrace.model.timeline import Run
from pgrace.scratch import scratch_database_with_schema
from pgrace.servers import ServerInfo

if TYPE_CHECKING:
    pass

__all__ = ["explore"]

WHOLE_SPACE_LIMIT = 100_000  # more interleavings than this are explored only as a sample (--max)
BATCH = 200  # interleavings per runner (one set of connections); results are classified per batch
ROOTS_PER_WORKER = 4  # -j reduced: prefixes per worker, taken as each gets free (the first ones take the most runs)
WORK_PREFIX = "pgrace-explore-"  # the -j workers' shared claims, in a directory named for this process
PART = 2_000  # interleavings per scratch database and per worker's round: about 10 s at ~5 ms each


def run_interleavings(
    scenario: Scenario,
    server: ServerInfo,
    orders: Sequence[tuple[str, ...]],
    step_timeout: float = 10.0,
    on_observed: Callable[[int], None] | None = None,
) -> list[Observed]:
    """Run each order as one permutation (in batches on one set of connections); classify each."""
    runnable = prepared(scenario)
    options = explore_options(step_timeout)
    observed: list[Observed] = []
    space = Space(scenario)
    with scratch_database_with_schema(server, f"explore_{scenario.name}", EXPLORE_SCHEMA, False) as db:
        for start in range(0, len(orders), BATCH):
            batch = orders[start : start + BATCH]
            perms = tuple(tuple(PermutationStep(name) for name in order) for order in batch)
            run = run_scenario(
                dataclasses.replace(runnable, permutations=perms),
                db.dsn,
                server_version=server.version,
                server_label=server.label,
                row_locks_available=False,
                options=options,
                observer_dsn=db.observer_dsn,
            )
            for order, one in zip(batch, split_run(run), strict=True):
                found = classify(one)
                if (alike := space.canonical(order, set(found.launched))) != tuple(order):
                    found = dataclasses.replace(found, same_as=space.rank(alike))
                observed.append(found)
            if on_observed is not None:
                on_observed(len(observed))
    return observed


def _run_in_processes(
    scenario: Scenario, server: ServerInfo, parts: list[list[tuple[str, ...]]], step_timeout: float
) -> list[Observed]:
    """One worker process per part, each with its own scratch database (see :mod:`pgrace.drivers.workers`).

    Interrupted, or when a worker fails, every worker drops its database before it exits;
    what a worker that had to be killed left is swept.
    """
    calls = [(_run_part, (scenario, server, part, step_timeout)) for part in parts if part]
    return [o for observed in _in_processes(server, calls) for o in observed]


def _in_processes(
    server: ServerInfo,
    calls: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]],
    on_wait: Callable[[], None] | None = None,
) -> list[Any]:
    from pgrace.drivers.workers import run_in_processes

    def sweep() -> None:  # a worker that had to be killed left its scratch database
        from pgrace.scratch import sweep_leftovers

        with suppress(PgraceError):
            sweep_leftovers(server)

    return run_in_processes(calls, on_killed=sweep, on_wait=on_wait)


CONNECTIONS_PER_WORKER = 3  # beside a session's own: the scratch database's, the control and the observer


def _check_room(scenario: Scenario, server: ServerInfo, workers: int) -> None:
    """Refuse (exit 2) more workers than the server has connections for: each would fail on its own."""
    from pgrace.scratch import connection_room

    each = len(scenario.sessions) + CONNECTIONS_PER_WORKER
    room = connection_room(server)
    if workers * each > room.free:
        raise OptionError(
            f"{workers}: {workers} workers need {workers * each} connections ({each} each), and the server has"
            f" room for {max(0, room.free)} ({room}); run {max(1, room.free // each)} or raise max_connections",
            "jobs",
        )


def _run_part(scenario: Scenario, server: ServerInfo, orders: list[tuple[str, ...]], step_timeout: float) -> Any:
    """A worker process's share (module level, so it can be pickled)."""
    return run_interleavings(scenario, server, orders, step_timeout)


def explore(
    scenario: Scenario,
    server: ServerInfo,
    *,
    search: SearchMode = REDUCED,
    shard: tuple[int, int] = (1, 1),
    jobs: int = 1,
    step_timeout: float = 10.0,
    on_progress: Callable[[int, int], None] | None = None,
) -> Exploration:
    """Run the interleavings ``search`` chooses of one variant and group them into outcome classes.

    ``on_progress(done, total)`` is called before the first interleaving and as they finish
    (per batch in one process; per round of ``jobs`` parts with ``-j``). The interleavings
    are numbered up front and turned into orders a part at a time, and their outcomes are
    counted into classes as each part ends: memory stays bounded by a part, not the sample.

    :class:`~pgrace.drivers.searches.Reduced` (the whole space): run one interleaving of each
    set of equivalent ones (see :mod:`pgrace.drivers.reduce`); a class then counts runs, and
    ``on_progress`` gets the runs so far and those known to be left (:func:`reduces` says when
    it applies). :class:`~pgrace.drivers.searches.PreemptionBounded` and
    :class:`~pgrace.drivers.searches.Pct`: a bounded search (see :mod:`pgrace.drivers.bounded`),
    in one process.
    """
    found = _explore(scenario, server, search, shard, jobs, step_timeout, on_progress)
    found.claim, found.subject = claim_of(scenario), scenario
    return found


def _explore(
    scenario: Scenario,
    server: ServerInfo,
    search: SearchMode,
    shard: tuple[int, int],
    jobs: int,
    step_timeout: float,
    on_progress: Callable[[int, int], None] | None,
) -> Exploration:
    from pgrace.drivers.bounded import check_bounds

    check_jobs(jobs)
    check_sample(runs_asked(search), "search")
    space = Space(scenario)
    k, n = shard
    if not 1 <= k <= n:
        raise OptionError(f"{k}/{n}: K must be between 1 and N", "shard")
    check_bounds(space, search, shard, jobs)
    if isinstance(search, PreemptionBounded | Pct):
        return _explore_bounded(scenario, server, space, step_timeout, on_progress, search)
    limit, seed = (search.size, search.seed) if isinstance(search, Sample) else (None, None)
    reduce = search.reduce if isinstance(search, Sample) else isinstance(search, Reduced)
    reduced = reduce and reduces(scenario, space, limit, shard, jobs)
    sample = limit is not None and limit < space.size
    identity = SearchIdentity.of(scenario, reduced, limit if sample else None, seed if sample else None, step_timeout)
    found = _explore_space(scenario, server, space, limit, seed, shard, jobs, step_timeout, on_progress, reduced)
    return dataclasses.replace(found, search=identity)


def _explore_space(
    scenario: Scenario,
    server: ServerInfo,
    space: Space,
    limit: int | None,
    seed: int | None,
    shard: tuple[int, int],
    jobs: int,
    step_timeout: float,
    on_progress: Callable[[int, int], None] | None,
    reduced: bool,
) -> Exploration:
    """Every interleaving, a sample of them, or the reduced search; of one shard."""
    if reduced:
        from pgrace.drivers.reduce import opaque_orders

        if space.size > WHOLE_SPACE_LIMIT and (least := opaque_orders(scenario)) > WHOLE_SPACE_LIMIT:
            raise ScenarioError(
                f"{space.size:,} interleavings are too many to run them all, even reduced (at least {least:,} runs:"
                " steps outside a transaction, or that read the clock, touch every other); explore a sample of"
                " them",
                scenario.source,
            )
        return _explore_reduced(scenario, server, space, step_timeout, on_progress, shard, jobs)
    if limit is None and space.size > WHOLE_SPACE_LIMIT:
        raise ScenarioError(
            f"{space.size:,} interleavings are too many to run them all; explore a sample of them",
            scenario.source,
        )
    indices = choose(space.size, limit, seed, shard)
    total = len(indices)
    whole = limit is None or limit >= space.size
    picked = set() if whole else set(choose(space.size, limit, seed))  # every shard's: a repeat is decided alike

    def report(done: int) -> None:
        if on_progress is not None:
            on_progress(done, total)

    workers = jobs if jobs > 1 and total >= 2 else 1
    if workers > 1:
        _check_room(scenario, server, workers)
    report(0)
    classes: dict[str, OutcomeClass] = {}
    repeats = 0
    done = 0
    for start in range(0, total, PART * workers):
        orders = [space.unrank(i) for i in indices[start : start + PART * workers]]
        if workers == 1:

            def so_far(n: int, before: int = done) -> None:
                report(before + n)

            observed = run_interleavings(scenario, server, orders, step_timeout, on_observed=so_far)
        else:
            observed = _run_in_processes(scenario, server, [orders[w::workers] for w in range(workers)], step_timeout)
        for one in observed:
            if one.same_as is not None and (whole or one.same_as in picked):  # counted once, as the one it repeats
                repeats += 1
                continue
            add_observed(classes, one, space.preference(one.launched), scenario)
        done += len(orders)
        report(done)
    return Exploration(
        scenario.name,
        scenario.variant,
        space.size,
        total,
        seed if limit is not None and limit < space.size else None,
        ordered(classes.values()),
        shard,
        repeats=repeats,
    )


def reduces(scenario: Scenario, space: Space, limit: int | None, shard: tuple[int, int], jobs: int) -> bool:
    """Whether explore runs the reduced search: the whole space (no sample), and, split in shards
    or processes, no retry loop (a step not sent leaves a run that no prefix of the space begins).

    Nor when the steps' text shows every order to matter, and no sleep step makes each run dear:
    the reduced search would run them all and read footprints after every step on top.
    """
    from pgrace.drivers.reduce import every_order_differs

    split = shard != (1, 1) or jobs > 1
    if (limit is not None and limit < space.size) or (split and any(s.loop for s in scenario.steps)):
        return False
    return not (all(s.sleep is None for s in scenario.steps) and every_order_differs(scenario))


def _explore_reduced(
    scenario: Scenario,
    server: ServerInfo,
    space: Space,
    step_timeout: float,
    on_progress: Callable[[int, int], None] | None,
    shard: tuple[int, int] = (1, 1),
    jobs: int = 1,
) -> Exploration:
    """The reduced search of the whole space, or of a shard of it, in one process or in ``jobs``.

    A shard is every N-th of the shortest prefixes of the interleavings there are at least
    N of (:meth:`Space.split`), each searched from where it leaves off
    (:class:`~pgrace.drivers.reduce.Search` rooted at it); its ``explored`` is the
    interleavings that begin with its prefixes. Worker processes search a shard's prefixes,
    made longer to be :data:`ROOTS_PER_WORKER` each at least, taking the next as each gets
    free. A root's search knows what the earlier-numbered roots cover only at its prefix (its
    sleep set), not what their searches ran: parts take more runs in all than one search.
    """
    from pgrace.drivers.reduce import explore_roots

    k, n = shard
    mine = space.split(n)[k - 1 :: n]
    roots = space.split(ROOTS_PER_WORKER * jobs, mine) if jobs > 1 else mine
    workers = min(jobs, len(roots))
    classes: dict[str, OutcomeClass] = {}

    def count(one: Observed) -> None:
        add_observed(classes, one, space.preference(one.launched), scenario)

    if on_progress is not None:
        on_progress(0, max(1, len(roots)))
    if workers <= 1:
        done = explore_roots(
            scenario, server, step_timeout, [r for r, _ in roots], count, on_progress, WHOLE_SPACE_LIMIT
        )
    else:
        _check_room(scenario, server, workers)
        done = _reduce_in_processes(scenario, server, step_timeout, [r for r, _ in roots], workers, count, on_progress)
    runs = sum(r for r, _ in done)
    if on_progress is not None:
        on_progress(runs, runs)
    explored = sum(size if complete else min(r, size) for (_, size), (r, complete) in zip(roots, done, strict=True))
    return Exploration(
        scenario.name,
        scenario.variant,
        space.size,
        explored,
        None,
        ordered(classes.values()),
        shard,
        runs=runs,
        complete=all(complete for _, complete in done),
    )


def _reduce_in_processes(
    scenario: Scenario,
    server: ServerInfo,
    step_timeout: float,
    roots: list[tuple[str, ...]],
    workers: int,
    on_observed: Callable[[Observed], None],
    on_progress: Callable[[int, int], None] | None,
) -> list[tuple[int, bool]]:
    """The roots' searches in worker processes, each taking the next root as it gets free: (runs, complete) each."""
    import os

    from pgrace.drivers.reduce import Claims, explore_part
    from pgrace.servers.processes import held_temporary_dir, sweep_dead_dirs

    sweep_dead_dirs(WORK_PREFIX)  # what a killed explore -j left
    with held_temporary_dir(WORK_PREFIX) as shared:
        claims = Claims(os.path.join(shared, "claims"))

        def tell() -> None:
            if on_progress is not None:
                taken, made = claims.read()
                on_progress(made, made + max(1, len(roots) - taken))

        call = (explore_part, (scenario, server, step_timeout, roots, claims, WHOLE_SPACE_LIMIT))
        results = _in_processes(server, [call] * workers, on_wait=tell)
    done: dict[int, tuple[int, bool]] = {}
    for observed, each in results:
        for one in observed:
            on_observed(one)
        done.update(each)
    return [done.get(i, (0, False)) for i in range(len(roots))]


def _explore_bounded(
    scenario: Scenario,
    server: ServerInfo,
    space: Space,
    step_timeout: float,
    on_progress: Callable[[int, int], None] | None,
    search: PreemptionBounded | Pct,
) -> Exploration:
    """A bounded search; ``explored`` counts its runs (PCT: the schedules drawn, a repeated one run once)."""
    from pgrace.drivers.bounded import PCT_RUNS, explore_pct, explore_preemptions

    classes: dict[str, OutcomeClass] = {}

    def count(one: Observed) -> None:
        add_observed(classes, one, space.preference(one.launched), scenario)

    if isinstance(search, PreemptionBounded):
        if on_progress is not None:
            on_progress(0, 1)
        bound = explore_preemptions(scenario, server, step_timeout, search.bound, count, on_progress, search.runs)
    else:
        draws = search.runs or PCT_RUNS
        if on_progress is not None:
            on_progress(0, draws)
        bound = explore_pct(scenario, server, step_timeout, search.depth, draws, search.seed, count, on_progress)
    return Exploration(
        scenario.name,
        scenario.variant,
        space.size,
        bound.draws if bound.kind == "pct" else bound.runs,
        bound.seed,
        ordered(classes.values()),
        runs=bound.runs,
        complete=False,
        bound=bound,
    )


def replay(scenario: Scenario, server: ServerInfo, cls: OutcomeClass, step_timeout: float = 10.0) -> Run:
    """Run a class's example again as an ordinary run, fully observed (locks, waits), to show it.

    Step notes and expectations are left out: they tell the file's own order (a retry
    attempt's note stays: it says which attempt the step is). The errors they declare stay,
    declared in every order.
    """
    from pgrace.drivers.one_run import run_in_scratch

    steps = tuple(
        dataclasses.replace(s, expect=s.expect.declarations(), note=s.note if s.attempt > 1 else "")
        for s in scenario.steps
    )
    one = dataclasses.replace(
        scenario, steps=steps, other=None, permutations=(tuple(PermutationStep(n) for n in cls.example),)
    )
    return run_in_scratch(one, server, RunOptions(step_timeout=step_timeout, defer_busy_sessions=True))


def same_class(run: Run, cls: OutcomeClass) -> bool:
    return classify(run).key == cls.key
