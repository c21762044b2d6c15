"""``pgrace explore``: run every interleaving of a scenario's steps and group the outcomes.

An *interleaving* is an order of all the scenario's steps that keeps each session's own
order, and runs a step that uses a variable another session captures after the step that
captures it. The :class:`Space` counts them and numbers them 0 … size-1 in a fixed order
(session by session, like counting in a mixed radix), so that a seeded sample
(``--max N --seed S``) and a shard (``--shard K/N``: every N-th of the chosen numbers)
are both just sets of numbers, and shards add up to the whole.

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
parent can tell.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from pgrace import variables
from pgrace.bounds import MAX_TIED_POSITIONS, check_jobs, check_sample
from pgrace.errors import PgraceError, ScenarioError
from pgrace.model import PermutationStep, Scenario, StepExpectation
from pgrace.outcomes import (
    Observed,
    OutcomeClass,
    add_observed,
    classify,
    merge_classes,
    ordered,
    split_run,
    switches,
    whole_number,
)
from pgrace.runner import RunOptions, run_scenario
from pgrace.scratch import schema_reset_sql, scratch_database_with_schema
from pgrace.servers import ServerInfo
from pgrace.timeline import Run

__all__ = ["Exploration", "Space", "explore", "merge_explorations"]

EXPLORE_SCHEMA = "pgrace_explore"
WHOLE_SPACE_LIMIT = 100_000  # more interleavings than this are explored only as a sample (--max)
BATCH = 200  # interleavings per runner (one set of connections); results are classified per batch
PART = 2_000  # interleavings per scratch database and per worker's round: about 10 s at ~5 ms each

Position = tuple[int, ...]


class Space:
    """Every interleaving of a scenario's steps, counted and numbered without listing them.

    The number of interleavings that continue from a position (how far each session has
    got) splits into two factors: the sessions tied to each other by captures (a step
    using another session's capture, and that session) are counted over their joint
    positions, once; every other session interleaves freely with them, which is a
    multinomial coefficient. Twenty-four sessions of three steps cost nothing to count.
    """

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        order = _file_order(scenario)
        self.chains: tuple[tuple[str, ...], ...] = tuple(
            tuple(name for name in order if scenario.step(name).session == s.name) for s in scenario.sessions
        )
        self.chains = tuple(chain for chain in self.chains if chain)
        where = {name: (i, k) for i, chain in enumerate(self.chains) for k, name in enumerate(chain)}
        self.where = where
        # A step that uses another session's capture (:session.name) runs after the step that
        # captures it: the last one of that session before it in the file, else its first.
        needs: dict[str, list[tuple[int, int]]] = {}
        for position, name in enumerate(order):
            for use in variables.find(scenario.step(name).sql):
                if use.session is None or use.session == scenario.step(name).session:
                    continue
                capturing = [
                    e
                    for e in order
                    if scenario.step(e).session == use.session and use.name in {v for v, _ in scenario.step(e).capture}
                ]
                before = [e for e in capturing if order.index(e) < position]
                if capturing:
                    needs.setdefault(name, []).append(where[(before or capturing[:1])[-1]])
        self.needs = {name: tuple(pairs) for name, pairs in needs.items()}
        tied = {where[name][0] for name in self.needs} | {j for pairs in self.needs.values() for j, _ in pairs}
        self.tied = tuple(sorted(tied))
        self._slot = {i: t for t, i in enumerate(self.tied)}
        self._tied_counts: dict[Position, int] | None = None

    @property
    def size(self) -> int:
        start = tuple(0 for _ in self.chains)
        return self._counts()[tuple(0 for _ in self.tied)] * _multinomial(self._groups(start))

    def _eligible(self, at: Position) -> list[int]:
        chosen = []
        for i, chain in enumerate(self.chains):
            if at[i] < len(chain) and all(at[j] > k for j, k in self.needs.get(chain[at[i]], ())):
                chosen.append(i)
        return chosen

    def _groups(self, at: Position) -> list[int]:
        """The steps left: all the tied sessions' together, then each free session's."""
        left = [len(chain) - at[i] for i, chain in enumerate(self.chains)]
        return [sum(left[i] for i in self.tied), *(n for i, n in enumerate(left) if i not in self._slot)]

    def _counts(self) -> dict[Position, int]:
        """The tied sessions' interleavings from each of their joint positions (computed once, last first)."""
        if self._tied_counts is not None:
            return self._tied_counts
        lengths = [len(self.chains[i]) for i in self.tied]
        positions = math.prod(n + 1 for n in lengths)
        if positions > MAX_TIED_POSITIONS:
            names = ", ".join(self.scenario.step(self.chains[i][0]).session for i in self.tied)
            raise ScenarioError(
                f"cannot count the interleavings: sessions {names} use each other's captures in "
                f"{positions:,} joint positions (at most {MAX_TIED_POSITIONS:,})",
                self.scenario.source,
            )
        counts: dict[Position, int] = {}
        for at in reversed(list(itertools.product(*(range(n + 1) for n in lengths)))):
            total = 0
            for t, i in enumerate(self.tied):
                if at[t] < lengths[t] and all(
                    at[self._slot[j]] > k for j, k in self.needs.get(self.chains[i][at[t]], ())
                ):
                    total += counts[_advance(at, t)]
            counts[at] = total if any(at[t] < n for t, n in enumerate(lengths)) else 1
        self._tied_counts = counts
        return counts

    def _walk(self, at: Position, spread: int) -> list[tuple[int, int, int]]:
        """From ``at`` (``spread``: its multinomial factor), each session that can go next:
        (session, interleavings that continue that way, the multinomial factor after it)."""
        counts = self._counts()
        groups = self._groups(at)
        total = sum(groups)
        tied_at = tuple(at[i] for i in self.tied)
        branches = []
        for i in self._eligible(at):
            if i in self._slot:
                after = spread * groups[0] // total
                branches.append((i, counts[_advance(tied_at, self._slot[i])] * after, after))
            else:
                after = spread * (len(self.chains[i]) - at[i]) // total
                branches.append((i, counts[tied_at] * after, after))
        return branches

    def __iter__(self) -> Iterator[tuple[str, ...]]:
        """Every interleaving in number order: a :class:`~pgrace.engine.schedule.Schedule` of step names."""
        return (self.unrank(i) for i in range(self.size))

    def unrank(self, index: int) -> tuple[str, ...]:
        """The interleaving numbered ``index`` (0 ≤ index < size)."""
        if not 0 <= index < self.size:
            raise IndexError(index)
        at = tuple(0 for _ in self.chains)
        spread = _multinomial(self._groups(at))
        order: list[str] = []
        while len(order) < len(self.where):
            for i, below, after in self._walk(at, spread):
                if index < below:
                    order.append(self.chains[i][at[i]])
                    at, spread = _advance(at, i), after
                    break
                index -= below
        return tuple(order)

    def rank(self, order: Sequence[str]) -> int:
        """The number of an interleaving (the inverse of :meth:`unrank`)."""
        at = tuple(0 for _ in self.chains)
        spread = _multinomial(self._groups(at))
        index = 0
        for name in order:
            session, _ = self.where[name]
            for i, below, after in self._walk(at, spread):
                if i == session:
                    spread = after
                    break
                index += below
            else:
                raise ValueError(f"{name} cannot come here in an interleaving")
            at = _advance(at, session)
        return index

    def canonical(self, order: Sequence[str], sent: set[str]) -> tuple[str, ...]:
        """The lowest-numbered interleaving that sends the same steps in the same order as ``order`` did.

        Steps of a retry loop that were not sent (an attempt nobody needed, a ROLLBACK with
        no transaction to end, the rest of a failed attempt) may stand anywhere their session
        allows: the run is the same. Those are placed as early as they can go, session by
        session, the way the numbering counts. Any other step not sent (a lost session's)
        keeps ``order`` as it is.
        """
        free = {name for name in order if name not in sent}
        if not free or any(self.scenario.step(name).loop is None for name in free):
            return tuple(order)
        target = [name for name in order if name in sent]
        at = tuple(0 for _ in self.chains)
        made: list[str] = []
        sent_so_far = 0
        while len(made) < len(order):
            for i in self._eligible(at):
                name = self.chains[i][at[i]]
                if name in free or (sent_so_far < len(target) and name == target[sent_so_far]):
                    sent_so_far += name not in free
                    made.append(name)
                    at = _advance(at, i)
                    break
            else:
                return tuple(order)  # no such order: keep the interleaving as it is
        return tuple(made)

    def preference(self, launched: Sequence[str]) -> tuple[int, int]:
        """How simple an example is: (session switches, number); a launch order that is not
        a whole interleaving (a lost session's steps missing) comes last."""
        try:
            return switches(launched, self.scenario), self.rank(launched)
        except (ValueError, KeyError):
            return len(launched) + 1, self.size


def _advance(at: Position, i: int) -> Position:
    return (*at[:i], at[i] + 1, *at[i + 1 :])


def _multinomial(groups: Sequence[int]) -> int:
    """The ways to interleave groups of these sizes, each keeping its own order."""
    ways, placed = 1, 0
    for n in groups:
        placed += n
        ways *= math.comb(placed, n)
    return ways


def _file_order(scenario: Scenario) -> list[str]:
    """The steps in the file's order: a pgrace scenario's one permutation, a spec's declaration order."""
    if scenario.format == "pgrace" and len(scenario.permutations) == 1:
        return list(dict.fromkeys(p.step for p in scenario.permutations[0]))
    return [s.name for s in scenario.steps]


def choose(size: int, limit: int | None, seed: int | None, shard: tuple[int, int] = (1, 1)) -> list[int]:
    """The interleavings to run: all, or ``limit`` of them drawn with ``seed``; then this shard's share."""
    if limit is not None and limit < size:
        picked = sorted(sample(random.Random(seed if seed is not None else 0), size, limit))
    else:
        picked = list(range(size))
    k, n = shard
    return picked[k - 1 :: n]


def sample(rng: random.Random, size: int, limit: int) -> list[int]:
    """``limit`` distinct numbers below ``size``, in memory bounded by ``limit`` whatever ``size`` is.

    The very numbers ``rng.sample(range(size), limit)`` draws (CPython's algorithm, which
    needs ``len(range(size))`` to fit a C ``ssize_t``): a seed picks what it always picked.
    """
    setsize = 21  # as random.sample: a pool of all when it is smaller than the set of picks
    if limit > 5:
        setsize += 4 ** math.ceil(math.log(limit * 3, 4))
    picked: list[int] = []
    if size <= setsize:
        pool = list(range(size))
        for i in range(limit):
            j = rng.randrange(size - i)
            picked.append(pool[j])
            pool[j] = pool[size - i - 1]
        return picked
    seen: set[int] = set()
    for _ in range(limit):
        j = rng.randrange(size)
        while j in seen:
            j = rng.randrange(size)
        seen.add(j)
        picked.append(j)
    return picked


@dataclass
class Exploration:
    """The outcome classes of one variant's interleavings (or of a shard or a sample of them)."""

    scenario: str
    variant: str
    space: int
    explored: int
    seed: int | None
    classes: list[OutcomeClass] = field(default_factory=list)
    shard: tuple[int, int] = (1, 1)
    runs: int | None = None  # executions actually run (None: one per interleaving explored)
    complete: bool = True  # False: the space was cut at a limit (code's choice tree); these are the first ones
    repeats: int = 0  # explored interleavings that ran as a lower-numbered one did (retry attempts not sent)
    replayer: Callable[[OutcomeClass], Run] | None = field(default=None, repr=False, compare=False)

    def replay(self, cls: OutcomeClass) -> Run:
        """The class's example run again, fully observed (waits, rows, holders)."""
        if self.replayer is None:
            raise PgraceError("this exploration cannot replay its examples (read back from JSON)")
        return self.replayer(cls)

    def timeline(self, cls: OutcomeClass) -> str:
        """The class's example run again, as the text timeline."""
        from pgrace.render.text import render_text

        return render_text(self.replay(cls))

    @property
    def run_count(self) -> int:
        return self.explored if self.runs is None else self.runs

    @property
    def covers_all(self) -> bool:
        """Every interleaving covered, by a run or by an equivalent one."""
        return self.complete and self.explored == self.space

    @property
    def reduced(self) -> bool:
        """Whether equivalent interleavings were run once (the classes count runs, not interleavings)."""
        return self.run_count != self.explored

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON shape (docs/reference/json.md)."""
        return {
            "scenario": self.scenario,
            "variant": self.variant,
            "space": self.space,
            "explored": self.explored,
            "runs": self.run_count,
            "complete": self.covers_all,
            "repeats": self.repeats,
            "seed": self.seed,
            "classes": [c.to_dict(self.variant) for c in self.classes],
        }

    @property
    def all_ok(self) -> bool:
        return all(c.ok for c in self.classes)


def exploration_from_dict(data: dict[str, Any], space: Space) -> Exploration:
    try:
        classes = [OutcomeClass.from_dict(c, space.preference(c["example"])) for c in data["classes"]]
        return Exploration(
            str(data["scenario"]),
            str(data["variant"]),
            whole_number(data["space"], "space"),
            whole_number(data["explored"], "explored"),
            data["seed"],
            classes,
            runs=whole_number(data["runs"], "runs") if "runs" in data else None,
            complete=bool(data.get("complete", True)),
            repeats=whole_number(data.get("repeats", 0), "repeats"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ScenarioError(f"not an exploration's JSON ({exc.__class__.__name__}: {exc})") from None


def merge_explorations(parts: Sequence[Exploration]) -> Exploration:
    """Shards of one exploration (same scenario, variant, space and seed) added up."""
    if not parts:
        raise ScenarioError("nothing to merge")
    first = parts[0]
    for part in parts[1:]:
        if (part.scenario, part.variant, part.space, part.seed) != (
            first.scenario,
            first.variant,
            first.space,
            first.seed,
        ):
            raise ScenarioError(
                f"cannot merge explorations of different runs: {first.scenario} ({first.variant}, seed {first.seed})"
                f" and {part.scenario} ({part.variant}, seed {part.seed})"
            )
    explored = sum(p.explored for p in parts)
    return Exploration(
        first.scenario,
        first.variant,
        first.space,
        explored,
        first.seed,
        merge_classes(p.classes for p in parts),
        runs=sum(p.run_count for p in parts),
        repeats=sum(p.repeats for p in parts),
    )


def prepared(scenario: Scenario) -> Scenario:
    """The scenario as explore runs it: no per-step expectations; a teardown when it has none."""
    steps = tuple(dataclasses.replace(s, expect=StepExpectation()) for s in scenario.steps)
    changed = dataclasses.replace(scenario, steps=steps, other=None)
    if not scenario.teardown:
        changed = dataclasses.replace(changed, teardown=(schema_reset_sql(EXPLORE_SCHEMA),))
    return changed


def run_interleavings(
    scenario: Scenario,
    server: ServerInfo,
    orders: Sequence[tuple[str, ...]],
    step_timeout: float = 10.0,
    on_observed: Callable[[int], None] | None = None,
) -> list[Observed]:
    """Run each order as one permutation (in batches on one set of connections); classify each."""
    runnable = prepared(scenario)
    options = RunOptions(
        step_timeout=step_timeout,
        track_row_locks=False,
        checks_each_permutation=True,
        defer_busy_sessions=True,
        describe_waits=False,
        reset_sessions=True,
    )
    observed: list[Observed] = []
    space = Space(scenario)
    with scratch_database_with_schema(server, f"explore_{scenario.name}", EXPLORE_SCHEMA) as db:
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
    """One worker process per part, each with its own scratch database (see :mod:`pgrace.workers`).

    Interrupted, or when a worker fails, every worker drops its database before it exits;
    what a worker that had to be killed left is swept.
    """
    from pgrace.workers import run_in_processes

    def sweep() -> None:  # a worker that had to be killed left its scratch database
        from pgrace.scratch import sweep_leftovers

        with suppress(PgraceError):
            sweep_leftovers(server)

    calls = [(_run_part, (scenario, server, part, step_timeout)) for part in parts if part]
    return [o for observed in run_in_processes(calls, on_killed=sweep) for o in observed]


CONNECTIONS_PER_WORKER = 3  # beside a session's own: the scratch database's, the control and the observer


def _check_room(scenario: Scenario, server: ServerInfo, workers: int) -> None:
    """Refuse (exit 2) more workers than the server has connections for: each would fail on its own."""
    from pgrace.scratch import connection_room

    each = len(scenario.sessions) + CONNECTIONS_PER_WORKER
    room = connection_room(server)
    if workers * each > room.free:
        raise ScenarioError(
            f"-j {workers}: {workers} workers need {workers * each} connections ({each} each), and the server has"
            f" room for {max(0, room.free)} ({room}); lower -j to {max(1, room.free // each)} or raise max_connections",
            scenario.source,
        )


def _run_part(scenario: Scenario, server: ServerInfo, orders: list[tuple[str, ...]], step_timeout: float) -> Any:
    """A worker process's share (module level, so it can be pickled)."""
    return run_interleavings(scenario, server, orders, step_timeout)


def explore(
    scenario: Scenario,
    server: ServerInfo,
    *,
    limit: int | None = None,
    seed: int | None = None,
    shard: tuple[int, int] = (1, 1),
    jobs: int = 1,
    step_timeout: float = 10.0,
    on_progress: Callable[[int, int], None] | None = None,
    reduce: bool = True,
) -> Exploration:
    """Run the chosen interleavings of one variant and group them into outcome classes.

    ``on_progress(done, total)`` is called before the first interleaving and as they finish
    (per batch in one process; per round of ``jobs`` parts with ``-j``). The interleavings
    are numbered up front and turned into orders a part at a time, and their outcomes are
    counted into classes as each part ends: memory stays bounded by a part, not the sample.

    ``reduce`` (the whole space, one process, no shard): run one interleaving of each set
    of equivalent ones (see :mod:`pgrace.reduce`); a class then counts runs, and
    ``on_progress`` gets the runs so far and those known to be left.
    """
    check_jobs(jobs)
    check_sample(limit)
    space = Space(scenario)
    k, n = shard
    if not 1 <= k <= n:
        raise ScenarioError(f"--shard {k}/{n}: K must be between 1 and N")
    if reduce and (limit is None or limit >= space.size) and shard == (1, 1) and jobs == 1:
        from pgrace.reduce import opaque_orders

        if space.size > WHOLE_SPACE_LIMIT and (least := opaque_orders(scenario)) > WHOLE_SPACE_LIMIT:
            raise ScenarioError(
                f"{space.size:,} interleavings are too many to run them all, even reduced (at least {least:,} runs:"
                " steps outside a transaction, or that read the clock, touch every other); explore a sample with"
                " --max N [--seed S]",
                scenario.source,
            )
        return _explore_reduced(scenario, server, space, step_timeout, on_progress)
    if limit is None and space.size > WHOLE_SPACE_LIMIT:
        raise ScenarioError(
            f"{space.size:,} interleavings are too many to run them all; explore a sample with --max N [--seed S]",
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


def _explore_reduced(
    scenario: Scenario,
    server: ServerInfo,
    space: Space,
    step_timeout: float,
    on_progress: Callable[[int, int], None] | None,
) -> Exploration:
    from pgrace.reduce import explore_reduced

    classes: dict[str, OutcomeClass] = {}

    def count(one: Observed) -> None:
        add_observed(classes, one, space.preference(one.launched), scenario)

    if on_progress is not None:
        on_progress(0, 1)
    runs, complete = explore_reduced(scenario, server, step_timeout, count, on_progress, WHOLE_SPACE_LIMIT)
    return Exploration(
        scenario.name,
        scenario.variant,
        space.size,
        space.size if complete else runs,
        None,
        ordered(classes.values()),
        runs=runs,
        complete=complete,
    )


def load_explorations(texts: Iterable[tuple[str, str]], space: Space) -> list[Exploration]:
    """Parse the JSON of shards (``(name, text)`` pairs) for :func:`merge_explorations`."""
    parts = []
    for name, text in texts:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ScenarioError(f"not JSON: {exc.msg}", name, exc.lineno) from None
        except ValueError as exc:  # a number of more digits than Python converts
            raise ScenarioError(f"not an exploration's JSON ({exc})", name) from None
        if not isinstance(data, dict):
            raise ScenarioError("not an exploration's JSON (an object expected)", name)
        parts.append(exploration_from_dict(data, space))
    return parts


def replay(scenario: Scenario, server: ServerInfo, cls: OutcomeClass, step_timeout: float = 10.0) -> Run:
    """Run a class's example again as an ordinary run, fully observed (locks, waits), to show it.

    Step notes and expectations are left out: they tell the file's own order (a retry
    attempt's note stays: it says which attempt the step is).
    """
    from pgrace.one_run import run_in_scratch

    steps = tuple(
        dataclasses.replace(s, expect=StepExpectation(), note=s.note if s.attempt > 1 else "") for s in scenario.steps
    )
    one = dataclasses.replace(
        scenario, steps=steps, other=None, permutations=(tuple(PermutationStep(n) for n in cls.example),)
    )
    return run_in_scratch(one, server, RunOptions(step_timeout=step_timeout, defer_busy_sessions=True))


def same_class(run: Run, cls: OutcomeClass) -> bool:
    return classify(run).key == cls.key
