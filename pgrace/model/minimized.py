"""What ``pgrace minimize`` found: the smallest scenario that fails the same way, how it fails, what was tried.

The shrink that finds it is :mod:`pgrace.drivers.minimize`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from pgrace.errors import EXIT_OK
from pgrace.model.scenario import Scenario
from pgrace.model.timeline import Run

__all__ = ["Failure", "Minimized", "Trial"]


@dataclass(frozen=True)
class Failure:
    """How a run failed, step by step: what a candidate must do again to be kept."""

    checked: bool  # the scenario has final checks
    failed_checks: tuple[str, ...]
    errors: tuple[tuple[str, str], ...]  # (step, SQLSTATE), sorted
    waits: tuple[str, ...]  # steps that waited, sorted

    def fails(self, scenario: Scenario) -> bool:
        """Bad news: the bug happened by the checks' polarity (an invariant failed, or every signature of the
        bug held), or a step raised an error; without checks (a lock wait from-log recovered), a step waited."""
        if self.errors or (not self.checked and self.waits):
            return True
        failed = set(self.failed_checks)
        if any(not c.is_signature and c.description in failed for c in scenario.checks):
            return True
        signatures = [c for c in scenario.checks if c.is_signature]
        return bool(signatures) and not any(c.description in failed for c in signatures)

    def kept_by(self, other: Failure) -> bool:
        return (
            self.failed_checks == other.failed_checks
            and self.errors == other.errors
            and set(self.waits) <= set(other.waits)
        )

    def difference(self, other: Failure) -> str:
        """Why ``other`` does not fail the way this does, in a few words."""
        if other.failed_checks != self.failed_checks:
            gone = [c for c in self.failed_checks if c not in other.failed_checks]
            new = [c for c in other.failed_checks if c not in self.failed_checks]
            return "; ".join([*(f"«{c}» held" for c in gone), *(f"«{c}» failed" for c in new)])
        if other.errors != self.errors:
            return f"errors {_errors_text(other.errors)} instead of {_errors_text(self.errors)}"
        lost = sorted(set(self.waits) - set(other.waits))
        return f"{', '.join(lost)} did not wait"

    def describe(self, variant: str) -> str:
        parts = []
        if self.checked:
            if variant == "bug":
                parts.append("the bug's checks hold" if not self.failed_checks else "")
            if self.failed_checks:
                parts.append("fails " + "; ".join(f"«{c}»" for c in self.failed_checks))
        if self.errors:
            parts.append("errors " + _errors_text(self.errors))
        if self.waits:
            parts.append("waits " + ", ".join(self.waits))
        return " · ".join(p for p in parts if p) or "no checks, no errors"

    def to_dict(self) -> dict[str, Any]:
        return {
            "failed_checks": list(self.failed_checks),
            "errors": [{"step": step, "sqlstate": code} for step, code in self.errors],
            "waits": list(self.waits),
        }


def _errors_text(errors: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{code} on {step}" for step, code in errors) or "none"


@dataclass(frozen=True)
class Trial:
    """One removal tried: what, and whether the candidate without it failed the same way (then it was removed)."""

    kind: str  # session, transaction, step, retry loop, setup, row, order, sql
    what: str
    removed: bool
    reason: str
    runs: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Minimized:
    """The smallest scenario found, how it fails, and every removal tried on the way."""

    original: Scenario
    scenario: Scenario  # the minimized one, its one permutation the failing order
    failure: Failure
    trials: list[Trial]
    runs: int
    seconds: float
    locally_minimal: bool
    repeats: int  # runs per candidate
    failed_before: int  # of ``repeats`` runs of the original, how many failed the same way
    failed_after: int
    before: dict[str, int]
    after: dict[str, int]
    orders_total: int = 0  # pairs of steps of different sessions the final interleaving orders
    orders_kept: int = 0  # of those, the pairs that do not commute
    race: bool = False  # the original did not fail with its sessions one after another: nor may the result
    candidate_timeout: float = 0.0  # the step timeout of a candidate's run, in seconds (see shrink.Bench)
    timeline: Run | None = field(default=None, repr=False)
    written: list[tuple[str, str]] = field(default_factory=list)  # (kind, path) of each verified export

    @property
    def ok(self) -> bool:
        """Always: a shrink ends with a scenario that fails as the run it started from did (one that does not
        fail raises instead, before anything is shrunk)."""
        return True

    @property
    def exit_code(self) -> int:
        """``pgrace minimize``'s: 0 once the smallest scenario is found (and written where asked, verified)."""
        return EXIT_OK

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(p.step for p in self.scenario.permutations[0])

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON shape (docs/reference/json.md) but its last key, ``timeline``: a run's JSON is
        the renderer's (``pgrace.render.minimize.minimized_to_dict`` adds it)."""
        return {
            "scenario": self.original.name,
            "variant": self.original.variant,
            "failure": self.failure.to_dict(),
            "runs": self.runs,
            "seconds": round(self.seconds, 3),
            "locally_minimal": self.locally_minimal,
            "race": self.race,
            "candidate_timeout": round(self.candidate_timeout, 3),
            "repeats": self.repeats,
            "failed": {"before": self.failed_before, "after": self.failed_after, "of": self.repeats},
            "before": self.before,
            "after": self.after,
            "order": list(self.order),
            "orders": {"total": self.orders_total, "kept": self.orders_kept},
            "trials": [t.to_dict() for t in self.trials],
            "written": [{"kind": kind, "path": path} for kind, path in self.written],
        }
