"""A scenario step's end: its results collected, its captures kept, what released it, its report.

A finished step is first *collected* (its results read, the release tracker told whether it
ended its transaction) and later *reported* (its StepFinished, with the release, then what
arrived since: a loss, notifications), because a completion marker may hold the report back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from pgrace.engine.retries import note_attempt
from pgrace.errors import ScenarioError
from pgrace.model.timeline import Release
from pgrace.model.variables import Value

if TYPE_CHECKING:
    from pgrace.engine.session import Inspector, LiveSession
    from pgrace.engine.steps import Active, StepBook
    from pgrace.engine.transport import Transport
    from pgrace.model.scenario import Scenario


class Completions:
    """Collects a finished step and records its end, for the scheduler of these sessions."""

    def __init__(
        self,
        scenario: Scenario,
        sessions: Mapping[str, LiveSession],
        inspector: Inspector,
        book: StepBook,
        transport: Transport,
    ) -> None:
        self.scenario = scenario
        self.sessions = sessions
        self.inspector = inspector
        self.book = book
        self.transport = transport

    def collect(self, session: LiveSession, active: Active) -> None:
        """Collect a finished step's results (not yet its report) and note whether it ended its transaction."""
        outcome, deadlock = session.collect(active)
        if deadlock is not None and outcome.error is not None:
            outcome = dataclasses.replace(
                outcome,
                error=dataclasses.replace(outcome.error, cycle=self.inspector.deadlock_cycle(deadlock)),
            )
        active.outcome = outcome
        self._capture(session, active)
        self._note_completion(session, active)

    def _note_completion(self, session: LiveSession, active: Active) -> None:
        """Tell the book the step is over (once): did it end its transaction, or its session?"""
        assert active.outcome is not None
        lost, after = session.ended_status(active)
        self.book.releases.completed(active.seq, active.tx_before, after, active.outcome.error, lost)

    def _collect_finished(self, names: Iterable[str]) -> None:
        """Collect the results that already arrived for these sessions' running steps (a deadlock victim's)."""
        sessions = self.sessions
        pending = [
            sessions[name]
            for name in names
            if name in sessions
            and (active := sessions[name].active) is not None
            and active.outcome is None
            and sessions[name].lost is None
        ]
        for session in self.transport.waiting.answered(pending):
            assert session.active is not None
            self.collect(session, session.active)

    def _gone(self, names: Iterable[str]) -> set[str]:
        """Sessions whose backend no longer exists (terminated, crashed)."""
        known = [self.sessions[name] for name in names if name in self.sessions]
        alive = self.inspector.states([s.pid for s in known if s.lost is None])
        return {s.name for s in known if s.lost is not None or s.pid not in alive}

    def _release(self, active: Active, last_done: int) -> Release | None:
        """What ended the step's wait (None when it never waited)."""
        if not active.waiting_reported:
            return None
        assert active.outcome is not None
        release = self.book.release(
            active,
            active.outcome.error,
            lost=active.lost is not None,
            collect=self._collect_finished,
            gone=self._gone,
        )
        return self.transport.release_of(release, active.step.session, last_done)

    def finished(self, session: LiveSession, active: Active, last_done: int) -> None:
        """Record a collected step's end in the book, with what released it (``last_done``: the step done before)."""
        assert active.outcome is not None
        self._note_completion(session, active)  # outcomes set at launch (a crash, a sleep) are noted here
        note_attempt(self.scenario, session, active)
        self.book.finished(active.seq, active.outcome, active.waiting_reported, self._release(active, last_done))

    def _capture(self, session: LiveSession, active: Active) -> None:
        step, outcome = active.step, active.outcome
        if not step.capture or outcome is None:
            return
        if outcome.error is not None:  # a failed claim captured nothing: later steps see NULL
            session.variables.update({variable: Value(None) for variable, _ in step.capture})
            return
        last = outcome.last_rows
        for variable, column in step.capture:
            if last is None or column not in last.columns:
                found = ", ".join(last.columns) if last else "no result set"
                raise ScenarioError(
                    f"step {step.name!r} captures column {column!r}, but its result has {found}",
                    self.scenario.source,
                    step.line,
                )
            index = last.columns.index(column)
            if last.rows:
                session.variables[variable] = Value(last.rows[0][index], last.text_rows[0][index])
            else:
                session.variables[variable] = Value(None)
