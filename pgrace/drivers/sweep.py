"""``pgrace sweep``: one scenario under every combination of parameter values, as a grid of outcomes.

Each combination is loaded afresh (``catalog.load(name, params)``: the scenario file
decides what a parameter means) and run in the file's order, or, with ``explore``, in
every interleaving. A cell holds the outcome classes (:mod:`pgrace.model.outcomes`), and a
verdict for a reader: for a bug variant, whose final checks describe the anomaly,
"occurs" or "prevented by 40001" / "prevented by blocking" / "prevented"; for a fix,
"holds" or "fails".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pgrace.bounds import check_combinations, check_jobs, check_sample
from pgrace.engine.runner import RunOptions
from pgrace.errors import ScenarioError
from pgrace.formats import catalog
from pgrace.model.outcomes import OutcomeClass, add_observed, classify
from pgrace.model.scenario import Scenario
from pgrace.servers import ServerInfo

__all__ = ["GridPoint", "Sweep", "sweep", "verdict"]


@dataclass
class GridPoint:
    """One point of the parameter grid: its params, and the outcome classes its interleavings fell into."""

    params: dict[str, str]
    classes: list[OutcomeClass]
    variant: str

    def to_dict(self) -> dict[str, Any]:
        return {"params": dict(self.params), "classes": [c.to_dict(self.variant) for c in self.classes]}

    @property
    def verdict(self) -> str:
        return verdict(self.classes, self.variant)


@dataclass
class Sweep:
    scenario: str
    variant: str
    params: dict[str, list[str]]
    cells: list[GridPoint] = field(default_factory=list)
    explored: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON shape (docs/reference/json.md)."""
        return {"scenario": self.scenario, "params": self.params, "cells": [c.to_dict() for c in self.cells]}


def verdict(classes: Sequence[OutcomeClass], variant: str) -> str:
    """What a reader wants from a cell. A bug's checks describe the anomaly: they hold when it occurs."""
    if classes and not any(c.final for c in classes):  # no final check: no anomaly is described
        return "no checks"
    total = sum(c.count for c in classes)
    holding = sum(c.count for c in classes if c.ok)
    if variant != "bug":
        return "holds" if holding == total else f"fails in {total - holding}/{total}"
    if holding:
        return "occurs" if holding == total else f"occurs in {holding}/{total}"
    errors = {code for c in classes for code in c.errors}
    serialization = sorted(code for code in errors if code.startswith("40"))
    if serialization:
        return "prevented by " + "/".join(serialization)
    if any(c.waits for c in classes):
        return "prevented by blocking"
    return "prevented"


def combinations(params: dict[str, list[str]]) -> list[dict[str, str]]:
    check_combinations(math.prod(len(values) for values in params.values()))
    names = list(params)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*(params[n] for n in names))]


def variants(
    ref: str, params: dict[str, list[str]], variant: str | None = None
) -> list[tuple[dict[str, str], Scenario]]:
    """``ref`` (a shipped name or a file) loaded once per combination of ``params`` values, ``variant`` chosen."""
    if not params:
        raise ScenarioError("sweep needs at least one -p NAME=VALUE[,VALUE...]")
    return [
        (combination, catalog.variant(catalog.load(ref, combination), variant)) for combination in combinations(params)
    ]


def interleavings(chosen: Sequence[tuple[dict[str, str], Scenario]], limit: int | None) -> int:
    """How many interleavings an explored sweep runs: each combination's whole space, or its sample."""
    from pgrace.drivers.explore import Space

    sizes = (Space(scenario).size for _, scenario in chosen)
    return sum(size if limit is None else min(size, limit) for size in sizes)


def sweep(
    chosen: Sequence[tuple[dict[str, str], Scenario]],
    params: dict[str, list[str]],
    server: ServerInfo,
    *,
    explore: bool = False,
    limit: int | None = None,
    seed: int | None = None,
    jobs: int = 1,
    step_timeout: float = 10.0,
    on_cell: Callable[[int, int], None] | None = None,
    on_interleavings: Callable[[int, int], None] | None = None,
) -> Sweep:
    """Run each loaded combination (see :func:`variants`) on ``server``: a grid of outcome classes.

    ``on_cell(done, total)`` follows the combinations, ``on_interleavings(done, total)`` an
    explored combination's interleavings.
    """
    from pgrace.drivers.explore import explore as explore_variant
    from pgrace.drivers.one_run import run_in_scratch

    check_jobs(jobs)
    check_sample(limit)
    cells: list[GridPoint] = []
    for done, (combination, scenario) in enumerate(chosen):
        if on_cell is not None:
            on_cell(done, len(chosen))
        if explore:
            found = explore_variant(
                scenario,
                server,
                limit=limit,
                seed=seed,
                jobs=jobs,
                step_timeout=step_timeout,
                on_progress=on_interleavings,
            )
            classes = found.classes
        else:
            run = run_in_scratch(scenario, server, RunOptions(step_timeout=step_timeout))
            grouped: dict[str, OutcomeClass] = {}
            observed = classify(run)
            add_observed(grouped, observed, (0, 0), scenario)  # one run, no other example to prefer
            classes = list(grouped.values())
        cells.append(GridPoint(combination, classes, scenario.variant))
    if on_cell is not None:
        on_cell(len(chosen), len(chosen))
    first = chosen[0][1]
    return Sweep(first.name, first.variant, params, cells, explore)
