"""Steps side by side, one column per variant, for the comparison of a bug and its fix."""

from __future__ import annotations

from dataclasses import dataclass

from pgrace.model.timeline import Run
from pgrace.render.sections import is_serialization_failure, launches, step_note
from pgrace.render.wording import describe_wait, outcome_lines, release_phrase, serialization_text


@dataclass(frozen=True)
class StepSummary:
    """One launched step in a single cell: its SQL, then how it went (wait, result)."""

    seq: int
    session: str
    step: str
    sql: str
    note: str
    lines: tuple[str, ...]
    waited: bool
    failed: bool


def step_summaries(run: Run) -> list[StepSummary]:
    """Every launched step in launch order, folded: what a comparison lines up by position."""
    summaries: list[StepSummary] = []
    by_seq = {s.seq: s for s in run.step_runs()}
    launched = launches(run)
    for step in by_seq.values():
        lines: list[str] = []
        if step.waited:
            lines += [describe_wait(w) for w in step.waits]
            if step.outcome is not None:
                lines.append(f"↳ {release_phrase(step.seq, step.release, launched, sql_limit=24)}")
        if step.cancelled:
            lines.append("⌛ cancelled: it could not finish")
        if step.outcome is not None:
            lines += outcome_lines(step.outcome)
            if is_serialization_failure(step.outcome):
                lines.append(serialization_text(step.predicate_locks_at_error))
        summaries.append(
            StepSummary(
                step.seq,
                step.session,
                step.step,
                step.sql,
                step_note(run, step.step),
                tuple(lines),
                step.waited,
                step.status in ("error", "cancelled"),
            )
        )
    return summaries


def same_sessions(columns: list[list[StepSummary]]) -> bool:
    """Whether step N is sent by the same session in every variant, for every N both have."""
    return all(len({column[i].session for column in columns if i < len(column)}) == 1 for i in range(rows(columns)))


def rows(columns: list[list[StepSummary]]) -> int:
    return max((len(c) for c in columns), default=0)
