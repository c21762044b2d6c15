"""The scheduler of scenario steps: launch, wait, cancel, complete, in isolationtester's order.

A step is sent asynchronously; the scheduler then waits until it either finishes or the
server says it is blocked by another session of the scenario (the observer's probe). It
never sleeps to guess. A blocked step stays pending while later steps run; completions are
recorded right after the step that released them, oldest launch first (when the next
step's session is still busy, that session's own step is waited for and reported first).
While a pgrace scenario's step runs (a long statement, or a wait), the other sessions are
watched too: a step that ends meanwhile is reported when it ends.
Completion markers (``(*)``, ``(step)``, ``(step notices N)``) hold back the report of a
finished step. The events themselves are the :class:`~pgrace.engine.steps.StepBook`'s.

The scheduler is written once over :class:`~pgrace.engine.session.LiveSession`; what differs
by transport is its :class:`~pgrace.engine.transport.Transport`: how it waits (a
scenario's libpq sessions are selected on, the application's thread sessions waited for
on their gates) and the steps it runs itself (a scenario's sleeps and crashes). The
scheduler alone writes its state; a transport's hook hands steps back through
:class:`~pgrace.engine.transport.LaunchedSteps`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pgrace.engine.completions import Completions
from pgrace.engine.steps import Active
from pgrace.errors import StepsStuck
from pgrace.model.scenario import PermutationStep, Scenario, Step
from pgrace.model.timeline import Holder, Outcome, Run, SqlError, Wait
from pgrace.model.variables import FACTS, Value, find, param_values, substitute

if TYPE_CHECKING:
    from pgrace.engine.options import RunOptions
    from pgrace.engine.session import Inspector, LiveSession
    from pgrace.engine.steps import Recorder, StepBook
    from pgrace.engine.transport import Transport


def uses_facts(sql: str) -> bool:
    """Whether ``sql`` names a session's fact (``:worker1.pid``), which the timeline shows as written."""
    return any(use.session is not None and use.name in FACTS for use in find(sql))


