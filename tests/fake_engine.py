"""Scripted sessions on the one scheduler: what it does with its sessions' answers, with no server.

Nothing here claims how PostgreSQL behaves. A :class:`Desk` holds named locks and runs
each fake session's statements, written in a language of its own; :class:`FakeSession`
implements the engine's session protocol (:mod:`pgrace.engine.session`) over it,
:class:`FakeWaiting` is its waiting strategy and :class:`FakeInspector` reports the
desk's verdict ("blocked by whom?") as the observer's probe would. The tests built on it
claim only what the :class:`~pgrace.engine.scheduler.Scheduler` makes of those answers:
when it says a step waits, in which order it reports ends, when it cancels, which steps
a completion marker holds back. What a real server answers is tested on a real server.

A step's text is one statement of the script:

``lock R``      take R for the session until its ``commit``; waits while another session holds R
``share R``     take R shared until ``commit``: shares with other ``share R``, waits for a ``lock R``
``commit``      give back every lock of the session (its transaction ends)
``work N``      run, unblocked, for N of the scheduler's waits (a long statement)
``notice``      send the session one notice
``hang``        run until cancelled
``fail CODE``   fail with SQLSTATE CODE
``select V``    one row, one column ``v``, holding V
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import pq

from pgrace.engine.observe.locks import LockSnapshot
from pgrace.engine.options import RunOptions
from pgrace.engine.scheduler import Scheduler
from pgrace.engine.steps import Active, Recorder, StepBook
from pgrace.engine.transport import Plain, Transport
from pgrace.model.scenario import CompletionMarker, PermutationStep, Scenario, Session, Step
from pgrace.model.timeline import (
    Event,
    HeldLock,
    Outcome,
    ResultSet,
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
from pgrace.model.variables import Value

CANCELLED = SqlError("57014", "canceling statement due to user request")


@dataclass
class Statement:
    """One statement sent on a fake session, until it ends."""

    session: str
    verb: str
    arg: str
    work: int = 0  # waits left before a ``work N`` ends
    outcome: Outcome | None = None


@dataclass
class Desk:
    """The fake sessions' locks and running statements; it runs each statement as soon as it can."""

    held: dict[str, dict[str, str]] = field(default_factory=dict)  # lock -> session -> "lock" | "share"
    running: list[Statement] = field(default_factory=list)  # in the order sent
    in_transaction: set[str] = field(default_factory=set)

    def send(self, session: str, text: str) -> Statement:
        verb, _, arg = text.partition(" ")
        statement = Statement(session, verb, arg, work=int(arg) if verb == "work" else 0)
        self.running.append(statement)
        self.advance()
        return statement

    def blockers(self, statement: Statement) -> tuple[str, ...]:
        """The sessions holding what the statement waits for (none: it is not blocked)."""
        if statement.verb not in ("lock", "share") or statement.outcome is not None:
            return ()
        holders = self.held.get(statement.arg, {})
        return tuple(
            who
            for who, mode in holders.items()
            if who != statement.session and (statement.verb == "lock" or mode == "lock")
        )

    def tick(self) -> None:
        """One of the scheduler's waits went by: long statements get on."""
        for statement in self.running:
            if statement.verb == "work" and statement.work > 0:
                statement.work -= 1
        self.advance()

    def advance(self) -> None:
        """Run every statement that can run now, oldest first, until none can."""
        progressed = True
        while progressed:
            progressed = False
            for statement in list(self.running):
                if self._can_run(statement):
                    self._run(statement)
                    self.running.remove(statement)
                    progressed = True

    def _can_run(self, statement: Statement) -> bool:
        if statement.verb == "hang":
            return False
        if statement.verb == "work":
            return statement.work == 0
        return not self.blockers(statement)

    def _run(self, statement: Statement) -> None:
        verb, arg, who = statement.verb, statement.arg, statement.session
        if verb in ("lock", "share"):
            self.held.setdefault(arg, {})[who] = verb
            self.in_transaction.add(who)
            statement.outcome = Outcome(commands=(verb.upper(),))
        elif verb == "commit":
            for holders in self.held.values():
                holders.pop(who, None)
            self.in_transaction.discard(who)
            statement.outcome = Outcome(commands=("COMMIT",))
        elif verb == "fail":
            statement.outcome = Outcome(error=SqlError(arg, f"failed with {arg}"))
        elif verb == "select":
            statement.outcome = Outcome(results=(ResultSet(("v",), ((arg,),)),))
        else:  # work, notice
            statement.outcome = Outcome(commands=(verb.upper(),))

    def cancel(self, session: str) -> None:
        for statement in self.running:
            if statement.session == session:
                statement.outcome = Outcome(error=CANCELLED)
                self.running.remove(statement)
                return


