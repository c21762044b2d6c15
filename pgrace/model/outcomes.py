"""What one interleaving ended in, as a key that groups interleavings into outcome classes.

:func:`classify` is a pure function from the :class:`~pgrace.model.timeline.Run` of one
interleaving to an :class:`Observed`: the rows each final ``[[check]]`` query returned,
which final checks failed, and the SQLSTATEs of the steps that failed (a deadlock is
40P01, a step pgrace cancelled after ``--step-timeout`` is 57014, a lost session 08006
or the server's FATAL). Those three make the class key. Whether a step waited, and the
order the steps were launched in, are facts about the interleaving, not part of the key:
a cure that makes one session wait for the other still has one outcome.

Per-step expectations (``expect = {...}``) are written for the file's own order and do
not classify: in another order, the step that waits is another one. Explore, sweep and
``pgrace check --explore`` all classify with this one function, and merge classes with
:func:`merge_classes` (what shards of one exploration need to add up to the whole).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pgrace.model.checks import format_value, rows_equal
from pgrace.model.scenario import Scenario
from pgrace.model.timeline import CheckQueried, PermutationStarted, Run, StepCancelled
from pgrace.model.values import to_json_value

__all__ = ["Observed", "OutcomeClass", "classify", "merge_classes", "switches"]


@dataclass(frozen=True)
class Observed:
    """One interleaving's outcome. ``final`` holds JSON values, one row list per final check."""

    ok: bool
    errors: tuple[str, ...]
    failed_checks: tuple[str, ...]
    final: tuple[tuple[tuple[Any, ...], ...], ...]
    waited: bool
    launched: tuple[str, ...]
    timed_out: bool = False
    same_as: int | None = None  # a lower-numbered interleaving that runs alike (only unsent retry steps moved)
    retried_on: tuple[str, ...] = ()  # the SQLSTATE of each attempt a retry loop ran again, sorted

    @property
    def key(self) -> str:
        """The class key: final rows, failed checks, step SQLSTATEs (never waits or order)."""
        return json.dumps([self.final, self.failed_checks, self.errors], default=str)


@dataclass
class OutcomeClass:
    """Interleavings that ended alike: how many, and the simplest one that does it.

    ``example`` is the launch order of the interleaving with the fewest session switches
    (ties: the first in enumeration order); ``waits`` counts the interleavings of the
    class in which some step waited for a lock. A retry loop's error does not classify (the
    loop handled it), so ``retries`` counts the runs of the class that went through one and
    its retry, ``retried_on`` names their SQLSTATEs and ``retry_example`` is the simplest
    of them: a class that "holds" may hold only thanks to the retry.
    """

    ok: bool
    count: int
    errors: tuple[str, ...]
    failed_checks: tuple[str, ...]
    final: tuple[tuple[tuple[Any, ...], ...], ...]
    waits: int
    example: tuple[str, ...]
    preference: tuple[int, int] = (0, 0)  # (session switches, rank): lower is simpler
    summary: str = field(default="")
    # Of code, whose steps are known only by running it: the example's (session, SQL) in
    # launch order, and the choices that replay it (see pgrace.engine.schedule.ChoiceTree).
    statements: tuple[tuple[str, str], ...] = ()
    choices: tuple[int, ...] = ()
    retries: int = 0
    retried_on: tuple[str, ...] = ()
    retry_example: tuple[str, ...] = ()
    retry_preference: tuple[int, int] = (0, 0)

    @property
    def key(self) -> str:
        return json.dumps([self.final, self.failed_checks, self.errors], default=str)

    def count_retries(
        self, runs: int, sqlstates: Sequence[str], example: tuple[str, ...], preference: tuple[int, int]
    ) -> None:
        """Count ``runs`` runs that retried on ``sqlstates``, keeping the simplest example."""
        if not self.retries or preference < self.retry_preference:
            self.retry_example, self.retry_preference = example, preference
        self.retried_on = tuple(sorted({*self.retried_on, *sqlstates}))
        self.retries += runs

    def to_dict(self, variant: str | None = None) -> dict[str, Any]:
        """The JSON shape; ``reproduces`` (a bug variant's: did the bug happen?) is null for a fix."""
        return {
            "ok": self.ok,
            "reproduces": self.ok if variant == "bug" and self.final else None,  # no final check: nothing to say
            "count": self.count,
            "summary": self.summary,
            "errors": list(self.errors),
            "failed_checks": list(self.failed_checks),
            "final": [[list(row) for row in rows] for rows in self.final],
            "waits": self.waits,
            "example": list(self.example),
            "retries": self.retries,
            "retried_on": list(self.retried_on),
            "retry_example": list(self.retry_example) if self.retries else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], rank: Callable[[Sequence[str]], tuple[int, int]]) -> OutcomeClass:
        """A class read back from JSON; ``rank`` gives an example's preference (see ``Space.preference``)."""
        retries = whole_number(data.get("retries", 0), "retries")
        retry_example = tuple(data["retry_example"]) if retries else ()
        return cls(
            ok=bool(data["ok"]),
            count=whole_number(data["count"], "count"),
            errors=tuple(data["errors"]),
            failed_checks=tuple(data["failed_checks"]),
            final=tuple(tuple(tuple(row) for row in rows) for rows in data["final"]),
            waits=whole_number(data["waits"], "waits"),
            example=tuple(data["example"]),
            preference=rank(data["example"]),
            summary=str(data["summary"]),
            retries=retries,
            retried_on=tuple(str(code) for code in data.get("retried_on", [])),
            retry_example=retry_example,
            retry_preference=rank(retry_example) if retries else (0, 0),
        )


