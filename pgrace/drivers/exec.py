"""A scenario file's setup and checks around ``--exec`` commands: any client, any language, interleaved.

Each command runs once per run, its connections through pgrace's proxy
(:mod:`pgrace.engine.proxy`); each statement a connection sends is a step, held until the
scheduler lets it go. :func:`run_exec` makes one run (first ready connection first, or
``order``); :func:`explore_exec` searches the orders as :func:`~pgrace.drivers.code.explore_code`
does (reduced by what the server showed each statement touch, or every order), and its
:class:`~pgrace.drivers.explore.Exploration` is ``pgrace explore``'s, judged by the file's
checks and their polarity.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import Literal

from pgrace.drivers.code import _explore_reduced, _observed, observed_switches
from pgrace.drivers.explore import Exploration
from pgrace.engine.proxy.runner import EXEC_SCHEMA, ExecRunner
from pgrace.engine.proxy.tasks import AsyncSession
from pgrace.errors import OptionError
from pgrace.model.orders.choices import Choices, ChoiceTree, NamedOrder
from pgrace.model.outcomes import OutcomeClass, add_observed, claim_of, ordered
from pgrace.model.results import Explored
from pgrace.model.scenario import Command, Scenario, merged_commands
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
    reduce: bool = True,
) -> Exploration:
    """Every order of the commands' statements (reduced: one of each set that only swaps commuting ones)."""
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

    with _runner(scenario, commands, server, step_timeout) as runner:
        if reduce:
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
    )
    found.claim = claim_of(scenario)
    return found


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
    reduce: bool = True,
    examples: Iterable[int] | Literal["all"] = (),
) -> Explored:
    """:func:`explore_exec` of the scenario's ``[exec]`` commands and ``NAME=COMMAND`` options (:func:`commands_for`);
    ``examples``: classes whose example is replayed observed."""
    found = explore_exec(scenario, commands_for(scenario, commands), server, step_timeout=step_timeout, reduce=reduce)
    result = Explored(scenario, found)
    wanted = range(1, len(found.classes) + 1) if examples == "all" else examples
    for n in wanted:
        if 1 <= n <= len(found.classes):
            result.examples[n] = found.replay(found.classes[n - 1])
    return result
