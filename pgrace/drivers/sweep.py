"""``pgrace sweep``: one scenario under every combination of parameter values, as a grid of outcomes.

Each combination is loaded afresh (``catalog.read_scenario(name, params)``: the scenario file
decides what a parameter means) and run in the file's order, or, with ``explore``, in
every interleaving. A cell holds the outcome classes (:mod:`pgrace.model.outcomes`), and a
verdict for a reader, in the words of the checks' polarity: where they are the anomaly's
signature, "occurs" or "prevented by 40001" / "prevented by blocking" / "prevented";
where they are invariants, "holds" or "fails in N/M". An error no step declares is never
quietly counted as a pass: it fails an invariant's cell, and an occurrence that raised
one is not counted as the anomaly occurring.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

from pgrace.bounds import check_combinations, check_jobs, check_sample
from pgrace.drivers.searches import Pct, PreemptionBounded, Sample, SearchMode, fitted, runs_asked
from pgrace.engine.options import RunOptions
from pgrace.errors import OptionError
from pgrace.frontends import catalog
from pgrace.model.outcomes import OutcomeClass, add_observed, classify
from pgrace.model.scenario import Scenario
from pgrace.model.sweep import Grid, GridPoint
from pgrace.servers import ServerInfo

__all__ = ["sweep"]


def signatures_of(scenario: Scenario) -> bool:
    """The scenario's checks describe the anomaly (each a bug's signature), rather than what must hold."""
    return bool(scenario.checks) and all(c.is_signature for c in scenario.checks)


def combinations(params: dict[str, list[str]]) -> list[dict[str, str]]:
    check_combinations(math.prod(len(values) for values in params.values()))
    names = list(params)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*(params[n] for n in names))]


def variants(
    ref: str, params: dict[str, list[str]], variant: str | None = None
) -> list[tuple[dict[str, str], Scenario]]:
    """``ref`` (a shipped name or a file) loaded once per combination of ``params`` values, ``variant`` chosen."""
    if not params:
        raise OptionError("a sweep needs at least one parameter and its values", "params")
    return [
        (combination, catalog.variant(catalog.read_scenario(ref, combination), variant))
        for combination in combinations(params)
    ]


def interleavings(chosen: Sequence[tuple[dict[str, str], Scenario]], search: SearchMode) -> int:
    """How many interleavings an explored sweep runs: each combination's whole space, or its sample."""
    from pgrace.model.orders.space import Space

    limit = search.size if isinstance(search, Sample) else None
    sizes = (Space(scenario).size for _, scenario in chosen)
    return sum(size if limit is None else min(size, limit) for size in sizes)


def sweep(
    chosen: Sequence[tuple[dict[str, str], Scenario]],
    params: dict[str, list[str]],
    server: ServerInfo,
    *,
    explore: SearchMode | None = None,
    jobs: int = 1,
    step_timeout: float = 10.0,
    on_cell: Callable[[int, int], None] | None = None,
    on_interleavings: Callable[[int, int], None] | None = None,
) -> Grid:
    """Run each loaded combination (see :func:`variants`) on ``server``: a grid of outcome classes.

    ``on_cell(done, total)`` follows the combinations, ``on_interleavings(done, total)`` an
    explored combination's interleavings. ``explore``: the search each combination is explored
    with (a bounded one's K and D at most what its steps allow, where they mean every schedule);
    None: each runs its file's order once.
    """
    from pgrace.drivers.explore import explore as explore_variant
    from pgrace.drivers.one_run import run_in_scratch

    check_jobs(jobs)
    check_sample(None if explore is None else runs_asked(explore), "explore")
    cells: list[GridPoint] = []
    for done, (combination, scenario) in enumerate(chosen):
        guarantee: dict[str, Any] | None = None
        if on_cell is not None:
            on_cell(done, len(chosen))
        if explore is not None:
            found = explore_variant(
                scenario,
                server,
                search=fitted(explore, len(scenario.steps)),
                jobs=jobs,
                step_timeout=step_timeout,
                on_progress=on_interleavings,
            )
            classes = found.classes
            guarantee = found.guarantee if found.bound is not None else None
        else:
            run = run_in_scratch(scenario, server, RunOptions(step_timeout=step_timeout))
            grouped: dict[str, OutcomeClass] = {}
            observed = classify(run)
            add_observed(grouped, observed, (0, 0), scenario)  # one run, no other example to prefer
            classes = list(grouped.values())
        cells.append(GridPoint(combination, classes, scenario.variant, signatures_of(scenario), guarantee))
    if on_cell is not None:
        on_cell(len(chosen), len(chosen))
    first = chosen[0][1]
    return Grid(first.name, first.variant, params, cells, explore is not None, bound_words(explore))


def bound_words(search: SearchMode | None) -> str:
    """A bounded search, in the words that say what it covers (empty: none)."""
    if isinstance(search, PreemptionBounded):
        return f"every schedule with at most {search.bound} preemption{'s' if search.bound != 1 else ''}"
    if isinstance(search, Pct):
        from pgrace.drivers.bounded import PCT_RUNS

        return f"pct depth {search.depth}, seed {search.seed}, {search.runs or PCT_RUNS} schedules"
    return ""