def whole_number(value: Any, name: str) -> int:
    """A count read back from JSON: a whole number from 0 up (JSON also spells 1e999, NaN, 1.5 and true)."""
    if type(value) is not int or value < 0:
        raise ValueError(f"{name} is not a whole number: {str(value)[:40]}")
    return value


def classify(run: Run) -> Observed:
    """The outcome of a run of one interleaving (its final checks ran before its teardown)."""
    scenario = run.scenario
    steps = run.step_runs()
    erred = [(s.outcome.error.sqlstate, s.retried) for s in steps if s.outcome is not None and s.outcome.error]
    errors = sorted(code for code, retried in erred if not retried)  # a retried error is handled
    retried = sorted(code for code, retried in erred if retried)
    timed_out = any(isinstance(e, StepCancelled) for e in run.events)
    outcomes = {e.index: e.outcome for e in run.events if isinstance(e, CheckQueried)}
    final: list[tuple[tuple[Any, ...], ...]] = []
    failed: list[str] = []
    for index, check in enumerate(scenario.checks):
        outcome = outcomes.get(index)
        last = outcome.last_rows if outcome is not None else None
        rows = list(last.rows) if last is not None and outcome is not None and outcome.error is None else []
        final.append(tuple(tuple(to_json_value(v) for v in row) for row in rows))
        if outcome is None or outcome.error is not None or not rows_equal(rows, check.rows):
            failed.append(check.description)
    return Observed(
        ok=not failed,
        errors=tuple(errors),
        failed_checks=tuple(failed),
        final=tuple(final),
        waited=any(s.waited for s in steps),
        launched=tuple(s.step for s in steps),
        timed_out=timed_out,
        retried_on=tuple(retried),
    )


def split_run(run: Run) -> list[Run]:
    """One run per permutation of a run of several (each permutation's events, in order)."""
    runs: list[Run] = []
    for event in run.events:
        if isinstance(event, PermutationStarted):
            runs.append(Run(run.scenario, run.server_version, run.server_label, run.row_locks_available))
        if runs:
            runs[-1].events.append(event)
    return runs


def switches(order: Sequence[str], scenario: Scenario) -> int:
    """How often the launch order passes from one session to another: the reader's effort."""
    sessions = [scenario.step(name).session for name in order]
    return sum(1 for a, b in itertools.pairwise(sessions) if a != b)


