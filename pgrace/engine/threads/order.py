"""The application's code on the one scheduler: which session's statement goes next, chosen at each step.

The code's statements are known only as its threads reach them, so the order is chosen as
the run goes: :class:`CodeOrder` waits until every session is *settled* (parked at its next
statement, finished, or seen blocked by the server), asks the chooser which of the parked
sessions goes, and hands that statement to the :class:`~pgrace.engine.scheduler.Scheduler`,
the same one scenario steps run on: it launches the step, waits for it on its gate
(:class:`~pgrace.engine.threads.waiting.GateWaiting`), sees it blocked, cancels it at the step
timeout, reports its end and what released it, and observes the locks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from pgrace.engine.options import RunOptions
from pgrace.engine.scheduler import Scheduler
from pgrace.engine.threads.frames import raised_at, where_defined
from pgrace.engine.threads.session import Gate, ThreadSession
from pgrace.engine.threads.waiting import GateWaiting
from pgrace.engine.transport import Plain
from pgrace.engine.waiting import FIRST_SLICE_S, backoff
from pgrace.errors import CodeError
from pgrace.model.scenario import PermutationStep, Scenario, Step
from pgrace.model.timeline import Outcome, Run, SqlError

if TYPE_CHECKING:
    import threading

    from pgrace.engine.observe.locks import LockInspector
    from pgrace.engine.steps import StepBook
    from pgrace.engine.threads.session import SessionCode

Chooser = Callable[[list[str]], str]


class CodeOrder:
    """One run of the sessions' code: the chooser's order, on the one scheduler."""

    def __init__(
        self,
        sessions: Mapping[str, ThreadSession],
        code: Mapping[str, SessionCode],
        cond: threading.Condition,
        book: StepBook,
        inspector: LockInspector,
        run: Run,
        *,
        step_timeout: float,
        observe: bool,
        footprints: bool = False,
    ) -> None:
        """``footprints``: what every session holds is read after each statement (explore's reduction)."""
        self.sessions = sessions
        self.code = code
        self.cond = cond
        self.book = book
        self.step_timeout = step_timeout
        self.gates: dict[str, Gate] = {name: s.gate for name, s in sessions.items()}
        self.steps: list[Step] = []  # as met, for the run's Scenario
        self.counts: dict[str, int] = {}
        self.raised: list[str] = []  # the steps that are a session's escaped exception: no statement, no choice
        path, _ = where_defined(next(iter(code.values())))
        options = RunOptions(
            step_timeout=step_timeout, track_row_locks=observe, describe_waits=observe, footprints=footprints
        )
        self.scheduler = Scheduler(
            Scenario(run.scenario.name, run.scenario.title, path),
            run,
            options,
            sessions,
            inspector,
            book,
            Plain(GateWaiting(sessions, cond, inspector, step_timeout)),
            locks_each_completion=True,  # what each statement left held, as the code goes
        )

    def run(self, chooser: Chooser) -> list[tuple[str, ...]]:
        """Let the sessions go under ``chooser``'s order; the options met at each choice (the ready sessions)."""
        met: list[tuple[str, ...]] = []
        self.settle()
        while True:
            with self.cond:
                ready = [n for n, g in self.gates.items() if g.state == "ready"]
                done = all(g.state == "done" for g in self.gates.values())
            if done:
                return met
            if not ready:  # every session left waits for a lock: wait for the server (or the step timeout)
                self.scheduler.wait_for_oldest()
                self.settle()
                continue
            met.append(tuple(ready))
            self._launch(self.gates[chooser(ready)])
            self.settle()

    def _step_name(self, session: str) -> str:
        self.counts[session] = self.counts.get(session, 0) + 1
        return f"{session}.{self.counts[session]}"

    def _launch(self, gate: Gate) -> None:
        self.report_raised()  # an exception comes before the rollback of what it left open
        with self.cond:
            request = gate.request
            assert request is not None
            gate.steps += 1
        step = Step(self._step_name(gate.name), gate.name, request.sql, note=request.where, line=request.line)
        self.steps.append(step)
        self.scheduler.launch_entry(step, PermutationStep(step.name))

    def settle(self) -> None:
        """Until every session is parked, done or seen blocked; a blocked step that ends meanwhile is reported.

        Python running past the step timeout without sending a statement or returning is bad input.
        """
        slice_s, since = FIRST_SLICE_S, time.perf_counter()
        while True:
            self.report_raised()
            if self.scheduler.oldest_pending() is not None:
                self.scheduler.poll_pending(blocking=False)
            with self.cond:
                moving = [g for g in self.gates.values() if g.state == "python"]
            if not moving:
                return
            now = time.perf_counter()
            for gate in moving:
                if now - gate.since > self.step_timeout:
                    path, line = where_defined(self.code[gate.name])
                    raise CodeError(
                        f"session {gate.name} ran Python for more than {self.step_timeout:g} s without sending"
                        " a statement or returning",
                        path,
                        line,
                    )
            with self.cond:
                self.cond.wait(slice_s)
            slice_s = backoff(slice_s, time.perf_counter() - since)

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
            path, line = raised_at(exc, gate.framework)
            text = f"raise {kind}({message!r})"
            self.steps.append(Step(name, gate.name, text, note=f"{path}:{line}", line=line))
            self.raised.append(name)
            seq = self.book.launch(name, gate.name, text)
            error = SqlError(kind, message, "ERROR", "raised by the session's Python code")
            self.book.finished(seq, Outcome(error=error))
