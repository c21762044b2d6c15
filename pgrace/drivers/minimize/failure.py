"""What a failing run failed of, and the candidates a shrink tries (what it found is :mod:`pgrace.model.minimized`)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from pgrace.drivers.minimize.statements import SetupStatement, join_block
from pgrace.model.minimized import Failure
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
