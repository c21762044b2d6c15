"""A scenario file's setup and checks around ``--exec`` commands: any client, any language, interleaved.

Each command runs once per run, its connections through pgrace's proxy
(:mod:`pgrace.engine.proxy`); each statement a connection sends is a step, held until the
scheduler lets it go. :func:`run_exec` makes one run (first ready connection first, or
``order``); :func:`explore_exec` searches the orders as :func:`~pgrace.drivers.code.explore_code`
does (reduced by what the server showed each statement touch, or every order), and its
:class:`~pgrace.model.exploration.Exploration` is ``pgrace explore``'s, judged by the file's
checks and their polarity.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Literal

from pgrace.drivers.bounded import PCT_RUNS, PREEMPTION_RUNS, Schedule, pct_order, preemption_search
from pgrace.drivers.code import _explore_reduced, _observed, observed_switches
from pgrace.drivers.exploring import choose
from pgrace.drivers.searches import REDUCED, Exhaustive, Pct, PreemptionBounded, Sample, SearchMode
from pgrace.engine.proxy.runner import EXEC_SCHEMA, ExecRunner
from pgrace.engine.proxy.tasks import AsyncSession
from pgrace.engine.threads.order import Chooser
from pgrace.errors import OptionError
from pgrace.model.exploration import Bound, Exploration
from pgrace.model.orders.choices import Choices, ChoiceTree, Follow, NamedOrder
from pgrace.model.orders.space import Space
from pgrace.model.outcomes import OutcomeClass, add_observed, claim_of, ordered
from pgrace.model.scenario import Command, PermutationStep, Scenario, merged_commands
from pgrace.model.timeline import Run
from pgrace.scratch import scratch_database_with_schema
from pgrace.servers import ServerInfo

EXPLORE_LIMIT = 10_000


def parse_exec(values: Sequence[str]) -> list[Command]:
    """``NAME=COMMAND`` options, in order; a name once (at least one)."""
    commands: list[Command] = []
    for value in values:
        name, sep, line = value.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier() or not line.strip():
            raise OptionError(f"{value!r} is not NAME=COMMAND (NAME a word)", "commands")
        if any(c.name == name for c in commands):
            raise OptionError(f"{name!r} named twice", "commands")
        commands.append(Command(name, line))
    if not commands:
        raise OptionError("at least one NAME=COMMAND", "commands")
    return commands


def commands_for(scenario: Scenario, values: Sequence[str]) -> list[Command]:
    """The scenario's ``[exec]`` commands with ``NAME=COMMAND`` options over them: a name given again replaces the
    file's command, a new one is added."""
    if not values and not scenario.commands:
        raise OptionError("at least one NAME=COMMAND, or an [exec] table in the scenario file", "commands")
    return list(merged_commands(scenario.commands, parse_exec(values) if values else ()))


@contextlib.contextmanager
def _runner(
    scenario: Scenario, commands: Sequence[Command | AsyncSession], server: ServerInfo, step_timeout: float
) -> Iterator[ExecRunner]:
    with (
        scratch_database_with_schema(server, f"exec_{scenario.name}", EXEC_SCHEMA) as db,
        ExecRunner(
            scenario, commands, db.dsn, step_timeout=step_timeout, server=server, observer_dsn=db.observer_dsn
        ) as runner,
    ):
        runner.has_row_locks = db.has_pgrowlocks
        yield runner


def _judged(run: Run) -> Run:
    from pgrace.model.checks import evaluate

    run.checks = [c for c in evaluate(run) if c.step is None]
    return run


def run_exec(
    scenario: Scenario,
    commands: Sequence[Command | AsyncSession],
    server: ServerInfo,
    *,
    order: Sequence[str] | None = None,
    step_timeout: float = 10.0,
) -> Run:
    """One run, fully observed: ``order`` names sessions one per statement, then the first ready goes."""
    with _runner(scenario, commands, server, step_timeout) as runner:
        run, _ = runner.run_once(NamedOrder(order, list(order or ())), observe=True)
    return _judged(run)


