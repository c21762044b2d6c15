"""A scenario step's end: its results collected, its captures kept, what released it, its report.

A finished step is first *settled* (its results read, the release tracker told whether it
ended its transaction) and later *reported* (its StepFinished, with the release, then what
arrived since: a loss, notifications), because a completion marker may hold the report back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

from psycopg import pq

from pgrace.engine.libpq import Active, LibpqSession
from pgrace.engine.retries import note_attempt
from pgrace.errors import ScenarioError
from pgrace.timeline import NotifyReceived, Release
from pgrace.variables import Value

if TYPE_CHECKING:
    from pgrace.engine.scheduler import Scheduler


class Completions:
    """Settles and reports the steps of one scheduler."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def settle(self, session: LibpqSession, active: Active) -> None:
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

    def _note_completion(self, session: LibpqSession, active: Active) -> None:
        """Tell the book the step is over (once): did it end its transaction, or its session?"""
        assert active.outcome is not None
        lost = active.lost is not None or session.pgconn.status == pq.ConnStatus.BAD
        after = pq.TransactionStatus(pq.TransactionStatus.UNKNOWN if lost else session.pgconn.transaction_status)
        self.scheduler.book.completed(active.seq, active.tx_before, after, active.outcome.error, lost)

    def _settle_finished(self, names: Iterable[str]) -> None:
        """Collect the results that already arrived for these sessions' running steps (a deadlock victim's)."""
        for name in names:
            session = self.scheduler.sessions.get(name)
            active = session.active if session is not None else None
            if session is None or active is None or active.outcome is not None or session.lost is not None:
                continue
            session.consume()
            if not session.pgconn.is_busy():
                self.settle(session, active)

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
        if holder is not None and holder is not own and release.seq not in self.scheduler.pauses.crashes:
            self.scheduler.pauses.found_ended_idle(holder)  # no step of the scenario did it: the server says what did
            if (why := holder.lost or holder.ended) is not None:
                release = dataclasses.replace(release, reason=f"{why.sqlstate}: {why.message}")
        return release

    def report(self, session: LibpqSession, active: Active) -> None:
        assert active.outcome is not None
        self._note_completion(session, active)  # outcomes set at launch (a crash, a sleep) are noted here
        note_attempt(self.scheduler.scenario, session, active)
        self.scheduler.book.finished(active.seq, active.outcome, active.waiting_reported, self._release(active))
        self.scheduler.last_done = active.seq
        if active.lost is not None:
            self.scheduler.recorder.add(active.lost)
        if (
            self.scheduler.scenario.format == "pgrace"
        ):  # a spec keeps isolationtester's view: a loss shows at the next step
            self.scheduler.pauses.look_for_ended_idle()
        session.consume()  # as isolationtester: read what arrived since the result
        while (notify := session.pgconn.notifies()) is not None:
            pid = notify.be_pid
            sender = self.scheduler.inspector.name_of(pid) if pid in self.scheduler.inspector.sessions else f"PID {pid}"
            self.scheduler.recorder.add(
                NotifyReceived(
                    session.name, notify.relname.decode(), notify.extra.decode(), sender, self.scheduler.recorder.now()
                )
            )
        session.active = None

    def _capture(self, session: LibpqSession, active: Active) -> None:
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
