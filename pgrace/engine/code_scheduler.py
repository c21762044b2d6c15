"""The scheduler of the application's code: one statement let go at a time, the rest settled first.

:class:`CodeScheduler` lets one statement go, then waits until every session is settled:
parked at its next statement, finished, or *seen blocked by the server* (the observer's
probe, :meth:`~pgrace.locks.LockInspector.is_blocked`, asked while the session's thread
is inside psycopg's ``execute``). A blocked session stays pending while the others go on,
exactly as in a scenario run, and its steps are kept in the same
:class:`~pgrace.engine.steps.StepBook`. Its waiting strategy is a condition the session
threads notify, where the libpq scheduler ``select``s on sockets.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pgrace.engine.steps import Launched
from pgrace.engine.threads import Gate, ThreadSession, raised_at, where_defined
from pgrace.errors import CodeError, StepsStuck
from pgrace.timeline import Holder, Outcome, SqlError

if TYPE_CHECKING:
    import threading

    from pgrace.engine.steps import StepBook
    from pgrace.engine.threads import SessionCode
    from pgrace.locks import LockInspector

Chooser = Callable[[list[str]], str]


@dataclass
class CodeStep(Launched):
    """A launched statement whose end has not been reported yet."""

    name: str  # the step's name
    session: str


@dataclass
class Discovered:
    """A step as it was met in one run, for the run's Scenario."""

    name: str
    session: str
    sql: str
    where: str
    line: int | None


