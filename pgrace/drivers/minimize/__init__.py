"""``pgrace minimize``: from a failing run to the smallest scenario that still fails the same way.

A *failure* is what a run of one order ended in, step by step: which final checks failed,
which step raised which SQLSTATE, and which steps waited (:class:`Failure`). A candidate
(some sessions, steps, setup statements or seed rows left out) is kept only when a run of
it in a reset scratch schema fails the same way: the same failing checks, the same
SQLSTATEs on the same steps, and a wait wherever the original waited.

The shrink tries, in this order, and again until a whole round keeps nothing (then no
single removal still fails: the result is *locally minimal*): each session; each
transaction of a session (BEGIN through COMMIT), then each step, a step that captures a
variable going with the steps that read it and a retry loop going whole, its attempts with
it; each setup statement; each row of a multi-row ``INSERT ... VALUES``. Then the order:
of the pairs of steps of different sessions the interleaving orders, only those the reduction's dependence relation
(:func:`pgrace.drivers.reduce.dependent`, read from a run's footprints) says do not commute
need keeping; the remaining order is laid out with the fewest session switches and kept
when it fails the same way. Last, each step's SQL is made smaller where a smaller statement
fails the same way (:mod:`pgrace.drivers.minimize.simplify`: columns, ``AND`` terms, literals).

A failure that hangs on timing or chance (``pg_sleep``, ``random()``, a sleep step, a
timeout) is run :data:`CHANCY_REPEATS` times per candidate; a candidate is kept when it
fails the same way at least as often as the original did.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from contextlib import ExitStack

from pgrace.drivers.minimize.failure import (
    CHANCY_REPEATS,
    Kept,
    chancy,
    describe_step,
    failure_of,
    sizes,
)
from pgrace.drivers.minimize.shrink import Bench, Shrink
from pgrace.drivers.minimize.statements import split_block
from pgrace.errors import OptionError, ScenarioError
from pgrace.model.minimized import Minimized, Trial
from pgrace.model.scenario import Scenario
from pgrace.model.timeline import Run
from pgrace.servers import ServerInfo

__all__ = [
    "CHANCY_REPEATS",
    "Kept",
    "chancy",
    "describe_step",
    "failing_order",
    "failure_of",
    "minimize",
]


def failing_order(
    scenario: Scenario, server: ServerInfo, cls: int | None, order: tuple[str, ...] | None, step_timeout: float
) -> tuple[str, ...]:
    """The order to start from: ``order``, class ``cls``'s example (numbered from 1, as explore does), or the file's."""
    if order is not None:
        return check_order(scenario, order)
    if cls is not None:
        from pgrace.drivers.explore import explore

        found = explore(scenario, server, step_timeout=step_timeout)
        if not 1 <= cls <= len(found.classes):
            n = len(found.classes)
            raise OptionError(f"there {'is' if n == 1 else 'are'} {n} class{'' if n == 1 else 'es'}", "cls")
        return tuple(found.classes[cls - 1].example)
    if len(scenario.permutations) != 1:
        raise OptionError(f"{scenario.name} has {len(scenario.permutations)} permutations: choose one", "order")
    return tuple(p.step for p in scenario.permutations[0])


def check_order(scenario: Scenario, order: tuple[str, ...]) -> tuple[str, ...]:
    """Every name a step of the scenario, each once, each session's steps in the file's order."""
    from pgrace.frontends.names import did_you_mean

    names = [s.name for s in scenario.steps]
    for name in order:
        if name not in names:
            raise OptionError(f"no step {name!r}{did_you_mean(name, names)}", "order")
    if len(set(order)) != len(order):
        twice = next(n for n in order if order.count(n) > 1)
        raise OptionError(f"step {twice!r} is named twice", "order")
    for session in scenario.session_names:
        mine = [n for n in order if scenario.step(n).session == session]
        if mine != [n for n in names if n in mine]:
            raise OptionError(f"session {session}'s steps are out of their order: {', '.join(mine)}", "order")
    return order


def minimize(
    scenario: Scenario,
    server: ServerInfo,
    order: tuple[str, ...],
    *,
    step_timeout: float = 10.0,
    repeats: int | None = None,
    on_trial: Callable[[Trial], None] | None = None,
) -> Minimized:
    """Shrink ``scenario`` run in ``order`` to a locally minimal scenario that fails the same way.

    ``repeats``: runs per candidate (by default 1, or :data:`CHANCY_REPEATS` when the
    failure may hang on timing or chance). Raises :class:`ScenarioError` when the order does
    not fail.
    """
    check_order(scenario, order)
    started = time.monotonic()
    with ExitStack() as stack:
        bench = Bench(scenario, server, step_timeout, stack)
        shrink = Shrink(scenario, bench, repeats, on_trial)
        start = Kept(
            tuple(s.name for s in scenario.sessions if any(scenario.step(n).session == s.name for n in order)),
            order,
            tuple(st for b, text in enumerate(scenario.setup) for st in split_block(b, text)),
        )
        failure, failed_before, last = shrink.measure(start)
        if failure is None:
            raise ScenarioError(
                f"{scenario.name} ({scenario.variant}) does not fail in this order: nothing to minimize"
                f" ({last}); start from a failing class of its exploration or a failing order of its steps",
                scenario.source,
            )
        shrink.failure, shrink.needed = failure, failed_before
        shrink.race = shrink.serial_failure(start) is not None
        shape, minimal = shrink.shrink(start)
        shape, total, kept = shrink.reorder(shape)
        shape = shrink.simplify(shape)
        final_failures = shrink.repeat_count(shape)
    result = Minimized(
        original=scenario,
        scenario=shape.scenario(scenario),
        failure=failure,
        trials=shrink.trials,
        runs=bench.runs,
        seconds=0.0,
        locally_minimal=minimal,
        repeats=shrink.repeats,
        failed_before=failed_before,
        failed_after=final_failures,
        before=sizes(scenario, start),
        after=sizes(scenario, shape),
        orders_total=total,
        orders_kept=kept,
        race=shrink.race,
        candidate_timeout=bench.timeout,
    )
    result.timeline = replay(result.scenario, server, step_timeout)
    result.seconds = time.monotonic() - started
    return result


def replay(scenario: Scenario, server: ServerInfo, step_timeout: float) -> Run:
    """The minimized scenario's run, fully observed (waits described, row locks), without expectations."""
    from pgrace.drivers.one_run import run_in_scratch
    from pgrace.engine.options import RunOptions
    from pgrace.model.scenario import StepExpectation

    steps = tuple(dataclasses.replace(s, expect=StepExpectation()) for s in scenario.steps)
    return run_in_scratch(
        dataclasses.replace(scenario, steps=steps),
        server,
        RunOptions(step_timeout=step_timeout, defer_busy_sessions=True),
    )
