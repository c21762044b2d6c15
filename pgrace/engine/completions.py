"""A scenario step's end: its results collected, its captures kept, what released it, its report.

A finished step is first *settled* (its results read, the release tracker told whether it
ended its transaction) and later *reported* (its StepFinished, with the release, then what
arrived since: a loss, notifications), because a completion marker may hold the report back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pgrace.engine.libpq.session import LibpqSession
from pgrace.engine.retries import note_attempt
from pgrace.errors import ScenarioError
from pgrace.model.timeline import Release
from pgrace.model.variables import Value

if TYPE_CHECKING:
    from pgrace.engine.scheduler import Scheduler
    from pgrace.engine.session import Session
    from pgrace.engine.steps import Active


class Completions:
    """Settles and reports the steps of one scheduler."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def settle(self, session: Session, active: Active) -> None:
        """Collect a finished step's results (not yet its report) and note whether it ended its transaction."""
        outcome, deadlock = session.collect(active)
        if deadlock is not None and outcome.error is not None:
            outcome = dataclasses.replace(
                outcome,
                error=dataclasses.replace(outcome.error, cycle=self.scheduler.inspector.deadlock_cycle(deadlock)),
            )
        active.outcome = outcome
        self._capture(session, active)
        self._note_completion(session, active)

    def _note_completion(self, session: Session, active: Active) -> None:
        """Tell the book the step is over (once): did it end its transaction, or its session?"""
        assert active.outcome is not None
        lost, after = session.ended_status(active)
        self.scheduler.book.releases.completed(active.seq, active.tx_before, after, active.outcome.error, lost)

    def _settle_finished(self, names: Iterable[str]) -> None:
        """Collect the results that already arrived for these sessions' running steps (a deadlock victim's)."""
        sessions = self.scheduler.sessions
        pending = [
            sessions[name]
            for name in names
            if name in sessions
            and (active := sessions[name].active) is not None
            and active.outcome is None
            and sessions[name].lost is None
        ]
        for session in self.scheduler.strategy.answered(pending):
            assert session.active is not None
            self.settle(session, session.active)

    def _gone(self, names: Iterable[str]) -> set[str]:
        """Sessions whose backend no longer exists (terminated, crashed)."""
        known = [self.scheduler.sessions[name] for name in names if name in self.scheduler.sessions]
        alive = self.scheduler.inspector.states([s.pid for s in known if s.lost is None])
        return {s.name for s in known if s.lost is not None or s.pid not in alive}

    def _release(self, active: Active) -> Release | None:
        """What ended the step's wait (None when it never waited)."""
        if not active.waiting_reported:
            return None
        assert active.outcome is not None
        release = self.scheduler.book.release(
            active,
            active.outcome.error,
            lost=active.lost is not None,
            settle=self._settle_finished,
            gone=self._gone,
        )
        holder = self.scheduler.sessions.get(release.session or "") if release.cause == "terminated" else None
        own = self.scheduler.sessions[active.step.session]
        pauses = self.scheduler.pauses
        if isinstance(holder, LibpqSession) and holder is not own and pauses and release.seq not in pauses.crashes:
            pauses.found_ended_idle(holder)  # no step of the scenario did it: the server says what did
            if (why := holder.lost or holder.ended) is not None:
                release = dataclasses.replace(release, reason=f"{why.sqlstate}: {why.message}")
        return release

    def report(self, session: Session, active: Active) -> None:
        assert active.outcome is not None
        self._note_completion(session, active)  # outcomes set at launch (a crash, a sleep) are noted here
        note_attempt(self.scheduler.scenario, session, active)
        self.scheduler.book.finished(active.seq, active.outcome, active.waiting_reported, self._release(active))
        self.scheduler.last_done = active.seq
        if active.lost is not None:
            self.scheduler.recorder.add(active.lost)
        if self.scheduler.pauses is not None and self.scheduler.scenario.format == "pgrace":
            self.scheduler.pauses.look_for_ended_idle()  # a spec keeps isolationtester's view: a loss shows later
        session.heard(self.scheduler.recorder, self.scheduler.inspector)
        session.active = None
        if self.scheduler.locks_each_completion:
            self.scheduler.observe_locks(active.seq)

    def _capture(self, session: Session, active: Active) -> None:
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
                    self.scheduler.scenario.source,
                    step.line,
                )
            index = last.columns.index(column)
            if last.rows:
                session.variables[variable] = Value(last.rows[0][index], last.text_rows[0][index])
            else:
                session.variables[variable] = Value(None)
