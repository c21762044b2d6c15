"""Retry loops: which attempt of a loop a session runs, and what calls the next one.

A scenario's ``retry = { on, from, max }`` is unrolled when the file is read into
attempts ``NAME#K`` placed after the keyed step (see :meth:`Scenario.with_retries`);
here the run decides which of them are sent, as the application's own loop would.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from psycopg import pq

if TYPE_CHECKING:
    from pgrace.engine.session import LiveSession
    from pgrace.engine.steps import Active
    from pgrace.model.scenario import Scenario, Step


def attempted(step: Step, session: LiveSession) -> bool:
    """Whether to send ``step`` now that its session's earlier steps are done: retry loops decide.

    A loop's attempt K is sent only when attempt K-1 failed with one of the loop's
    SQLSTATEs (and K-1 <= max); the rest of a failed attempt is not sent, as an
    exception leaves the application's loop body; the ROLLBACK that starts an attempt
    only when the failure left a transaction open. Not sent is not run: no event at all.
    """
    if step.loop is None:
        return True
    if step.attempt != session.attempts.get(step.loop, 1):
        return False
    return not step.rollback or session.transaction_status() != pq.TransactionStatus.IDLE


def note_attempt(scenario: Scenario, session: LiveSession, active: Active) -> None:
    """A step of a retry loop that failed with one of its SQLSTATEs calls the next attempt, if one is left."""
    step, outcome = active.step, active.outcome
    retry = scenario.retry_of(step)
    if retry is None or step.rollback or outcome is None or outcome.error is None or session.lost is not None:
        return
    if outcome.error.sqlstate in retry.on and step.attempt <= retry.max:
        assert step.loop is not None
        session.attempts[step.loop] = step.attempt + 1
        active.outcome = dataclasses.replace(outcome, retry=step.attempt + 1)
