"""Who (or what) ended a wait: a step's completion attributed to its real cause.

The runner tells a :class:`ReleaseTracker` every launch, every wait it saw (with the
sessions the server named) and every completion (with the session's transaction status
before and after the step, from libpq). When a waiting step completes, :meth:`attribute`
decides, in this order:

1. the step's own error, by SQLSTATE: 40P01 (it was the deadlock detector's victim),
   55P03 (``lock_timeout``), 57014 (pgrace's own ``--step-timeout`` cancel when pgrace
   sent one, else ``statement_timeout`` or another backend's cancel request), a lost
   connection (its backend was terminated);
2. the latest step of a session it waited for (directly, or through the waits of those
   sessions) that completed during the wait and *ended* its transaction: its status went
   from in-transaction (or an autocommit statement) to idle, it aborted, or its
   connection died. A deadlock victim's abort names the deadlock detector (its result is
   collected early: the error is on the wire before its locks go); a lost session names
   the termination (and the ``crash`` step, if one did it);
3. a session it waited for whose backend is gone (``pg_terminate_backend`` from
   another session, a crash), asked of ``pg_stat_activity``;
4. the last launched step, when it belongs to a session it waited for and no other step
   completed since (a lock released inside a transaction: ``pg_advisory_unlock``,
   ``ROLLBACK TO SAVEPOINT``), even while it still runs (``COMMIT; SELECT pg_sleep(1)``);
5. otherwise ``unknown``: pgrace does not credit a step that released nothing.

It never reads message text where a SQLSTATE decides; 57014 alone does not tell a
``statement_timeout`` from ``pg_cancel_backend``, so there (only) the message decides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from psycopg import pq

from pgrace.model.timeline import Release, SqlError, Wait

TX_ENDED = (pq.TransactionStatus.IDLE, pq.TransactionStatus.INERROR)
LOST_STATES = ("57P01", "57P02", "57P03", "08006", "08003")


@dataclass(frozen=True)
class Finished:
    """A completed step, as far as releasing others goes."""

    seq: int
    session: str
    order: int  # the tracker's clock when it completed
    released: bool  # its transaction (or autocommit statement) ended, or aborted: its locks are gone
    error: SqlError | None
    lost: bool


def ended_transaction(before: pq.TransactionStatus, after: pq.TransactionStatus, lost: bool) -> bool:
    """The step left its session without the locks it held: committed, rolled back, aborted or gone."""
    return lost or (after in TX_ENDED and before != pq.TransactionStatus.INERROR)


class ReleaseTracker:
    """Launches, waits and completions in order; attributes each wait's end."""

    def __init__(self) -> None:
        self.clock = 0
        self.last_launched = 0
        self.launched_at: dict[int, int] = {}
        self.session_of: dict[int, str] = {}
        self.waits: dict[int, tuple[Wait, ...]] = {}
        self.marker_sessions: dict[int, set[str]] = {}
        self.finished: dict[int, Finished] = {}
        self.woken_by: dict[int, int] = {}  # a step that waited -> the step whose end released it

    def launched(self, seq: int, session: str) -> None:
        self.clock += 1
        self.last_launched = seq
        self.launched_at[seq] = self.clock
        self.session_of[seq] = session

    def waiting(self, seq: int, waits: tuple[Wait, ...], markers: Iterable[str] = ()) -> None:
        """``markers``: sessions whose steps a completion marker makes this step wait for."""
        self.waits[seq] = waits
        self.marker_sessions[seq] = set(markers)

    def also_waiting(self, seq: int, waits: tuple[Wait, ...]) -> None:
        """The step, still waiting, now waits for these too (its wait read again after another step ended)."""
        self.waits[seq] = (*self.waits.get(seq, ()), *waits)

    def completed(
        self,
        seq: int,
        before: pq.TransactionStatus,
        after: pq.TransactionStatus,
        error: SqlError | None,
        lost: bool,
    ) -> None:
        """Record a completion once (a step collected early is not recorded again when reported)."""
        if seq in self.finished:
            return
        self.clock += 1
        released = ended_transaction(before, after, lost)
        self.finished[seq] = Finished(seq, self.session_of[seq], self.clock, released, error, lost)

    def woke(self, seq: int, release: Release | None) -> None:
        """Step ``seq``'s wait was ended by a step (``release``): the fellow waiters it may have overtaken ask."""
        if release is not None and release.cause == "step" and release.seq is not None:
            self.woken_by[seq] = release.seq

    def rivals(self, seq: int, waiting_for: set[str] | None = None) -> list[tuple[int, int]]:
        """Steps woken, while ``seq`` waited, by the end of a transaction ``seq`` waited for too.

        Each as ``(the woken step, the step that woke it)``, the latest woken first. With
        ``waiting_for`` (the sessions ``seq`` waits for now), only the woken steps of those:
        the server let them go first, and ``seq`` waits for them now.
        """
        own = self.session_of[seq]
        start = self.launched_at[seq]
        waited = _sessions(self.waits.get(seq, ()))
        found = []
        for woken, release in self.woken_by.items():
            session = self.session_of[woken]
            done, freed = self.finished.get(woken), self.finished.get(release)
            if session == own or done is None or freed is None or done.order < start or freed.order < start:
                continue
            if freed.session in waited and (waiting_for is None or session in waiting_for):
                found.append((done.order, woken, release))
        return [(woken, release) for _, woken, release in sorted(found, reverse=True)]

    def blockers(self, seq: int) -> set[str]:
        """Sessions the step waited for, and those they in turn waited for during its wait."""
        own = self.session_of[seq]
        found = (_sessions(self.waits.get(seq, ())) | self.marker_sessions.get(seq, set())) - {own}
        start = self.launched_at[seq]
        frontier = set(found)
        while frontier:
            more: set[str] = set()
            for other, waits in self.waits.items():
                if other == seq or self.session_of[other] not in frontier:
                    continue
                done = self.finished.get(other)
                if done is not None and done.order < start:
                    continue  # ended before this wait began
                more |= _sessions(waits)
            frontier = more - found - {own}
            found |= frontier
        return found

    def attribute(
        self,
        seq: int,
        error: SqlError | None,
        cancelled_by_pgrace: bool,
        lost: bool,
        collect: Callable[[Iterable[str]], None],
        gone: Callable[[Iterable[str]], set[str]],
    ) -> Release:
        """What ended step ``seq``'s wait. ``collect`` reads blockers' finished results early;
        ``gone`` names the sessions whose backend no longer exists."""
        own = self.session_of[seq]
        if lost:
            return Release("terminated", session=own)
        if error is not None:
            by_error = _release_by_error(seq, own, error, cancelled_by_pgrace)
            if by_error is not None:
                return by_error
        blockers = self.blockers(seq)
        collect(blockers)  # a deadlock victim's error is on the wire before its locks are released
        start = self.launched_at[seq]
        during = [f for f in self.finished.values() if f.order > start and f.session in blockers and f.seq != seq]
        ended = [f for f in during if f.released]
        if ended:
            last = max(ended, key=lambda f: f.order)
            if last.lost:
                return Release("terminated", seq=last.seq, session=last.session)
            if last.error is not None and last.error.sqlstate == "40P01":
                return Release("deadlock", seq=last.seq)
            return Release("step", seq=last.seq, session=last.session, failed=last.error is not None)
        dead = gone(sorted(blockers))
        if dead:
            return Release("terminated", session=sorted(dead)[0])
        newest = self.finished.get(self.last_launched)
        others = [f.order for f in self.finished.values() if f.seq != seq]
        if newest is not None and newest in during and newest.order == max(others):
            return Release("step", seq=newest.seq, session=newest.session, failed=newest.error is not None)
        running = self.last_launched
        if (
            newest is None
            and running != seq
            and self.session_of.get(running) in blockers
            and self.launched_at[running] > start
            and all(order < self.launched_at[running] for order in others)
        ):
            return Release("step", seq=running, session=self.session_of[running])
        return Release("unknown")


def _release_by_error(seq: int, own: str, error: SqlError, cancelled_by_pgrace: bool) -> Release | None:
    state = error.sqlstate
    if state == "40P01":
        return Release("deadlock", seq=seq)
    if state == "55P03":
        return Release("lock_timeout")
    if state == "57014":
        if cancelled_by_pgrace:
            return Release("step_timeout")
        # 57014 is every cancel; only the server's words tell statement_timeout from pg_cancel_backend
        return Release("statement_timeout" if "statement timeout" in error.message else "cancel")
    if state in LOST_STATES:
        return Release("terminated", session=own)
    return None


def _sessions(waits: tuple[Wait, ...]) -> set[str]:
    names: set[str] = set()
    for wait in waits:
        names |= set(wait.blocked_by) | set(wait.queued_behind)
        if wait.holder:
            names.add(wait.holder)
    return names