class CodeScheduler:
    """One run's launches, waits, cancels and completions over the session threads."""

    def __init__(
        self,
        sessions: Mapping[str, ThreadSession],
        code: Mapping[str, SessionCode],
        cond: threading.Condition,
        book: StepBook,
        inspector: LockInspector,
        *,
        step_timeout: float,
        observe: bool,
        row_locks: bool,
    ) -> None:
        self.sessions = sessions
        self.code = code
        self.cond = cond
        self.book = book
        self.inspector = inspector
        self.step_timeout = step_timeout
        self.observe = observe
        self.row_locks = row_locks
        self.gates: dict[str, Gate] = {name: s.gate for name, s in sessions.items()}
        self.steps: list[Discovered] = []
        self.active: dict[str, CodeStep] = {}
        self.counts: dict[str, int] = {}

    def run(self, chooser: Chooser) -> list[tuple[str, ...]]:
        """Let the sessions go under ``chooser``'s order; the options met at each choice (the ready sessions)."""
        met: list[tuple[str, ...]] = []
        self.settle(None)
        while True:
            with self.cond:
                ready = [n for n, g in self.gates.items() if g.state == "ready"]
                done = all(g.state == "done" for g in self.gates.values())
            if done:
                return met
            if not ready:
                self._wait_blocked()
                continue
            met.append(tuple(ready))
            launched = self._launch(self.gates[chooser(ready)])
            self.settle(launched)

    def _step_name(self, session: str) -> str:
        self.counts[session] = self.counts.get(session, 0) + 1
        return f"{session}.{self.counts[session]}"

    def _launch(self, gate: Gate) -> CodeStep:
        self.report_raised()  # an exception comes before the rollback of what it left open
        with self.cond:
            request = gate.request
            assert request is not None
            gate.steps += 1
            step_name = self._step_name(gate.name)
            tx_before = self.sessions[gate.name].transaction_status()
            self.steps.append(Discovered(step_name, gate.name, request.sql, request.where, request.line))
            seq = self.book.launch(step_name, gate.name, request.sql)
            active = CodeStep(seq, time.perf_counter(), step_name, gate.name, tx_before=tx_before)
            self.active[gate.name] = active
            gate.state, gate.since, gate.request = "running", time.perf_counter(), None
            gate.permitted = True
            self.cond.notify_all()
        return active

    def settle(self, launched: CodeStep | None) -> None:
        """Wait until every session is parked, done or seen blocked; report completions as they come.

        The step just launched is reported first, then the others in launch order (as the runner).
        """
        slice_s = 0.0001
        while True:
            self._report_finished(launched)
            with self.cond:
                moving = [g for g in self.gates.values() if g.state == "python" or g.finished is not None]
                running = [g for g in self.gates.values() if g.state == "running" and g.finished is None]
            now = time.perf_counter()
            for gate in moving:
                if gate.finished is None and now - gate.since > self.step_timeout:
                    path, line = where_defined(self.code[gate.name])
                    raise CodeError(
                        f"session {gate.name} ran Python for more than {self.step_timeout:g} s without sending"
                        " a statement or returning",
                        path,
                        line,
                    )
            unblocked = []
            for gate in running:
                active = self.active[gate.name]
                if self.inspector.is_blocked(self.sessions[gate.name].pid):
                    with self.cond:
                        if gate.finished is not None:
                            continue
                    if not active.waiting_reported:
                        self._report_waiting(active)
                else:
                    unblocked.append(active)
            for active in unblocked:
                self._bound(active, now)
            if not moving and not unblocked:
                return
            with self.cond:
                self.cond.wait(slice_s)
            slice_s = min(slice_s * 2, 0.001)

    def _bound(self, active: CodeStep, now: float) -> None:
        """A statement running (not blocked) past the step timeout is cancelled once; past three, the run ends."""
        step = next(s for s in self.steps if s.name == active.name)
        self.book.cut(
            active,
            self.sessions[active.session],
            now - active.sent,
            lambda graph: (),
            lambda: StepsStuck(
                f"step {active.name} did not finish even after it was cancelled: {step.sql}", step.where
            ),
        )

    def _wait_blocked(self) -> None:
        """No session can go on: every one left waits for a lock. Wait for the server to end a wait
        (deadlock detector, lock_timeout), up to the step timeout; then cancel the oldest waiter."""
        started = time.perf_counter()
        while True:
            with self.cond:
                if any(
                    g.finished is not None or g.state != "running" for g in self.gates.values() if g.state != "done"
                ):
                    break
                self.cond.wait(0.001)
            if time.perf_counter() - started >= self.step_timeout:
                oldest = min(self.active.values(), key=lambda a: a.seq)
                if oldest.cancelled:
                    raise StepsStuck(f"step {oldest.name} did not finish even after it was cancelled")
                oldest.sent = time.perf_counter() - self.step_timeout
                self.book.cut(  # its holders are named: it waited for a lock
                    oldest,
                    self.sessions[oldest.session],
                    self.step_timeout,
                    lambda graph: tuple(Holder(n, "") for _, on in graph for n in on),
                    functools.partial(StepsStuck, f"step {oldest.name} did not finish even after it was cancelled"),
                )
                started = time.perf_counter()
        self.settle(None)

    def _report_waiting(self, active: CodeStep) -> None:
        detected = self.book.recorder.now()
        waits = self.inspector.describe_waits(self.sessions[active.session].pid) if self.observe else ()
        self.book.waiting(active, waits, detected)

    def _settle_blockers(self, names: Iterable[str]) -> None:
        """Note the completions of the blockers' steps the server has finished but the scheduler not yet reported.

        A holder's COMMIT frees the waiter before its own answer reaches its thread, so the
        waiter's thread can report first. A blocker whose backend is no longer active has
        its answer on the wire: it is waited for, and noted for the release (its report
        follows). One still active has not finished, and is not waited for.
        """
        pending = {n: self.active[n] for n in names if n in self.active}
        if not pending:
            return
        states = self.inspector.states([self.sessions[n].pid for n in pending])
        for name, active in pending.items():
            gate = self.gates[name]
            with self.cond:
                if states.get(self.sessions[name].pid) != "active":
                    deadline = time.perf_counter() + self.step_timeout
                    while gate.finished is None and (left := deadline - time.perf_counter()) > 0:
                        self.cond.wait(left)
                finished = gate.finished
            if finished is not None:
                outcome, after = finished
                self.book.completed(active.seq, active.tx_before, after, outcome.error, False)

    def report_raised(self) -> None:
        """An exception that escaped a session's code (not the one a statement raised) is its last outcome."""
        with self.cond:
            ended = [
                g
                for g in self.gates.values()
                if g.raised is not None and not g.reported and (g.state == "done" or g.end_location is not None)
            ]
            for gate in ended:
                gate.reported = True
        for gate in ended:
            exc = gate.raised
            assert exc is not None
            if exc is gate.step_error or getattr(exc, "orig", None) is gate.step_error is not None:
                continue  # the statement's own error, already in the timeline (SQLAlchemy wraps it)
            if gate.steps == 0:
                continue  # bad input, said by the runner's input check
            name = self._step_name(gate.name)
            kind = type(exc).__name__
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else kind
            path, line = raised_at(exc)
            text = f"raise {kind}({message!r})"
            self.steps.append(Discovered(name, gate.name, text, f"{path}:{line}", line))
            seq = self.book.launch(name, gate.name, text)
            error = SqlError(kind, message, "ERROR", "raised by the session's Python code")
            self.book.finished(seq, Outcome(error=error))

    def _report_finished(self, launched: CodeStep | None) -> None:
        self.report_raised()
        with self.cond:
            done = [(g, g.finished) for g in self.gates.values() if g.finished is not None]
            for gate, _ in done:
                gate.finished = None
        if not done:
            return
        first = launched.session if launched is not None else None
        done.sort(key=lambda pair: (pair[0].name != first, self.active[pair[0].name].seq))
        for gate, finished in done:
            assert finished is not None
            outcome, after = finished
            active = self.active.pop(gate.name)
            if active.cancelled and outcome.error is not None and outcome.error.sqlstate == "57014":
                why = f"pgrace cancelled it after the step timeout {self.step_timeout:g} s"
                outcome = dataclasses.replace(outcome, error=dataclasses.replace(outcome.error, detail=why))
            self.book.completed(active.seq, active.tx_before, after, outcome.error, False)
            release = None
            if active.waiting_reported:
                release = self.book.release(
                    active,
                    outcome.error,
                    lost=False,
                    settle=self._settle_blockers,
                    gone=lambda names: set(),
                )
            self.book.finished(active.seq, outcome, active.waiting_reported, release)
            if self.observe:
                self.book.observe_locks(active.seq, self.row_locks)