def explore_exec(
    scenario: Scenario,
    commands: Sequence[Command | AsyncSession],
    server: ServerInfo,
    *,
    step_timeout: float = 10.0,
    limit: int = EXPLORE_LIMIT,
    search: SearchMode = REDUCED,
) -> Exploration:
    """Every order of the commands' statements (``Reduced``: one of each set that only swaps commuting ones;
    ``Exhaustive``: each); or a ``Sample``, ``PreemptionBounded`` or ``Pct`` search (:func:`_explore_bounded`)."""
    classes: dict[str, OutcomeClass] = {}
    expected = bool(scenario.checks)

    def count(run: Run, taken: Sequence[int], runs: int) -> None:
        observed = _observed(run, expected)
        pairs = tuple((s.session, s.sql) for s in run.scenario.steps)
        before = classes.get(observed.key)
        previous = before.example if before is not None else None
        add_observed(classes, observed, (observed_switches(pairs), runs), run.scenario)
        found = classes[observed.key]
        if found.example is not previous:
            found.statements, found.choices = pairs, tuple(taken)

    check_exec_bounds(search)
    reduce = not isinstance(search, Exhaustive)
    with _runner(scenario, commands, server, step_timeout) as runner:
        if isinstance(search, Sample | PreemptionBounded | Pct):
            found = _explore_bounded(runner, count, search)
        elif reduce:
            # The sessions are the connections the commands open: a first run names them.
            seen, _ = runner.run_once(NamedOrder(None, []), observe=False)
            first = sorted(s.name for s in seen.scenario.sessions)[:1] or [commands[0].name]
            runs, why = _explore_reduced(runner, first, count, limit)
        else:
            tree = ChoiceTree(limit)
            for choices in tree:
                run, _ = runner.run_once(choices, observe=False)
                count(run, choices.taken, tree.explored + 1)
            runs, why = tree.explored, None if tree.complete else f"stopped at the limit of {limit} runs"

    def replay(cls: OutcomeClass) -> Run:
        with _runner(scenario, commands, server, step_timeout) as again:
            run, _ = again.run_once(Choices(cls.choices), observe=True)
        return _judged(run)

    shown = ordered(classes.values())
    if not expected:
        shown = [dataclasses.replace(c, summary=c.summary.replace(" · checks hold", "")) for c in shown]
    if isinstance(search, Sample | PreemptionBounded | Pct):
        found.classes, found.replayer, found.claim, found.subject = shown, replay, claim_of(scenario), scenario
        return found
    found = Exploration(
        scenario.name,
        scenario.variant,
        runs,
        runs,
        None,
        shown,
        runs=runs + 1 if reduce else runs,  # the reduced search's first run names the connections
        complete=why is None,
        incomplete=why,
        replayer=replay,
        claim=claim_of(scenario),
        subject=scenario,
    )
    return found


def check_exec_bounds(search: SearchMode) -> None:
    """What a search over commands cannot mean, refused before any command starts."""
    if isinstance(search, Sample) and search.size < 1:
        raise OptionError(f"{search.size}: at least one run", "search")
    if isinstance(search, PreemptionBounded) and search.bound < 0:
        raise OptionError(f"{search.bound}: K is 0 or more", "search")
    if isinstance(search, Pct) and search.depth < 1:
        raise OptionError(f"{search.depth}: the depth D is 1 or more", "search")


class Recorded:
    """A chooser that records what it chose among which ready sessions: a replay's choices, a bounded search's
    schedule."""

    def __init__(self, inner: Chooser) -> None:
        self.inner = inner
        self.taken: list[int] = []
        self.launched: list[str] = []
        self.enabled: list[frozenset[str]] = []

    def __call__(self, ready: list[str]) -> str:
        name = self.inner(ready)
        self.taken.append(ready.index(name))
        self.launched.append(name)
        self.enabled.append(frozenset(ready))
        return name

    @property
    def schedule(self) -> Schedule:
        return Schedule(tuple(self.launched), tuple(self.enabled))


def statements_space(run: Run, raised: Sequence[str]) -> Space:
    """The interleavings of the statements one run sent (each connection's in its order), numbered as a scenario
    file's steps are: what a sample and PCT draw from, since an application's statements are known only by
    running it."""
    counts: dict[str, int] = {}
    steps = []
    for step in run.scenario.steps:
        if step.name not in raised:
            counts[step.session] = counts.get(step.session, 0) + 1
            steps.append(dataclasses.replace(step, name=f"{step.session}.{counts[step.session]}", capture=()))
    moved = dataclasses.replace(
        run.scenario, steps=tuple(steps), permutations=(tuple(PermutationStep(s.name) for s in steps),)
    )
    return Space(moved)


