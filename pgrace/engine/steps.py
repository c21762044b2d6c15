"""The steps' book: the one place a step's launch, wait, cancel and end become timeline events.

Both schedulers (scenario steps over libpq, the application's code over threads) keep
their steps here: :class:`StepBook` numbers launches, records them, tells the
:class:`~pgrace.engine.observe.releases.ReleaseTracker` every launch, wait and completion, attributes a
wait's end, and observes the locks after a step. What differs between the two is only how
a session's statement is sent and waited for (:mod:`pgrace.engine.session`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from psycopg import pq

from pgrace.engine.observe.footprints import footprints
from pgrace.engine.observe.locks import LockSnapshot
from pgrace.engine.observe.releases import ReleaseTracker
from pgrace.model.scenario import PermutationStep, Step
from pgrace.model.timeline import (
    Event,
    FootprintObserved,
    Holder,
    LocksObserved,
    Outcome,
    Release,
    Run,
    ServerChose,
    SessionLost,
    SqlError,
    StepCancelled,
    StepFinished,
    StepLaunched,
    StepWaiting,
    Wait,
)

if TYPE_CHECKING:
    from pgrace.engine.session import Inspector, LiveSession


Graph = tuple[tuple[str, tuple[str, ...]], ...]  # who waits for whom, by session name


@dataclass
class Launched:
    """A launched step, as the book keeps it whatever its transport: when it was sent, what was told of it."""

    seq: int
    sent: float
    tx_before: pq.TransactionStatus = field(default=pq.TransactionStatus.IDLE, kw_only=True)  # when it was sent
    waiting_reported: bool = field(default=False, kw_only=True)
    cancelled: bool = field(default=False, kw_only=True)


@dataclass
class Active(Launched):
    """A launched step whose completion has not been reported yet (a scenario's, or the code's statement)."""

    step: Step
    entry: PermutationStep
    notice_targets: dict[str, int] = field(default_factory=dict)
    outcome: Outcome | None = None
    lost: SessionLost | None = None  # the session's connection was found gone during this step
    seen_after: int = 0  # the step last done when its wait was last read


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

    def __init__(self, recorder: Recorder, inspector: Inspector, step_timeout: float) -> None:
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
        step: Launched,
        waits: tuple[Wait, ...],
        detected: float,
        markers: Iterable[str] = (),
        by_marker: bool = False,
    ) -> None:
        """``detected``: when the wait was seen, taken before describing it (the latency is detection's alone)."""
        step.waiting_reported = True
        self.releases.waiting(step.seq, waits, markers)
        self.recorder.add(StepWaiting(step.seq, waits, detected, by_marker=by_marker))

    def cut(
        self,
        step: Launched,
        session: LiveSession,
        elapsed: float,
        holders: Callable[[Graph], tuple[Holder, ...]],
        stuck: Callable[[], Exception],
    ) -> bool:
        """pgrace's own cancel, once, when a step has run ``elapsed`` past the step timeout; True when it cancels now.

        The cancel is recorded with who blocked whom at that moment (``holders``: what each
        blocker was doing). A step still running three timeouts on is stuck: ``stuck()`` is raised.
        """
        if step.cancelled or elapsed < self.step_timeout:
            if step.cancelled and elapsed > 3 * self.step_timeout:
                raise stuck()
            return False
        graph = self.inspector.blocking_graph()
        named = holders(graph)
        step.cancelled = True
        self.recorder.add(StepCancelled(step.seq, self.step_timeout, graph, self.recorder.now(), named))
        session.cancel()
        return True

    def release(
        self,
        step: Launched,
        error: SqlError | None,
        *,
        lost: bool,
        collect: Callable[[Iterable[str]], None],
        gone: Callable[[Iterable[str]], set[str]],
    ) -> Release:
        """What ended a step's wait (see :class:`~pgrace.engine.observe.releases.ReleaseTracker`)."""
        return self.releases.attribute(
            step.seq, error, cancelled_by_pgrace=step.cancelled, lost=lost, collect=collect, gone=gone
        )

    def finished(self, seq: int, outcome: Outcome, after_wait: bool = False, release: Release | None = None) -> None:
        self.releases.woke(seq, release)
        self.recorder.add(StepFinished(seq, outcome, self.recorder.now(), after_wait=after_wait, release=release))

    def server_chose(self, step: Launched, winner_seq: int, released_by: int, waits: tuple[Wait, ...]) -> None:
        """Step ``winner_seq``, woken with ``step`` by ``released_by``, went first: ``step`` waits for it now."""
        winner = self.releases.session_of[winner_seq]
        self.releases.also_waiting(step.seq, waits)  # its release is now the winner's to give
        self.recorder.add(ServerChose(step.seq, winner_seq, winner, released_by, waits, self.recorder.now()))

    def observe_footprints(self, live: dict[int, tuple[str, bool]]) -> None:
        """Every lock the sessions (pid: name, busy) hold, their rows, and who keeps a snapshot: which steps commute."""
        entries = footprints(self.inspector.observer, list(live))
        held = tuple((name, busy, frozenset(entries[pid])) for pid, (name, busy) in live.items())
        self.recorder.add(FootprintObserved(self.seq, held, self.recorder.now()))

    def observe_locks(self, seq: int, row_locks: bool) -> None:
        """The locks held after step ``seq`` (``row_locks``: pgrowlocks is there to read rows)."""
        snapshot = self.inspector.row_locks() if row_locks else LockSnapshot(None, ())
        others = self.inspector.other_locks()
        self.recorder.add(LocksObserved(seq, snapshot.locks, self.recorder.now(), snapshot.skipped, others))
