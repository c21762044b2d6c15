"""What happened, in sentences: the waits and errors of a run, and its verdict."""

from __future__ import annotations

from collections.abc import Sequence

from pgrace.model.timeline import CheckResult, Run
from pgrace.render.sections import launches
from pgrace.render.wording import plural, release_phrase, serialization_text, wait_phrase


def story_facts(run: Run) -> list[str]:
    """What happened, one sentence per wait, error and cancel: the summary's facts."""
    facts: list[str] = []
    by_seq = {s.seq: s for s in run.step_runs()}
    launched = launches(run)
    lost = {event.during_seq: event for event in run.sessions_lost() if not event.idle}
    for step in by_seq.values():
        who = f"{step.session}'s {step.step}"
        if step.waited:
            phrases = "; ".join(wait_phrase(w) for w in step.waits) or "waited"
            fact = f"{who} (step {step.seq}) {phrases}"
            if step.outcome is not None:
                fact += f"; it {release_phrase(step.seq, step.release, launched)}"
            facts.append(fact)
        if step.cancelled:
            facts.append(f"{who} (step {step.seq}) never finished and was cancelled")
        elif step.seq in lost:
            gone = lost[step.seq]
            facts.append(
                f"{step.session}'s connection was lost during step {step.seq} ({gone.sqlstate}: {gone.message});"
                " its later steps were not sent"
            )
        elif step.outcome is not None and step.outcome.error is not None and step.outcome.error.sqlstate != "08003":
            error = step.outcome.error  # 08003: not sent after a lost connection, already told above
            fact = f"{who} (step {step.seq}) failed with {error.sqlstate}: {error.message}"
            if error.cycle:
                fact += f" ({'; '.join(error.cycle)})"
            if error.sqlstate == "40001":
                fact += f" ({serialization_text(step.predicate_locks_at_error).removeprefix('⚑ ')})"
            if step.outcome.retry is not None:
                fact += f"; its retry loop ran attempt {step.outcome.retry}"
            facts.append(fact)
    for gone in (event for event in run.sessions_lost() if event.idle):  # no step of its own carries it
        facts.append(
            f"the server ended {gone.session}'s connection while it ran nothing, found after step"
            f" {gone.during_seq} ({gone.sqlstate}: {gone.message})"
        )
    if not facts:
        facts.append("no step waited and none failed")
    return facts


def verdict_line(run: Run) -> str:
    stopped = setup_failure(run)
    return f"not run: {stopped}" if stopped else verdict_words(run.checks)


def setup_failure(run: Run) -> str | None:
    """Why the steps never ran, when the setup failed: no expectation was checked, none held or failed."""
    event = run.failed_setup()
    if event is None or event.outcome.error is None:
        return None
    where = f"session {event.session}'s setup" if event.session else "the setup"
    return f"{where} failed ({event.outcome.error.sqlstate}: {event.outcome.error.message})"


def verdict_words(checks: Sequence[CheckResult]) -> str:
    """``✔ all 3 expectations held``, ``✔ 1 expectation held``, ``✘ 1 of 3 expectations did not hold``."""
    failed = [c for c in checks if not c.ok]
    if not checks:
        return "no expectations to check"
    if failed:
        return f"✘ {len(failed)} of {plural(len(checks), 'expectation')} did not hold"
    if len(checks) == 1:
        return "✔ 1 expectation held"
    return f"✔ all {len(checks)} expectations held"


def variant_flag(variant: str) -> str:
    return "--fix" if variant == "fix" else "--bug"