class FakeSession:
    """One scripted session, implementing the scheduler's session protocol over a :class:`Desk`."""

    def __init__(self, name: str, pid: int, desk: Desk) -> None:
        self.name = name
        self._pid = pid
        self.desk = desk
        self.active: Active | None = None
        self.last_seq = 0
        self.notices = 0
        self.variables: dict[str, Value] = {}
        self.attempts: dict[str, int] = {}
        self.lost: SessionLost | None = None
        self.ended: SessionLost | None = None
        self.statement: Statement | None = None
        self.sent: list[str] = []  # every text sent, in order
        self.cancels = 0

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def busy(self) -> bool:
        return self.active is not None

    @property
    def done(self) -> bool:
        """Its statement has ended (its answer waits to be collected)."""
        return self.statement is not None and self.statement.outcome is not None

    def transaction_status(self) -> pq.TransactionStatus:
        if self.name in self.desk.in_transaction:
            return pq.TransactionStatus.INTRANS
        return pq.TransactionStatus.IDLE

    def send(self, text: str, active: Active) -> Outcome | None:
        self.sent.append(text)
        self.statement = self.desk.send(self.name, text)
        if self.statement.verb == "notice":
            self.notices += 1
        return None

    def collect(self, active: Active) -> tuple[Outcome, str | None]:
        assert self.statement is not None and self.statement.outcome is not None, "collected before it ended"
        outcome, self.statement = self.statement.outcome, None
        return outcome, None

    def ended_status(self, active: Active) -> tuple[bool, pq.TransactionStatus]:
        return False, self.transaction_status()

    def heard(self, recorder: Recorder, inspector: Any) -> None:
        """Nothing arrives between statements on a scripted session."""

    def cancel(self) -> None:
        self.cancels += 1
        self.desk.cancel(self.name)

    def lose(self, active: Active, received: SqlError | None, libpq: str) -> SqlError:
        raise AssertionError("a scripted session is never lost")


class FakeWaiting:
    """The waiting strategy of scripted sessions: each wait is one tick of the desk."""

    first_slice = 0.0001

    def __init__(self, sessions: Mapping[str, FakeSession]) -> None:
        self.sessions = sessions
        self.waits = 0

    def running(self, session: FakeSession, read: bool = False) -> bool:
        return session.statement is not None and session.statement.outcome is None

    def wait(self, session: FakeSession, slice_s: float, pending: Collection[Active]) -> tuple[bool, list[FakeSession]]:
        """A tick; a blocked statement's wait costs the slice (a step timeout is wall-clock time)."""
        self.waits += 1
        desk = session.desk
        desk.tick()
        if not session.done and session.statement is not None and desk.blockers(session.statement):
            time.sleep(slice_s)
        others = [s for s in self.sessions.values() if s is not session and s.done]
        return session.done, others

    def next_slice(self, slice_s: float) -> float:
        return min(slice_s * 2, 0.001)

    def answered(self, sessions: Iterable[FakeSession]) -> list[FakeSession]:
        return [s for s in sessions if s.done]


