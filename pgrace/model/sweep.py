"""What ``pgrace sweep`` found: a grid of outcomes per scenario, a point per combination of parameter values.

The sweep itself is :mod:`pgrace.drivers.sweep`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pgrace.errors import EXIT_OK
from pgrace.model.outcomes import OutcomeClass
from pgrace.model.timeline import Run

__all__ = ["Grid", "GridPoint", "Sweep", "verdict"]


@dataclass
class Sweep:
    """One grid per scenario; with examples, each class's example replayed, by (scenario, point, class)."""

    grids: list[Grid] = field(default_factory=list)
    examples: dict[tuple[int, int, int], Run] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Always: a sweep says what each combination did (its points' verdicts) and judges none."""
        return True

    @property
    def exit_code(self) -> int:
        """``pgrace sweep``'s: 0 once it ran (invalid input and a missing server raise instead)."""
        return EXIT_OK


@dataclass
class GridPoint:
    """One point of the parameter grid: its params, and the outcome classes its interleavings fell into."""

    params: dict[str, str]
    classes: list[OutcomeClass]
    variant: str
    signatures: bool = False  # the checks are the anomaly's signature (kind = "bug"), not invariants
    guarantee: dict[str, Any] | None = None  # a bounded exploration's (see pgrace.model.exploration)

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": dict(self.params),
            "verdict": self.verdict,
            **({"guarantee": self.guarantee} if self.guarantee is not None else {}),
            "classes": [c.to_dict(self.variant) for c in self.classes],
        }

    @property
    def verdict(self) -> str:
        return verdict(self.classes, self.signatures)


@dataclass
class Grid:
    """One scenario variant's points, one per combination of the parameters' values."""

    scenario: str
    variant: str
    params: dict[str, list[str]]
    cells: list[GridPoint] = field(default_factory=list)
    explored: bool = False
    bound: str = ""  # what each cell's bounded exploration covered: "every schedule with at most 2 preemptions"

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON shape (docs/reference/json.md)."""
        return {"scenario": self.scenario, "params": self.params, "cells": [c.to_dict() for c in self.cells]}


def verdict(classes: Sequence[OutcomeClass], signatures: bool) -> str:
    """What a reader wants from a cell, in the words of its checks' polarity.

    Signatures describe the anomaly: it occurs where they hold (and no undeclared error
    came with it). Invariants must hold: a cell fails where one does not, or where a step
    raised an error no expectation declares.
    """
    total = sum(c.count for c in classes)
    if classes and all(c.reproduces is None for c in classes):  # no final check: no anomaly is described
        unexpected = sum(c.count for c in classes if c.unexpected)
        return "no checks" if not unexpected else f"unexpected errors in {unexpected}/{total}"
    if not signatures:
        failing = sum(c.count for c in classes if c.breaks)
        return "holds" if not failing else f"fails in {failing}/{total}"
    occurring = sum(c.count for c in classes if c.shows_bug)
    if occurring:
        return "occurs" if occurring == total else f"occurs in {occurring}/{total}"
    if any(c.reproduces for c in classes):
        codes = sorted({code for c in classes if c.reproduces for code in c.unexpected})
        return "occurs only with unexpected errors " + "/".join(codes)
    errors = {code for c in classes for code in c.errors}
    serialization = sorted(code for code in errors if code.startswith("40"))
    if serialization:
        return "prevented by " + "/".join(serialization)
    if any(c.waits for c in classes):
        return "prevented by blocking"
    return "prevented"
