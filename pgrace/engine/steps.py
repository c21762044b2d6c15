"""The steps' book: the one place a step's launch, wait, cancel and end become timeline events.

Both schedulers (scenario steps over libpq, the application's code over threads) keep
their steps here: :class:`StepBook` numbers launches, records them, tells the
:class:`~pgrace.releases.ReleaseTracker` every launch, wait and completion, attributes a
wait's end, and observes the locks after a step. What differs between the two is only how
a session's statement is sent and waited for (:mod:`pgrace.engine.session`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from psycopg import pq

from pgrace.locks import LockSnapshot
from pgrace.releases import ReleaseTracker
from pgrace.timeline import (
    Event,
    Holder,
    LocksObserved,
    Outcome,
    Release,
    Run,
    SqlError,
    StepCancelled,
    StepFinished,
    StepLaunched,
    StepWaiting,
    Wait,
)

if TYPE_CHECKING:
    from pgrace.engine.session import Session
    from pgrace.locks import LockInspector


class Recorder:
    """Appends events to the run, stamping them, and forwards them to a live listener."""

    def __init__(self, run: Run, listener: Callable[[Event], None] | None) -> None:
        self.run = run
        self.listener = listener
        self.start = time.perf_counter()

    def now(self) -> float:
        return (time.perf_counter() - self.start) * 1000.0

    def add(self, event: Event) -> None:
        self.run.events.append(event)
        if self.listener is not None:
            self.listener(event)


class StepBook:
    """Launch numbers, the release tracker, and the step events of one run."""

    def __init__(self, recorder: Recorder, inspector: LockInspector, step_timeout: float) -> None:
        self.recorder = recorder
        self.inspector = inspector
        self.step_timeout = step_timeout
        self.seq = 0
        self.releases = ReleaseTracker()

    def new_permutation(self) -> None:
        """Waits and completions never cross permutations (nor runs of code)."""
        self.releases = ReleaseTracker()

    def launch(self, step: str, session: str, shown: str) -> int:
        """The next launch's number, its StepLaunched recorded and the tracker told."""
        self.seq += 1
        self.recorder.add(StepLaunched(self.seq, step, session, shown, self.recorder.now()))
        self.releases.launched(self.seq, session)
        return self.seq

    def waiting(
        self,
        seq: int,
        waits: tuple[Wait, ...],
        detected: float,
        markers: Iterable[str] = (),
        by_marker: bool = False,
    ) -> None:
        """``detected``: when the wait was seen, taken before describing it (the latency is detection's alone)."""
        self.releases.waiting(seq, waits, markers)
        self.recorder.add(StepWaiting(seq, waits, detected, by_marker=by_marker))

    def cancel(
        self, seq: int, session: Session, graph: tuple[tuple[str, tuple[str, ...]], ...], holders: tuple[Holder, ...]
    ) -> None:
        """pgrace's own cancel at the step timeout, recorded with who blocked whom at that moment."""
        self.recorder.add(StepCancelled(seq, self.step_timeout, graph, self.recorder.now(), holders))
        session.cancel()

    def completed(
        self,
        seq: int,
        before: pq.TransactionStatus,
        after: pq.TransactionStatus,
        error: SqlError | None,
        lost: bool,
    ) -> None:
        """The step is over: did it end its transaction, or its session? (What releasing others depends on.)"""
        self.releases.completed(seq, before, after, error, lost)

    def release(
        self,
        seq: int,
        error: SqlError | None,
        *,
        cancelled: bool,
        lost: bool,
        settle: Callable[[Iterable[str]], None],
        gone: Callable[[Iterable[str]], set[str]],
    ) -> Release:
        """What ended a step's wait (see :class:`~pgrace.releases.ReleaseTracker`)."""
        return self.releases.attribute(seq, error, cancelled_by_pgrace=cancelled, lost=lost, settle=settle, gone=gone)

    def finished(self, seq: int, outcome: Outcome, after_wait: bool = False, release: Release | None = None) -> None:
        self.recorder.add(StepFinished(seq, outcome, self.recorder.now(), after_wait=after_wait, release=release))

    def observe_locks(self, seq: int, row_locks: bool) -> None:
        """The locks held after step ``seq`` (``row_locks``: pgrowlocks is there to read rows)."""
        snapshot = self.inspector.row_locks() if row_locks else LockSnapshot(None, ())
        others = self.inspector.other_locks()
        self.recorder.add(LocksObserved(seq, snapshot.locks, self.recorder.now(), snapshot.skipped, others))
