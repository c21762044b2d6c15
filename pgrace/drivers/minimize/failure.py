"""What a failing run failed of, and what a shrink tried and found: the types ``pgrace minimize`` reports."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from pgrace.drivers.minimize.statements import SetupStatement, join_block
from pgrace.model.outcomes import classify
from pgrace.model.scenario import PermutationStep, Scenario, Step
from pgrace.model.timeline import Run

CHANCY_REPEATS = 5  # runs per candidate when the failure may hang on timing or chance
MAX_RUNS = 2_000  # a shrink stops here (then it does not claim local minimality)
CHANCE = re.compile(
    r"\b(pg_sleep\w*|random|random_normal|gen_random_uuid|setseed|statement_timeout|lock_timeout|"
    r"idle_in_transaction_session_timeout|transaction_timeout|clock_timestamp|now)\b",
    re.IGNORECASE,
)
BEGINS = re.compile(r"^\s*(BEGIN|START\s+TRANSACTION)\b", re.IGNORECASE)
ENDS = re.compile(r"\b(COMMIT|END|ABORT|ROLLBACK)(?!\s+TO\b)(\s+(WORK|TRANSACTION))?\s*;?\s*$", re.IGNORECASE)


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


def failure_of(run: Run) -> Failure:
    steps = run.step_runs()
    errors = sorted(
        (s.step, s.outcome.error.sqlstate)
        for s in steps
        if s.outcome is not None and s.outcome.error is not None and not s.retried
    )
    observed = classify(run)
    return Failure(
        bool(run.scenario.checks),
        observed.failed_checks,
        tuple(errors),
        tuple(sorted({s.step for s in steps if s.waited})),
    )


@dataclass(frozen=True)
class Kept:
    """What a candidate keeps of the original: sessions, steps (in the failing order) and setup statements."""

    sessions: tuple[str, ...]
    order: tuple[str, ...]
    setup: tuple[SetupStatement, ...]
    sql: tuple[tuple[str, str], ...] = ()  # (step, its simpler text) for each step whose SQL was simplified

    def scenario(self, original: Scenario) -> Scenario:
        kept = set(self.order)
        blocks = sorted({s.block for s in self.setup})
        simpler = dict(self.sql)
        return dataclasses.replace(
            original,
            sessions=tuple(s for s in original.sessions if s.name in self.sessions),
            steps=tuple(
                dataclasses.replace(s, sql=simpler[s.name], note="") if s.name in simpler else s  # told other SQL
                for s in original.steps
                if s.name in kept
            ),
            setup=tuple(join_block([s for s in self.setup if s.block == b]) for b in blocks),
            permutations=(tuple(PermutationStep(name) for name in self.order),),
            other=None,
            load=None,
        )

    @property
    def rows(self) -> int:
        return sum(len(s.rows) for s in self.setup)


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
    def order(self) -> tuple[str, ...]:
        return tuple(p.step for p in self.scenario.permutations[0])

    def to_dict(self) -> dict[str, Any]:
        from pgrace.render.json import run_to_dict

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
            "timeline": run_to_dict(self.timeline) if self.timeline is not None else None,
        }


def sizes(scenario: Scenario, shape: Kept) -> dict[str, int]:
    return {
        "sessions": len(shape.sessions),
        "steps": len(shape.order),
        "setup_statements": len(shape.setup),
        "seed_rows": shape.rows,
    }


def chancy(scenario: Scenario) -> bool:
    """Whether the failure may hang on timing or chance: a sleep step, the clock, random(), a timeout."""
    texts = [*scenario.setup, *(s.sql for s in scenario.steps), *(c.sql for c in scenario.checks)]
    texts += [t for s in scenario.sessions for t in (s.setup, s.teardown) if t]
    return any(s.sleep is not None for s in scenario.steps) or any(CHANCE.search(t) for t in texts)


def short(text: str, width: int = 60) -> str:
    one = " ".join(text.split())
    return one if len(one) <= width else one[: width - 1] + "…"


def describe_step(step: Step) -> str:
    return f"{step.name} ({step.session}): {short(step.sql)}"