class FakeInspector:
    """The observer's answers, read from the desk: who is blocked, by whom."""

    observer: psycopg.Connection[Any]  # never read: footprints are not observed here

    def __init__(self, sessions: Mapping[str, FakeSession]) -> None:
        self.by_name = sessions
        self.sessions = {s.pid: name for name, s in sessions.items()}
        self.probes = 0  # how often the scheduler asked "blocked?"

    def _statement(self, pid: int) -> Statement | None:
        return self.by_name[self.sessions[pid]].statement

    def name_of(self, pid: int) -> str:
        return self.sessions.get(pid, f"pid {pid}")

    def states(self, pids: list[int]) -> dict[int, str]:
        out = {}
        for pid in pids:
            statement = self._statement(pid)
            out[pid] = "active" if statement is not None and statement.outcome is None else "idle in transaction"
        return out

    def is_blocked(self, pid: int) -> bool:
        self.probes += 1
        statement = self._statement(pid)
        return statement is not None and bool(self.by_name[self.sessions[pid]].desk.blockers(statement))

    def describe_waits(self, pid: int) -> tuple[Wait, ...]:
        statement = self._statement(pid)
        if statement is None:
            return ()
        blockers = self.by_name[self.sessions[pid]].desk.blockers(statement)
        if not blockers:
            return ()
        return (Wait("advisory", blockers, mode=statement.verb, holder=blockers[0], lock_type=statement.arg),)

    def blocking_graph(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        graph = []
        for pid, name in self.sessions.items():
            statement = self._statement(pid)
            if statement is not None and (on := self.by_name[name].desk.blockers(statement)):
                graph.append((name, on))
        return tuple(graph)

    def deadlock_cycle(self, detail: str) -> tuple[str, ...]:
        return ()

    def row_locks(self) -> LockSnapshot:
        return LockSnapshot(None, ())

    def other_locks(self) -> tuple[HeldLock, ...]:
        return ()


def scenario(*steps: str, name: str = "scripted") -> Scenario:
    """A scenario of steps written ``session.step: statement`` (``alice.a1: lock r``), sessions in order met."""
    parsed = []
    for text in steps:
        where, _, statement = text.partition(": ")
        session, _, step = where.partition(".")
        parsed.append(Step(step, session, statement))
    sessions = tuple(Session(n) for n in dict.fromkeys(s.session for s in parsed))
    return Scenario(name, name, f"{name}.toml", sessions=sessions, steps=tuple(parsed))


class Bench:
    """One scenario's scripted sessions on a scheduler, and its run's events read as lines."""

    def __init__(
        self,
        scenario: Scenario,
        step_timeout: float = 10.0,
        defer_busy_sessions: bool = False,
        transport: Callable[[FakeWaiting], Transport] = Plain,
    ) -> None:
        """``transport``: what the scheduler is given around the scripted sessions' waiting strategy."""
        self.scenario = scenario
        self.desk = Desk()
        self.sessions = {s.name: FakeSession(s.name, 1000 + i, self.desk) for i, s in enumerate(scenario.sessions)}
        self.inspector = FakeInspector(self.sessions)
        self.run = Run(scenario, "fake", "scripted sessions", False)
        options = RunOptions(step_timeout=step_timeout, track_row_locks=False, defer_busy_sessions=defer_busy_sessions)
        self.book = StepBook(Recorder(self.run, None), self.inspector, step_timeout)
        self.waiting = FakeWaiting(self.sessions)
        self.transport = transport(self.waiting)
        self.scheduler = Scheduler(
            scenario, self.run, options, self.sessions, self.inspector, self.book, self.transport
        )

    def play(self, *order: str | PermutationStep) -> list[str]:
        """Run the steps in this order as the runner's permutation loop does, and the run's lines.

        A busy session's next step waits for its earlier one, unless the server let another
        waiter go first (then, as with ``defer_busy_sessions``, it waits aside while the
        other sessions' steps go on, and goes as soon as its session is free).
        """
        from pgrace.engine.libpq.runner import launch_ready

        scheduler = self.scheduler
        entries = tuple(PermutationStep(e) if isinstance(e, str) else e for e in order)
        scheduler.start_permutation(entries)
        deferred: list[PermutationStep] = []
        for position, entry in enumerate(entries):
            scheduler.launching(position)
            session = self.sessions[self.scenario.step(entry.step).session]
            held = any(self.scenario.step(d.step).session == session.name for d in deferred)
            if scheduler.options.defer_busy_sessions or held or (session.busy and scheduler.overtaken(session)):
                deferred.append(entry)
                launch_ready(scheduler, self.sessions, deferred)
                continue
            if session.busy:
                scheduler.wait_for_session(session)
            scheduler.launching(position + 1)
            scheduler.launch_entry(self.scenario.step(entry.step), entry)
            if deferred:
                launch_ready(scheduler, self.sessions, deferred)
        while deferred:
            session = self.sessions[self.scenario.step(deferred[0].step).session]
            oldest = scheduler.oldest_pending()
            if not session.busy and oldest is not None:
                session = self.sessions[oldest.step.session]
            scheduler.wait_for_session(session)
            launch_ready(scheduler, self.sessions, deferred)
        scheduler.finish_permutation()
        return self.lines()

    def lines(self) -> list[str]:
        return lines(self.run.events)


def after(step: str, *markers: str) -> PermutationStep:
    """A permutation entry with completion markers: ``after("b2", "a2")``, ``"*"``, ``"a1 notices 1"``."""
    parsed = []
    for marker in markers:
        name, _, notices = marker.partition(" notices ")
        parsed.append(CompletionMarker(None if name == "*" else name, int(notices) if notices else None))
    return PermutationStep(step, tuple(parsed))


def lines(events: Sequence[Event]) -> list[str]:
    """The run's step events, one short line each, as a reader of the timeline would say them."""
    names: dict[int, str] = {}
    out = []
    for event in events:
        if isinstance(event, StepLaunched):
            names[event.seq] = event.step
            out.append(f"{event.step} sent")
        elif isinstance(event, StepWaiting):
            whom = ", ".join(sorted({who for w in event.waits for who in w.blocked_by}))
            out.append(
                f"{names[event.seq]} waits"
                + (f" for {whom}" if whom else "")
                + (" (marker)" if event.by_marker else "")
            )
        elif isinstance(event, StepCancelled):
            out.append(f"{names[event.seq]} cancelled after {event.after_s:g} s")
        elif isinstance(event, ServerChose):
            out.append(f"{names[event.seq]} waits for {names[event.winner_seq]}, which the server let go first")
        elif isinstance(event, StepFinished):
            end = event.outcome.error.sqlstate if event.outcome.error is not None else "ok"
            released = ""
            if event.release is not None:
                cause = event.release
                released = (
                    f", released by {names[cause.seq]}" if cause.cause == "step" and cause.seq else f", {cause.cause}"
                )
            out.append(f"{names[event.seq]} ends {end}{released}")
    return out