class Scheduler:
    """The launched steps of one set of sessions, and how each one's end is waited for and reported."""

    def __init__(
        self,
        scenario: Scenario,
        run: Run,
        options: RunOptions,
        sessions: Mapping[str, LiveSession],
        inspector: Inspector,
        book: StepBook,
        transport: Transport,
        *,
        locks_each_completion: bool = False,
    ) -> None:
        """``locks_each_completion``: locks observed after each step's end, not after each launch
        (what each of the code's statements left held, as it goes)."""
        self.scenario = scenario
        self.run = run
        self.options = options
        self.sessions = sessions
        self.inspector = inspector
        self.book = book
        self.recorder: Recorder = book.recorder
        self.transport = transport
        self._pending: list[Active] = []  # launched, not reported yet, oldest first: the pending steps
        self._last_done = 0  # the step reported done most recently (locks are observed after it)
        self.idle_at = 0.0  # when on_idle last ran
        self.permutation: tuple[PermutationStep, ...] = ()
        self.unlaunched = 0  # position in the permutation of the first step not sent yet
        self.params = param_values(scenario)
        # Params, and every capture NULL: one whose step has not finished (it still waits) is, as a failed one.
        self.unset = dict(self.params)
        self.unset.update({f"{s.session}.{name}": Value(None) for s in scenario.steps for name, _ in s.capture})
        self.locks_each_completion = locks_each_completion
        self.done = Completions(scenario, sessions, inspector, book, transport)
        self.chosen: set[tuple[int, int]] = set()  # (waiting step, the fellow waiter the server let go first)

    # -- launching -------------------------------------------------------------------------

    def launch_entry(self, step: Step, entry: PermutationStep) -> None:
        if self.options.before_step is not None:
            self.options.before_step(step)
        active = self._launch(step, entry)
        done = self.try_complete(active, blocking=False)
        self.poll_pending(blocking=False)
        if not done:
            self._pending.append(active)
        if not self.locks_each_completion:
            self.observe_locks(active.seq)

    def _launch(self, step: Step, entry: PermutationStep) -> Active:
        session = self.sessions[step.session]
        text = shown = step.sql
        own = step.sleep is not None or step.crash is not None
        quoting = None if self.options.isolationtester or own else self.transport.quoting(session)
        if quoting is not None and find(step.sql):  # no variable: nothing to scan
            text = shown = substitute(step.sql, self.values(session), quoting)
            if uses_facts(step.sql):
                shown = substitute(step.sql, self.values(session, facts=False), quoting)
        tx_before = session.transaction_status()
        seq = self.book.launch(step.name, step.session, shown)
        active = Active(seq, time.perf_counter(), step, entry, tx_before=tx_before)
        for blocker in entry.blockers:
            if blocker.step is not None and blocker.notices is not None:
                other = self.sessions[self.scenario.step(blocker.step).session]
                active.notice_targets[other.name] = other.notices + blocker.notices
        session.active = active
        session.last_seq = active.seq
        if session.lost is not None:  # sending would only fail again: say why it was not sent
            message = f"not sent: session {session.name}'s connection was lost at step {session.lost.during_seq}"
            active.outcome = Outcome(error=SqlError("08003", message, "ERROR"))
            return active
        if own and (outcome := self.transport.run_own(session, active, self)) is not None:
            active.outcome = outcome  # a sleep, a crash: the transport's own step
            return active
        active.outcome = session.send(text, active)
        return active

    def values(self, session: LiveSession | None, facts: bool = True) -> dict[str, Value]:
        """What ``:variables`` stand for in a step of ``session`` (None: a final check).

        Params, then the session's own captures (which win, as they always did), then
        every session's captures and facts by qualified name (``:worker1.claimed_id``,
        ``:worker1.pid``). Without ``facts``, pids are left as written: the timeline shows
        ``:worker1.pid``, so its text stays the same on every run (it never shows pids).
        """
        values = dict(self.unset)
        if session is not None:
            values.update(session.variables)
        for other in self.sessions.values():
            values.update({f"{other.name}.{name}": value for name, value in other.variables.items()})
            if facts:
                values[f"{other.name}.pid"] = Value(other.pid)
        return values

    # -- waiting ---------------------------------------------------------------------------

    def wait_for_session(self, session: LiveSession) -> None:
        """The next step's session still runs an earlier step: wait for it, then the others.

        As isolationtester: the earlier step is waited for in blocking mode (no probe)
        and reported first; only then are the other pending steps polled. When one
        event frees several steps, the busy session's step thus comes before older ones.
        """
        deadline = time.perf_counter() + 2 * self.options.step_timeout
        done_before = self.last_done
        while session.active is not None:
            earlier = session.active
            if self.try_complete(earlier, blocking=True, retry=True):
                self._pending.remove(earlier)
            elif self._pending == [earlier]:  # held by a marker that nothing left can clear
                raise self.stuck(f"failed to complete permutation due to mutually-blocking steps: {earlier.step.name}")
            elif time.perf_counter() > deadline:  # held by a marker that nothing clears in time
                names = ", ".join(a.step.name for a in self._pending)
                raise self.stuck(f"step {earlier.step.name} timed out; active steps are: {names}")
            if self._pending:
                self.poll_pending(blocking=False)
        self._observe_after(done_before)

    def _observe_after(self, done_before: int) -> None:
        if self.last_done != done_before and not self.locks_each_completion:
            self.observe_locks(self.last_done)  # locks after the completions, before the next launch

    def overtaken(self, session: LiveSession) -> bool:
        """Whether the server let another waiter go first: then the session's step is waited for later.

        One COMMIT may wake several waiting steps, and the server, not the scenario, decides
        which goes first; the others then wait for that one, whose own later steps release
        them, so a blocking wait for one of them could only end at the step timeout. When the
        session's step, woken by the end of a transaction that also woke another waiter, is
        seen blocked by that waiter, the choice is recorded and True returned: the caller
        holds the session's steps back while the other sessions go on.
        """
        active = session.active
        if self.options.isolationtester or active is None or not active.waiting_reported:
            return False
        if not self.book.releases.rivals(active.seq):  # no fellow waiter was woken: nothing to choose
            return False
        done_before = self.last_done
        if self.try_complete(active, blocking=False, retry=True):  # not blocked (any more): reported as ever
            self._pending.remove(active)
            self.poll_pending(blocking=False)
            self._observe_after(done_before)
            return False
        if self.held_by_marker(active):
            return False
        return self._chosen(active, self.inspector.describe_waits(session.pid))

    def stuck(self, message: str) -> StepsStuck:
        """Steps that can never finish: the scenario's outcome (isolationtester exits 1), not the server's fault."""
        return StepsStuck(message, self.scenario.source)

    def poll_pending(self, blocking: bool) -> None:
        """Try every pending step (launched, not reported) in launch order; repeat while markers may have cleared."""
        while True:
            progressed = False
            notices_before = self._notice_count()
            for active in list(self._pending):
                if active not in self._pending:  # reported meanwhile, while another step ran
                    continue
                if self.try_complete(active, blocking=blocking, retry=True):
                    self._pending.remove(active)
                    progressed = True
            has_markers = any(a.entry.blockers for a in self._pending)
            if not (has_markers and (progressed or self._notice_count() != notices_before)):
                return

    def finish_permutation(self) -> None:
        """Wait for every pending step; finished steps held by markers must get free."""
        while self._pending:
            pending = len(self._pending)
            self.poll_pending(blocking=True)
            if len(self._pending) == pending:
                names = ", ".join(a.step.name for a in self._pending)
                raise self.stuck(f"failed to complete permutation due to mutually-blocking steps: {names}")
            if not self.locks_each_completion:
                self.observe_locks(self.last_done)  # a resolution (commit, deadlock, timeout) changes who holds what

    def idle(self) -> None:
        """Let a presenter redraw (a growing wait time) while we wait: at most every 100 ms."""
        if self.options.on_idle is not None and time.perf_counter() - self.idle_at >= 0.1:
            self.idle_at = time.perf_counter()
            self.options.on_idle()

    def _notice_count(self) -> int:
        return sum(s.notices for s in self.sessions.values())

    def try_complete(self, active: Active, blocking: bool, retry: bool = False) -> bool:
        """isolationtester's try_complete_step: True when the step has been reported done.

        Not ``blocking``: the step is waited for until it ends or the server says it is
        blocked (the probe, asked whenever a slice passes with no word from it). ``blocking``:
        until it ends; on a transport that watches no other session (the code's gates),
        also until another session's step ends, which may let a session go on.
        """
        session = self.sessions[active.step.session]
        if not retry and any(b.step is None for b in active.entry.blockers):
            self._report_waiting(active, by_marker=True)
            return False
        waiting = self.transport.waiting
        slice_s = waiting.first_slice
        called = time.perf_counter()
        while active.outcome is None and waiting.running(session):
            spoke, others = waiting.wait(session, slice_s, self._pending)
            slice_s = waiting.next_slice(slice_s)
            self.idle()
            if others and not self.transport.others_ended(active, others, self) and blocking:
                return False
            if spoke or self._timed_out(active, called):
                continue
            if not blocking and self.inspector.is_blocked(session.pid) and waiting.running(session, read=True):
                if not active.waiting_reported:
                    self._report_waiting(active, by_marker=False)
                elif self.last_done != active.seen_after:
                    self._still_waiting(active)
                return False
        if active.outcome is None:
            self.done.collect(session, active)
        if self.held_by_marker(active):
            if not active.waiting_reported:
                self._report_waiting(active, by_marker=True)
            return False
        self.report(session, active)
        return True

    def report(self, session: LiveSession, active: Active) -> None:
        """A collected step's end into the timeline, then what arrived since (a loss, notifications)."""
        self.done.finished(session, active, self._last_done)
        self._last_done = active.seq
        if active.lost is not None:
            self.recorder.add(active.lost)
        self.transport.step_reported(self._last_done)
        session.heard(self.recorder, self.inspector)
        session.active = None
        if self.locks_each_completion:
            self.observe_locks(active.seq)

    # -- what a transport's hook and the runners may ask and do ------------------------------

    @property
    def last_done(self) -> int:
        return self._last_done

    def is_pending(self, active: Active) -> bool:
        return active in self._pending

    def collect(self, session: LiveSession, active: Active) -> None:
        self.done.collect(session, active)

    def report_unless_held(self, session: LiveSession, active: Active) -> None:
        if not self.held_by_marker(active):
            self._pending.remove(active)
            self.report(session, active)
            self.observe_locks(active.seq)

    def oldest_pending(self) -> Active | None:
        """The pending step launched first, if any."""
        return self._pending[0] if self._pending else None

    def pending_sessions(self) -> frozenset[str]:
        """The sessions with a pending step (launched, not reported: running, or waiting for a lock)."""
        return frozenset(a.step.session for a in self._pending)

    def wait_for_oldest(self) -> None:
        """Every session left waits for a lock: wait for the oldest step until it ends (or the step timeout)."""
        oldest = self._pending[0]
        if self.try_complete(oldest, blocking=True, retry=True):
            self._pending.remove(oldest)

    def start_permutation(self, permutation: tuple[PermutationStep, ...]) -> None:
        """The order the next steps come from (a hang's diagnosis names each session's next step in it)."""
        self.permutation = permutation
        self.unlaunched = 0

    def launching(self, position: int) -> None:
        """The steps before ``position`` in the permutation have been launched or passed over."""
        self.unlaunched = position

    def _timed_out(self, active: Active, called: float) -> bool:
        """Cancel a step that waited longer than the step timeout (once), recording why.

        As isolationtester, the wait is counted from the start of this attempt to
        complete the step, not from its launch: a step seen blocked returns at once
        from non-blocking polls, so it is only cancelled when the runner itself has
        to wait for it that long (a blocking wait, or a slow step that is not blocked).
        """
        session = self.sessions[active.step.session]
        return self.book.cut(
            active,
            session,
            time.perf_counter() - called,
            self._holders,
            lambda: self.stuck(f"step {active.step.name} did not finish even after it was cancelled"),
        )

    def _holders(self, graph: tuple[tuple[str, tuple[str, ...]], ...]) -> tuple[Holder, ...]:
        """What each session waited for was doing, when it is not itself waiting: the diagnosis of a hang."""
        waiters = {who for who, _ in graph}
        names = [name for _, on in graph for name in on if name in self.sessions and name not in waiters]
        names = list(dict.fromkeys(names))
        states = self.inspector.states([self.sessions[name].pid for name in names])
        holders = []
        for name in names:
            session = self.sessions[name]
            later = (self.scenario.step(e.step) for e in self.permutation[self.unlaunched :])
            upcoming = next((step for step in later if step.session == name), None)
            holders.append(
                Holder(
                    name,
                    states.get(session.pid, ""),
                    running=session.active.step.name if session.active is not None else None,
                    next_step=upcoming.name if upcoming is not None else None,
                    next_sql=upcoming.sql if upcoming is not None else "",
                )
            )
        return tuple(holders)

    def held_by_marker(self, active: Active) -> bool:
        for blocker in active.entry.blockers:
            if blocker.step is None:
                continue
            other = self.sessions[self.scenario.step(blocker.step).session]
            if blocker.notices is not None:
                if other.notices < active.notice_targets.get(other.name, 0):
                    return True
            elif other.active is not None and other.active.step.name == blocker.step:
                return True
        return False

    def _still_waiting(self, active: Active) -> None:
        """A step still blocked after another finished: whom it waits for now joins whom it waited for.

        A row that transactions share (a multixact) keeps an UPDATE waiting for each in turn,
        and one that took its share after the wait began is named only now; the release is
        then the last one's COMMIT, not the first's.
        """
        active.seen_after = self.last_done
        if not self.options.describe_waits or self.options.isolationtester:
            return
        waits = self.inspector.describe_waits(self.sessions[active.step.session].pid)
        self.book.releases.also_waiting(active.seq, waits)
        self._chosen(active, waits)

    def _chosen(self, active: Active, waits: tuple[Wait, ...]) -> bool:
        """Whether another waiter, woken with this step by one release, went first and this one waits for it now.

        The server chose that order, not the scenario: it is recorded (once), in whichever
        order the server chose, so that the timeline says so either way.
        """
        now = {name for wait in waits for name in (*wait.blocked_by, *wait.queued_behind, wait.holder) if name}
        rivals = self.book.releases.rivals(active.seq, now)
        if not rivals:
            return False
        winner, released_by = rivals[0]
        if (active.seq, winner) not in self.chosen:
            self.chosen.add((active.seq, winner))
            self.book.server_chose(active, winner, released_by, waits)
        return True

    def _report_waiting(self, active: Active, by_marker: bool) -> None:
        detected = self.recorder.now()  # before describing: the latency is detection's alone
        active.seen_after = self.last_done
        session = self.sessions[active.step.session]
        waits = () if by_marker or not self.options.describe_waits else self.inspector.describe_waits(session.pid)
        markers = (self.scenario.step(b.step).session for b in active.entry.blockers if b.step is not None)
        self.book.waiting(active, waits, detected, markers, by_marker=by_marker)

    def observe_locks(self, seq: int) -> None:
        if self.options.footprints:
            live = {s.pid: (s.name, s.busy) for s in self.sessions.values() if s.lost is None and s.ended is None}
            self.book.observe_footprints(live)
        if self.options.track_row_locks:
            self.book.observe_locks(seq, self.run.row_locks_available)