def verdict_of(ok: bool, variant: str, checked: bool = True) -> tuple[str, bool]:
    """A class's checks as a reader takes them, and whether that is the bad news.

    A bug variant's final checks describe the bug: when they hold, the bug happened. Without
    a final check there is nothing to say either way.
    """
    if not checked:
        return ("no checks", False)
    if variant == "bug":
        return ("reproduces the bug", True) if ok else ("does not reproduce", False)
    return ("holds", False) if ok else ("FAILS", True)


def summarize(cls: OutcomeClass, scenario: Scenario) -> str:
    """One line: the final rows, then what happened (the checks, in the variant's terms), then errors."""
    parts = []
    if cls.final:
        parts.append("final " + " | ".join(_rows_text(rows) for rows in cls.final))
    if scenario.variant == "bug" and scenario.checks:
        if cls.failed_checks:
            parts.append("no bug: " + "; ".join(f"«{d}» did not happen" for d in cls.failed_checks))
        else:
            parts.append("the bug: " + "; ".join(c.description for c in scenario.checks))
    elif cls.failed_checks:
        parts.append("fails: " + "; ".join(cls.failed_checks))
    elif scenario.checks:
        parts.append("checks hold")
    if cls.errors:
        counted: dict[str, int] = {}
        for code in cls.errors:
            counted[code] = counted.get(code, 0) + 1
        named = [f"{code}{' ' + _ERROR_NAMES[code] if code in _ERROR_NAMES else ''}" for code in counted]
        parts.append(
            "errors: " + ", ".join(f"{n} ×{c}" if c > 1 else n for n, c in zip(named, counted.values(), strict=True))
        )
    return " · ".join(parts) or "no checks, no errors"


_ERROR_NAMES = {
    "40001": "(serialization failure)",
    "40P01": "(deadlock)",
    "55P03": "(lock not available)",
    "57014": "(query canceled: a timeout or a cancel request)",  # statement_timeout, --step-timeout or a cancel
    "25P02": "(in failed transaction)",
    "23505": "(unique violation)",
    "08006": "(connection lost)",
}


def _rows_text(rows: Iterable[Iterable[Any]]) -> str:
    shown = ["(" + ", ".join(format_value(v) for v in row) + ")" for row in rows]
    return ", ".join(shown) or "no rows"


def add_observed(
    classes: dict[str, OutcomeClass], observed: Observed, preference: tuple[int, int], scenario: Scenario
) -> None:
    """Count one interleaving into its class, keeping the simplest example."""
    key = observed.key
    found = classes.get(key)
    if found is None:
        found = OutcomeClass(
            observed.ok,
            0,
            observed.errors,
            observed.failed_checks,
            observed.final,
            0,
            observed.launched,
            preference,
        )
        found.summary = summarize(found, scenario)
        classes[key] = found
    found.count += 1
    found.waits += int(observed.waited)
    if preference < found.preference:
        found.example, found.preference = observed.launched, preference
    if observed.retried_on:
        found.count_retries(1, observed.retried_on, observed.launched, preference)


def merge_classes(parts: Iterable[Iterable[OutcomeClass]]) -> list[OutcomeClass]:
    """Classes of disjoint sets of interleavings, added up; ordered by their examples."""
    merged: dict[str, OutcomeClass] = {}
    for part in parts:
        for cls in part:
            found = merged.get(cls.key)
            if found is None:
                merged[cls.key] = replace(cls)
                continue
            found.count += cls.count
            found.waits += cls.waits
            if cls.retries:
                found.count_retries(cls.retries, cls.retried_on, cls.retry_example, cls.retry_preference)
            if cls.preference < found.preference:
                found.example, found.preference = cls.example, cls.preference
                found.statements, found.choices = cls.statements, cls.choices
    return ordered(merged.values())


def ordered(classes: Iterable[OutcomeClass]) -> list[OutcomeClass]:
    """Numbered for ``--show N``: the most frequent first, ties by their examples."""
    return sorted(classes, key=lambda c: (-c.count, c.preference))