def _explore_bounded(
    runner: ExecRunner,
    count: Callable[[Run, Sequence[int], int], None],
    search: Sample | PreemptionBounded | Pct,
) -> Exploration:
    """A sample, the preemption-bounded search or PCT over the commands' statements, by the scenario files' own
    searches (:mod:`pgrace.drivers.bounded`, :func:`~pgrace.drivers.exploring.choose`).

    A first run (its sessions in the order they become ready) shows the statements: the
    sample and PCT draw orders of those (that run is counted beside the draws); a run that
    then sends other statements (the application decided otherwise) is counted and said, and
    PCT then claims no probability.
    The preemption search needs no count ahead: each run says which sessions could go.
    """
    runs = 0
    runs_asked = search.runs if isinstance(search, PreemptionBounded | Pct) else None

    seen: list[Run] = []

    def execute(chooser: Chooser) -> tuple[Run, Recorded]:
        nonlocal runs
        recorded = Recorded(chooser)
        run, _ = runner.run_once(recorded, observe=False)
        runs += 1
        count(run, recorded.taken, runs)
        seen[:] = seen or [run]
        return run, recorded

    name, variant = runner.scenario.name, runner.scenario.variant
    if isinstance(search, PreemptionBounded):  # its first run is the first ready session's, as the others' first run

        def follow(prefix: tuple[str, ...]) -> Schedule:
            return execute(Follow(prefix))[1].schedule

        ran, diverged, cut = preemption_search(follow, search.bound, runs_asked or PREEMPTION_RUNS)
        space = statements_space(seen[0], runner.raised)
        bound = Bound("preemptions", search.bound, len(space.chains), len(space.where), ran, diverged=diverged, cut=cut)
        return Exploration(name, variant, space.size, ran, None, runs=ran, complete=False, bound=bound)
    first, _ = execute(NamedOrder(None, []))
    space = statements_space(first, runner.raised)
    session_of = {name: space.scenario.step(name).session for name in space.where}
    shape = sorted(len(chain) for chain in space.chains)

    def sessions(order: Sequence[str]) -> list[str]:
        return [session_of[step] for step in order]

    def other_statements(run: Run) -> bool:
        return sorted(len(c) for c in statements_space(run, runner.raised).chains) != shape

    if isinstance(search, Pct):
        # a depth beyond the statements sent means every change point: the words say which
        pct = min(search.depth, max(len(space.where), 1))
        seeded = search.seed
        draws = runs_asked or PCT_RUNS
        rng = random.Random(seeded)
        ran_orders: set[tuple[str, ...]] = set()
        other = 0
        for _ in range(draws):
            order = tuple(sessions(pct_order(space, rng, pct)))
            if order not in ran_orders:
                ran_orders.add(order)
                other += other_statements(execute(NamedOrder(order, list(order)))[0])
        bound = Bound("pct", pct, len(space.chains), len(space.where), len(ran_orders), draws, seeded, diverged=other)
        return Exploration(name, variant, space.size, draws, seeded, runs=runs, complete=False, bound=bound)
    picked = choose(space.size, search.size, search.seed)
    other = 0
    for number in picked:
        named = sessions(space.unrank(number))
        other += other_statements(execute(NamedOrder(named, named))[0])
    why = None
    if other:
        why = f"{other} sent other statements than the first run, whose orders the sample drew"
    return Exploration(
        name,
        variant,
        space.size,
        len(picked),
        search.seed,
        runs=runs,
        complete=False,
        incomplete=why,
    )


def run_commands(
    scenario: Scenario,
    commands: Sequence[str],
    server: ServerInfo,
    *,
    order: Sequence[str] | None = None,
    step_timeout: float = 10.0,
) -> Run:
    """:func:`run_exec` of the scenario's ``[exec]`` commands and ``NAME=COMMAND`` options (:func:`commands_for`)."""
    return run_exec(scenario, commands_for(scenario, commands), server, order=order, step_timeout=step_timeout)


def explore_commands(
    scenario: Scenario,
    commands: Sequence[str],
    server: ServerInfo,
    *,
    step_timeout: float = 10.0,
    examples: Iterable[int] | Literal["all"] = (),
    search: SearchMode = REDUCED,
) -> Exploration:
    """:func:`explore_exec` of the scenario's ``[exec]`` commands and ``NAME=COMMAND`` options (:func:`commands_for`);
    ``examples``: classes whose example is replayed observed."""
    found = explore_exec(
        scenario,
        commands_for(scenario, commands),
        server,
        step_timeout=step_timeout,
        search=search,
    )
    wanted = range(1, len(found.classes) + 1) if examples == "all" else examples
    for n in wanted:
        if 1 <= n <= len(found.classes):
            found.examples[n] = found.replay(found.classes[n - 1])
    return found
