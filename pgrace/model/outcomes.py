"""What one interleaving ended in, as a key that groups interleavings into outcome classes.

:func:`classify` is a pure function from the :class:`~pgrace.model.timeline.Run` of one
interleaving to an :class:`Observed`: the rows each final ``[[check]]`` query returned,
which final checks failed, the SQLSTATEs of the steps that failed (a deadlock is 40P01, a
step pgrace cancelled after ``--step-timeout`` is 57014, a lost session 08006 or the
server's FATAL), and which of those errors no expectation of their step declares. Those
make the class key. Whether a step waited, and the order the steps were launched in, are
facts about the interleaving, not part of the key: a cure that makes one session wait for
the other still has one outcome.

Whether the bug happened follows from each check's polarity (``kind``): an invariant
that fails, or a bug's signature that holds. What a variant claims (:func:`claim_of`)
says which classes break it: the bug of a bug and a fix must happen in some interleaving,
cleanly (no undeclared error); anything else must never show the bug nor raise an error
no expectation declares.

Per-step expectations (``expect = {...}``) are written for the file's own order and do
not classify, but the errors they declare are declared in every order: an error on a step
that does not allow it is unexpected wherever it happens. Explore, sweep and
``pgrace check --explore`` all classify with this one function, and merge classes with
:func:`merge_classes` (what shards of one exploration need to add up to the whole).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, time, timedelta
from typing import Any, Literal

from pgrace.model.checks import format_value, rows_equal
from pgrace.model.scenario import Scenario
from pgrace.model.timeline import CheckQueried, PermutationStarted, Run, StepCancelled, StepRun
from pgrace.model.values import to_json_value

__all__ = ["Claim", "Observed", "OutcomeClass", "claim_of", "classify", "merge_classes", "switches"]

#: What a variant's interleavings must show: "bug", the bug in some interleaving (a bug of
#: a bug and a fix, or a scenario whose checks are all signatures); "no bug", in none, and
#: no error a step does not declare.
Claim = Literal["bug", "no bug"]


def claim_of(scenario: Scenario) -> Claim:
    """The bug of a pair must happen; a lone scenario of bug signatures shows one; the rest must hold.

    Without a final check nothing can show the bug (its waits are per-step expectations of
    the file's order): what is left to prove is that no step raises an undeclared error.
    """
    if not scenario.checks:
        return "no bug"
    if scenario.other is not None:
        return "bug" if scenario.variant == "bug" else "no bug"
    signatures = [c for c in scenario.checks if c.is_signature]
    return "bug" if signatures and len(signatures) == len(scenario.checks) else "no bug"


def _key(final: Any, failed: tuple[str, ...], errors: tuple[str, ...], unexpected: tuple[str, ...]) -> str:
    """Final rows, failed checks, step SQLSTATEs and the undeclared ones (absent when none: keys stay as they were)."""
    return json.dumps([final, failed, errors, *([list(unexpected)] if unexpected else [])], default=str)


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
    unexpected: tuple[str, ...] = ()  # SQLSTATEs of errors no expectation of their step declares
    reproduces: bool | None = None  # the bug happened, by the checks' polarity; None: no final check
    retried_on: tuple[str, ...] = ()  # the SQLSTATE of each attempt a retry loop ran again, sorted

    @property
    def key(self) -> str:
        """The class key: final rows, failed checks, step SQLSTATEs, undeclared ones (never waits or order)."""
        return _key(self.final, self.failed_checks, self.errors, self.unexpected)


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
    # launch order, and the choices that replay it (see pgrace.model.orders.choices.ChoiceTree).
    statements: tuple[tuple[str, str], ...] = ()
    choices: tuple[int, ...] = ()
    unexpected: tuple[str, ...] = ()
    reproduces: bool | None = None
    retries: int = 0
    retried_on: tuple[str, ...] = ()
    retry_example: tuple[str, ...] = ()
    retry_preference: tuple[int, int] = (0, 0)

    @property
    def key(self) -> str:
        return _key(self.final, self.failed_checks, self.errors, self.unexpected)

    @property
    def breaks(self) -> bool:
        """The class breaks a "no bug" claim: the bug happened, or an error no step declares."""
        return bool(self.reproduces) or bool(self.unexpected)

    @property
    def shows_bug(self) -> bool:
        """The class proves a "bug" claim: the bug happened, and no error the scenario does not declare."""
        return bool(self.reproduces) and not self.unexpected

    def count_retries(
        self, runs: int, sqlstates: Sequence[str], example: tuple[str, ...], preference: tuple[int, int]
    ) -> None:
        """Count ``runs`` runs that retried on ``sqlstates``, keeping the simplest example."""
        if not self.retries or preference < self.retry_preference:
            self.retry_example, self.retry_preference = example, preference
        self.retried_on = tuple(sorted({*self.retried_on, *sqlstates}))
        self.retries += runs

    def to_dict(self, variant: str | None = None) -> dict[str, Any]:
        """The JSON shape; ``reproduces`` is null without a final check (nothing to say)."""
        return {
            "ok": self.ok,
            "reproduces": self.reproduces,
            "count": self.count,
            "summary": self.summary,
            "errors": list(self.errors),
            "unexpected_errors": list(self.unexpected),
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
            unexpected=tuple(data.get("unexpected_errors", ())),
            reproduces=None if data.get("reproduces") is None else bool(data["reproduces"]),
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
    unexpected = sorted(code for s in steps if (code := _undeclared(scenario, s)) is not None)
    timed_out = any(isinstance(e, StepCancelled) for e in run.events)
    outcomes = {e.index: e.outcome for e in run.events if isinstance(e, CheckQueried)}
    seen: list[list[tuple[Any, ...]]] = []
    failed: list[str] = []
    bug_seen: list[bool] = []  # per check: its rows say the bug happened
    for index, check in enumerate(scenario.checks):
        outcome = outcomes.get(index)
        last = outcome.last_rows if outcome is not None else None
        rows = list(last.rows) if last is not None and outcome is not None and outcome.error is None else []
        seen.append(rows)
        holds = outcome is not None and outcome.error is None and rows_equal(rows, check.rows)
        if not holds:
            failed.append(check.description)
        bug_seen.append(holds if check.is_signature else not holds)
    times = _time_ranks(v for rows in seen for row in rows for v in row)
    final = tuple(tuple(tuple(_final_value(v, times) for v in row) for row in rows) for rows in seen)
    return Observed(
        ok=not failed,
        errors=tuple(errors),
        failed_checks=tuple(failed),
        final=final,
        waited=any(s.waited for s in steps),
        launched=tuple(s.step for s in steps),
        timed_out=timed_out,
        unexpected=tuple(unexpected),
        reproduces=_reproduces(scenario, bug_seen),
        retried_on=tuple(retried),
    )


def _time_key(value: Any) -> tuple[str, Any] | None:
    """A time of day's kind and value (aware and naive ones are not compared); None for anything else."""
    if isinstance(value, datetime):
        return ("timestamptz" if value.tzinfo is not None else "timestamp", value)
    if isinstance(value, time):
        return ("timetz" if value.tzinfo is not None else "time", value)
    if isinstance(value, timedelta):
        return ("interval", value)
    return None


def _final_value(value: Any, times: dict[tuple[str, Any] | None, str]) -> Any:
    key = _time_key(value)
    return times[key] if key is not None else to_json_value(value)


def _time_ranks(values: Iterable[Any]) -> dict[tuple[str, Any] | None, str]:
    """Times in the final rows by their order, one kind apart: ``<timestamptz 1>`` is the earliest.

    A time the clock gave (now() stamped on a row, the check's own now()) differs from one run
    to the next; only its order against the run's other times is the interleaving's doing.
    """
    by_kind: dict[str, set[Any]] = {}
    for value in values:
        if (key := _time_key(value)) is not None:
            by_kind.setdefault(key[0], set()).add(key[1])
    return {
        (kind, value): f"<{kind} {rank}>"
        for kind, found in by_kind.items()
        for rank, value in enumerate(sorted(found), start=1)
    }


def _reproduces(scenario: Scenario, bug_seen: list[bool]) -> bool | None:
    """The bug happened: an invariant failed, or every signature held (together they describe it)."""
    if not scenario.checks:
        return None
    checks = list(zip(scenario.checks, bug_seen, strict=True))
    if any(seen for check, seen in checks if not check.is_signature):
        return True
    signatures = [seen for check, seen in checks if check.is_signature]
    return bool(signatures) and all(signatures)


def _undeclared(scenario: Scenario, step: StepRun) -> str | None:
    """A step's error that its expectations do not allow (in any order: the step declares it, not the order).

    A retried error is the retry loop's to handle; a step not sent because its session was
    already gone (08003) carries no error of its own; a spec's errors are output to compare,
    as isolationtester's, and declared by its expected file.
    """
    error = step.outcome.error if step.outcome is not None else None
    if error is None or step.retried or error.sqlstate == "08003" or scenario.dialect != "pgrace":
        return None
    return None if scenario.step(step.step).expect.allows_error(error.sqlstate) else error.sqlstate


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


def verdict_of(cls: OutcomeClass, scenario: Scenario) -> tuple[str, bool]:
    """A class's checks as a reader takes them, and whether that is the bad news.

    The words follow from the checks' polarity: a failed invariant "FAILS", held signatures
    "reproduce the bug"; an error no step declares is bad news whatever the checks say.
    """
    if cls.reproduces:
        broken = any(not c.is_signature and c.description in cls.failed_checks for c in scenario.checks)
        return ("FAILS", True) if broken else ("reproduces the bug", True)
    if cls.unexpected:
        return ("unexpected error", True)
    if cls.reproduces is None:
        return ("no checks", False)
    if any(c.is_signature for c in scenario.checks):
        return ("does not reproduce", False)
    return ("holds", False)


def summarize(cls: OutcomeClass, scenario: Scenario) -> str:
    """One line: the final rows, then what the checks say (by their polarity), then the errors."""
    parts = []
    if cls.final:
        parts.append("final " + " | ".join(_rows_text(rows) for rows in cls.final))
    signatures = [c.description for c in scenario.checks if c.is_signature]
    invariants = [c.description for c in scenario.checks if not c.is_signature]
    if signatures:
        missed = [d for d in signatures if d in cls.failed_checks]
        if missed:
            parts.append("no bug: " + "; ".join(f"«{d}» did not happen" for d in missed))
        else:
            parts.append("the bug: " + "; ".join(signatures))
    broken = [d for d in invariants if d in cls.failed_checks]
    if broken:
        parts.append("fails: " + "; ".join(broken))
    elif invariants:
        parts.append("checks hold")
    declared = list(cls.errors)
    for code in cls.unexpected:
        declared.remove(code)
    if declared:
        parts.append("errors: " + _errors_text(declared))
    if cls.unexpected:
        parts.append("unexpected errors: " + _errors_text(cls.unexpected))
    return " · ".join(parts) or "no checks, no errors"


def _errors_text(codes: Iterable[str]) -> str:
    counted: dict[str, int] = {}
    for code in codes:
        counted[code] = counted.get(code, 0) + 1
    named = [f"{code}{' ' + _ERROR_NAMES[code] if code in _ERROR_NAMES else ''}" for code in counted]
    return ", ".join(f"{n} ×{c}" if c > 1 else n for n, c in zip(named, counted.values(), strict=True))


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
            unexpected=observed.unexpected,
            reproduces=observed.reproduces,
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
