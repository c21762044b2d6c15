"""Run a scenario's steps in their fixed interleaving and record what happened.

One connection per session, one *control* connection for setup, teardown and final
checks (as isolationtester), and one *observer* connection that watches: the lock-wait
probe, ``pg_locks`` and ``pgrowlocks``.

Scheduling follows isolationtester (see ``shared/pg-isolation/ISOLATIONTESTER.md``):
a step is sent asynchronously; the runner then waits until it either finishes or the
server says it is blocked by another session of the scenario. It never sleeps to guess.
A blocked step stays pending while later steps run; completions are recorded right after
the step that released them, oldest launch first (when the next step's session is still
busy, that session's own step is waited for and reported first). Completion markers (``(*)``,
``(step)``, ``(step notices N)``) hold back the report of a finished step.

A session whose connection is lost (its backend terminated) is recorded once, as
:class:`~pgrace.timeline.SessionLost`, and its later steps are not sent; the others go on.
Losing the control or observer connection ends the run (:class:`~pgrace.errors.RunAborted`).

The runner records events into a :class:`~pgrace.timeline.Run` and never prints.
"""

from __future__ import annotations

import dataclasses
import os
import select
import socket
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import pq

from pgrace import scratch, variables
from pgrace.errors import RunAborted, ScenarioError, ScenarioFailed, SetupFailed, StepsStuck
from pgrace.locks import LockInspector, LockSnapshot
from pgrace.model import PermutationStep, Scenario, Step
from pgrace.releases import ReleaseTracker
from pgrace.timeline import (
    CheckQueried,
    Event,
    FootprintObserved,
    Holder,
    LockKinds,
    LocksObserved,
    NoticeReceived,
    NotifyReceived,
    Outcome,
    PermutationStarted,
    Release,
    ResultSet,
    Run,
    SessionLost,
    SetupRan,
    SqlError,
    StepCancelled,
    StepFinished,
    StepLaunched,
    StepWaiting,
)
from pgrace.variables import Value, param_values, substitute

# isolationtester's wait loop: select() on the step's socket for this long, then probe.
ISOLATIONTESTER_SLICE_S = 0.01

# The pg_regress environment that upstream isolation specs assume.
SPEC_SESSION_OPTIONS = "-c intervalstyle=postgres_verbose -c datestyle=Postgres,MDY -c timezone=America/Los_Angeles"


@dataclass(frozen=True)
class RunOptions:
    """How to run. ``before_step`` lets a presenter pace the run (it may block)."""

    step_timeout: float = 10.0
    track_row_locks: bool = True  # False: observe no locks at all (isolationtester output shows none)
    lock_kinds: LockKinds = "rows"  # what the locks column shows; every kind is recorded
    before_step: Callable[[Step], None] | None = None
    on_event: Callable[[Event], None] | None = None
    on_idle: Callable[[], None] | None = None  # called at most every 100 ms while the runner waits
    # For `pgrace explore`, where a permutation is one interleaving among many:
    checks_each_permutation: bool = False  # final checks after every permutation, before its teardown
    defer_busy_sessions: bool = False  # a step whose session is still blocked waits while others go ahead
    reset_sessions: bool = False  # after each permutation: roll back, DISCARD ALL (advisory locks, SETs, temps)
    describe_waits: bool = True  # False: record that a step waited, not on what (explore only classifies)
    footprints: bool = False  # record what every session holds after each step (explore's reduction)


@dataclass
class Active:
    """A launched step whose completion has not been reported yet."""

    seq: int
    step: Step
    entry: PermutationStep
    sent: float
    waiting_reported: bool = False
    cancelled: bool = False
    notice_targets: dict[str, int] = field(default_factory=dict)
    outcome: Outcome | None = None
    lost: SessionLost | None = None  # the session's connection was found gone during this step
    tx_before: pq.TransactionStatus = pq.TransactionStatus.IDLE  # the session's transaction when it was sent
    seen_after: int = 0  # the step last done when its wait was last read


class SessionConnection:
    """One scenario session: a raw libpq connection driven asynchronously."""

    def __init__(self, name: str, conn: psycopg.Connection[Any], recorder: Recorder) -> None:
        self.name = name
        self.notices = 0
        self.active: Active | None = None
        self.last_seq = 0  # its latest step, the one a loss found while idle is told with
        self.variables: dict[str, Value] = {}  # what its steps captured, by variable name
        self._recorder = recorder
        self.attach(conn)

    def attach(self, conn: psycopg.Connection[Any]) -> None:
        """Use ``conn`` from now on (a new session, or a lost one reconnected)."""
        self.conn = conn
        self.pgconn = conn.pgconn
        self.pid = self.pgconn.backend_pid
        self.pgconn.notice_handler = self._on_notice
        self.lost: SessionLost | None = None
        self.ended: SessionLost | None = None  # the server ended it while idle: told then, found by its next step
        self.fatal: SqlError | None = None  # why the server said it would close the connection

    def _on_notice(self, res: pq.abc.PGresult) -> None:
        severity = _field(res, pq.DiagnosticField.SEVERITY_NONLOCALIZED) or "NOTICE"
        if severity in ("FATAL", "PANIC") or _field(res, pq.DiagnosticField.SQLSTATE).startswith("57"):
            # libpq hands an error that arrives while the connection is idle to the
            # notice processor: the server telling us why it is about to hang up.
            self.fatal = self.fatal or sql_error(res)
            if severity in ("FATAL", "PANIC"):
                return  # reported with the loss of the connection, not as a notice
        self.notices += 1
        self._recorder.add(
            NoticeReceived(
                self.name,
                severity,
                _field(res, pq.DiagnosticField.MESSAGE_PRIMARY),
                _field(res, pq.DiagnosticField.SQLSTATE),
                self._recorder.now(),
            )
        )

    @property
    def busy(self) -> bool:
        return self.active is not None


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


def run_scenario(
    scenario: Scenario,
    dsn: str,
    *,
    server_version: str = "",
    server_label: str = "",
    row_locks_available: bool = True,
    options: RunOptions | None = None,
    schema: str | None = None,
    observer_dsn: str | None = None,
) -> Run:
    """Run every permutation of ``scenario`` in the database at ``dsn``; return the record.

    ``observer_dsn``: where pgrace's observer connects instead of ``dsn`` (the superuser, when
    the scenario runs as a role of its own: see :class:`pgrace.scratch.ScratchDatabase`).
    """
    options = options or RunOptions()
    run = Run(
        scenario,
        server_version,
        server_label,
        row_locks_available and options.track_row_locks,
        lock_kinds=options.lock_kinds,
    )
    try:
        with Runner(scenario, dsn, run, options, schema, observer_dsn) as runner:
            runner.run_all()
    except ScenarioFailed as failed:
        failed.run = run  # what happened up to the failure, for whoever reports it
        raise
    return run


class Runner:
    """The scheduler. Use as a context manager so every connection is closed."""

    def __init__(
        self,
        scenario: Scenario,
        dsn: str,
        run: Run,
        options: RunOptions,
        schema: str | None = None,
        observer_dsn: str | None = None,
    ) -> None:
        self.schema = schema  # a scratch schema in the user's database: watch only its tables
        self.scenario = scenario
        self.dsn = dsn
        self.observer_dsn = observer_dsn or dsn
        self.run = run
        self.options = options
        self.recorder = Recorder(run, options.on_event)
        self.stack = ExitStack()
        self.sessions: dict[str, SessionConnection] = {}
        self.waiting: list[Active] = []
        self.seq = 0
        self.releases = ReleaseTracker()
        self.last_done = 0  # the step reported done most recently (locks are observed after it)
        self.crashes: set[int] = set()  # the seqs of crash steps
        self.idle_at = 0.0  # when on_idle last ran
        self.permutation: tuple[PermutationStep, ...] = ()
        self.unlaunched = 0  # position in the permutation of the first step not sent yet
        self.params = param_values(scenario)

    # -- connections ------------------------------------------------------------------

    def __enter__(self) -> Runner:
        self.stack.__enter__()
        try:
            prefix = f"{self.scenario.application_name_prefix}/{self.scenario.name}"
            self.control = self._connect(f"{prefix}/control connection", tester=True)
            for session in self.scenario.sessions:
                conn = self._connect(f"{prefix}/{session.name}", tester=True)
                self.sessions[session.name] = SessionConnection(session.name, conn, self.recorder)
            self.observer = self._connect(f"pgrace/{self.scenario.name}/observer", observer=True)
            self.observer.execute("SET lock_timeout = '200ms'")
            self.observer.prepare_threshold = 0  # it asks the same catalog questions after every step: plan them once
            self.inspector = LockInspector(self.observer, {s.pid: s.name for s in self.sessions.values()}, self.schema)
        except psycopg.Error as exc:  # e.g. a connection ended by someone else while it was being set up
            self.stack.__exit__(None, None, None)
            raise RunAborted(f"could not set up pgrace's connections: {_first_line(str(exc))}") from None
        except BaseException:
            self.stack.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.__exit__(None, None, None)

    def _connect(self, application_name: str, tester: bool = False, observer: bool = False) -> psycopg.Connection[Any]:
        """``tester``: a connection isolationtester would open (control or session).

        pg_regress sets PGTZ, PGDATESTYLE and intervalstyle in the environment, so they
        apply to the control connection too: setup SQL must read timestamps the way the
        sessions do (classroom-scheduling inserts its rows in setup). Where the connection
        lands (the scratch schema, in schema mode) is :func:`pgrace.scratch.connect`'s to decide.
        """
        options = SPEC_SESSION_OPTIONS if tester and self.scenario.format == "spec" else ""
        try:
            conn: psycopg.Connection[Any] = scratch.connect(
                self.observer_dsn if observer else self.dsn,
                self.schema,
                options=options,
                observer=observer,
                application_name=application_name[:63],
                client_encoding="UTF8",
            )
        except psycopg.Error as exc:
            raise RunAborted(f"could not connect a session: {_first_line(str(exc))}") from None
        self.stack.callback(conn.close)
        return conn

    # -- the schedule ------------------------------------------------------------------

    def run_all(self) -> None:
        for index, permutation in enumerate(self.scenario.permutations):
            self.run_one(index, permutation)

    def run_one(self, index: int, permutation: tuple[PermutationStep, ...]) -> None:
        """Run one permutation on these connections (explore's reduction picks each after the last)."""
        try:
            self._run_permutation(index, permutation)
        except psycopg.OperationalError as exc:  # the observer's queries raise; sessions' errors are data
            raise self._aborted("pgrace's observer connection", _first_line(str(exc))) from None

    def _aborted(self, connection: str, detail: str) -> RunAborted:
        """Say whether the server died or only one of pgrace's own connections: one fresh connection decides."""
        try:
            with psycopg.connect(
                self.dsn, autocommit=True, connect_timeout=2, application_name=f"pgrace/{self.scenario.name}/probe"
            ):
                pass
        except psycopg.Error:
            return RunAborted(f"the server went away during the run ({detail})")
        return RunAborted(f"{connection} was lost during the run ({detail})")

    def _run_permutation(self, index: int, permutation: tuple[PermutationStep, ...]) -> None:
        self.recorder.add(PermutationStarted(index, tuple(p.step for p in permutation), self.recorder.now()))
        self.permutation = permutation
        self.unlaunched = 0
        self.releases = ReleaseTracker()  # waits and completions never cross permutations
        for session in self.sessions.values():
            if session.lost is not None:  # every permutation starts with all sessions connected
                self._reconnect(session)
        for setup in self.scenario.setup:
            self._exec_setup(self.control.pgconn, self._with_params(setup), None)
        for declared in self.scenario.sessions:
            if declared.setup is not None:
                self._exec_setup(self.sessions[declared.name].pgconn, self._with_params(declared.setup), declared.name)
        deferred: list[PermutationStep] = []
        for position, entry in enumerate(permutation):
            self.unlaunched = position
            if self.options.defer_busy_sessions:
                deferred.append(entry)
                self._launch_ready(deferred)
                continue
            step = self.scenario.step(entry.step)
            session = self.sessions[step.session]
            if session.busy:
                self._wait_for_session(session)
            self.unlaunched = position + 1
            self._launch_entry(step, entry)
        while deferred:  # only held steps are left: wait for a blocked session, as without deferral
            session = self.sessions[self.scenario.step(deferred[0].step).session]
            if not session.busy and self.waiting:  # held for a capture that a blocked step will make
                session = self.sessions[self.waiting[0].step.session]
            self._wait_for_session(session)
            self._launch_ready(deferred)
        self._finish_permutation()
        if self.options.checks_each_permutation or index == len(self.scenario.permutations) - 1:
            self._run_checks()
        for declared in self.scenario.sessions:
            session = self.sessions[declared.name]
            if declared.teardown is not None and session.lost is None:
                self._exec_teardown(session.pgconn, self._with_params(declared.teardown), declared.name)
            if self.options.reset_sessions and session.lost is None:
                self._reset_session(session)
        for teardown in self.scenario.teardown:
            self._exec_teardown(self.control.pgconn, self._with_params(teardown), None)

    def _reset_session(self, session: SessionConnection) -> None:
        """Leave nothing of one permutation to the next: an open transaction, advisory locks, settings.

        ``DISCARD ALL`` keeps what the connection was opened with (its application_name and
        options), as a fresh connection would have them.
        """
        if session.pgconn.transaction_status != pq.TransactionStatus.IDLE:
            self._exec_teardown(session.pgconn, "ROLLBACK", session.name)
        self._exec_teardown(session.pgconn, "DISCARD ALL", session.name)

    def _launch_entry(self, step: Step, entry: PermutationStep) -> None:
        if self.options.before_step is not None:
            self.options.before_step(step)
        active = self._launch(step, entry)
        done = self._try_complete(active, blocking=False)
        self._poll_waiting(blocking=False)
        if not done:
            self.waiting.append(active)
        self._observe_locks(active.seq)

    def _launch_ready(self, deferred: list[PermutationStep]) -> None:
        """Launch, in order, every deferred step whose session is free (``defer_busy_sessions``).

        A session runs one statement at a time: a step whose session is still blocked waits
        in ``deferred`` (with the session's later steps) while other sessions' steps go
        ahead, and is launched as soon as its session is free again. A step that uses a
        variable (``:session.name``) that a held or still blocked step captures waits for it
        as well: it runs after the step that captures it, with the captured value.
        """

        def blocked_captures() -> set[str]:
            return {
                f"{s.name}.{variable}"
                for s in self.sessions.values()
                if s.active
                for variable, _ in s.active.step.capture
            }

        position = 0
        held: set[str] = set()
        held_variables = blocked_captures()  # whoever uses these waits too
        while position < len(deferred):
            step = self.scenario.step(deferred[position].step)
            busy = step.session in held or self.sessions[step.session].busy
            if busy or (held_variables and any(use.key in held_variables for use in variables.find(step.sql))):
                held.add(step.session)
                held_variables.update(f"{step.session}.{variable}" for variable, _ in step.capture)
                position += 1
                continue
            self._launch_entry(step, deferred.pop(position))
            position, held, held_variables = 0, set(), blocked_captures()  # that launch may have freed a session

    def _wait_for_session(self, session: SessionConnection) -> None:
        """The next step's session still runs an earlier step: wait for it, then the others.

        As isolationtester: the earlier step is waited for in blocking mode (no probe)
        and reported first; only then are the other waiting steps polled. When one
        event frees several steps, the busy session's step thus comes before older ones.
        """
        deadline = time.perf_counter() + 2 * self.options.step_timeout
        done_before = self.last_done
        while session.active is not None:
            earlier = session.active
            if self._try_complete(earlier, blocking=True, retry=True):
                self.waiting.remove(earlier)
            elif self.waiting == [earlier]:  # held by a marker that nothing left can clear
                raise self._stuck(f"failed to complete permutation due to mutually-blocking steps: {earlier.step.name}")
            elif time.perf_counter() > deadline:  # held by a marker that nothing clears in time
                names = ", ".join(a.step.name for a in self.waiting)
                raise self._stuck(f"step {earlier.step.name} timed out; active steps are: {names}")
            if self.waiting:
                self._poll_waiting(blocking=False)
        if self.last_done != done_before:
            self._observe_locks(self.last_done)  # locks after the completions, before the next launch

    def _stuck(self, message: str) -> StepsStuck:
        """Steps that can never finish: the scenario's outcome (isolationtester exits 1), not the server's fault."""
        return StepsStuck(message, self.scenario.source)

    def _reconnect(self, session: SessionConnection) -> None:
        """A session lost in an earlier permutation gets a new connection (and pid) for the next one."""
        prefix = f"{self.scenario.application_name_prefix}/{self.scenario.name}"
        session.attach(self._connect(f"{prefix}/{session.name}", tester=True))
        self.inspector.set_sessions({s.pid: s.name for s in self.sessions.values()})

    def _launch(self, step: Step, entry: PermutationStep) -> Active:
        session = self.sessions[step.session]
        self.seq += 1
        text = shown = step.sql
        if self.scenario.format == "pgrace" and step.sleep is None and step.crash is None:
            text = substitute(step.sql, self._values(session), session.conn)
            shown = substitute(step.sql, self._values(session, facts=False), session.conn)
        active = Active(
            self.seq,
            step,
            entry,
            time.perf_counter(),
            tx_before=pq.TransactionStatus(session.pgconn.transaction_status),
        )
        for blocker in entry.blockers:
            if blocker.step is not None and blocker.notices is not None:
                other = self.sessions[self.scenario.step(blocker.step).session]
                active.notice_targets[other.name] = other.notices + blocker.notices
        self.recorder.add(StepLaunched(active.seq, step.name, step.session, shown, self.recorder.now()))
        session.active = active
        session.last_seq = active.seq
        self.releases.launched(active.seq, session.name)
        if session.lost is not None:  # sending would only fail again: say why it was not sent
            message = f"not sent: session {session.name}'s connection was lost at step {session.lost.during_seq}"
            active.outcome = Outcome(error=SqlError("08003", message, "ERROR"))
            return active
        if step.sleep is not None:
            self._sleep(step.sleep)
            active.outcome = Outcome()
            return active
        if step.crash is not None:
            self.crashes.add(active.seq)  # what it releases, the scenario's own crash did: nothing to add
            active.outcome = self._crash(session, active)
            return active
        try:
            session.pgconn.send_query(text.encode())
            while session.pgconn.flush():
                select.select([], [session.pgconn.socket], [], 0.01)
        except psycopg.OperationalError:
            active.outcome = Outcome(
                error=self._lost(session, active, None, _raw_message(session.pgconn.error_message))
            )
        return active

    def _values(self, session: SessionConnection | None, facts: bool = True) -> dict[str, Value]:
        """What ``:variables`` stand for in a step of ``session`` (None: a final check).

        Params, then the session's own captures (which win, as they always did), then
        every session's captures and facts by qualified name (``:worker1.claimed_id``,
        ``:worker1.pid``). Without ``facts``, pids are left as written: the timeline shows
        ``:worker1.pid``, so its text stays the same on every run (it never shows pids).
        """
        values = dict(self.params)
        # A capture whose step has not finished (it still waits) is NULL, as a failed one.
        values.update({f"{s.session}.{name}": Value(None) for s in self.scenario.steps for name, _ in s.capture})
        if session is not None:
            values.update(session.variables)
        for other in self.sessions.values():
            values.update({f"{other.name}.{name}": value for name, value in other.variables.items()})
            if facts:
                values[f"{other.name}.pid"] = Value(other.pid)
        return values

    def _sleep(self, seconds: float) -> None:
        """A deliberate pause: the schedule stands still while the other sessions are still watched.

        This is what lets ``lock_timeout``, ``statement_timeout``, the deadlock detector and
        ``idle_in_transaction_session_timeout`` fire at a chosen point. A waiting step that
        ends meanwhile is reported as it ends (its time, who released it, the locks then),
        and a session the server ends meanwhile is noted lost then, with the server's reason.
        """
        deadline = time.perf_counter() + seconds
        while (left := deadline - time.perf_counter()) > 0:
            watched = _sockets(s for s in self.sessions.values() if s.lost is None and s.ended is None)
            if not watched:
                time.sleep(min(left, 0.1))  # nothing to watch: only the clock
                self._idle()
                continue
            readable, _, _ = select.select(list(watched), [], [], min(left, 0.1))
            for fd in readable:
                session = watched[fd]
                active = session.active
                if active is not None and active in self.waiting and active.outcome is None:
                    self._consume(session.pgconn)
                    if not session.pgconn.is_busy():
                        self._settle_outcome(session, active)
                        if not self._held_by_marker(active):
                            self.waiting.remove(active)
                            self._report_done(session, active)
                            self._observe_locks(active.seq)
                else:
                    self._found_ended_idle(session)
            self._idle()

    def _look_for_ended_idle(self) -> None:
        """After each step: has the server ended a session that runs nothing (a readable idle socket)?"""
        idle = _sockets(s for s in self.sessions.values() if s.active is None and s.lost is None and s.ended is None)
        if idle:
            readable, _, _ = select.select(list(idle), [], [], 0)
            for fd in readable:
                self._found_ended_idle(idle[fd])

    def _found_ended_idle(self, session: SessionConnection) -> None:
        """A session with no statement running whose connection the server ended: noted now, with its reason.

        ``idle_in_transaction_session_timeout`` or a terminate from outside the scenario: the
        server says why (25P03, 57P01) before it hangs up, and libpq hands that to the notice
        handler. Its locks are gone with it, so what it held must not be shown as held after.
        """
        if session.lost is not None or session.ended is not None:
            return
        self._consume(session.pgconn)
        session.pgconn.is_busy()  # hands an idle connection's error to the notice handler
        if session.pgconn.status != pq.ConnStatus.BAD and session.fatal is None:
            return
        error = session.fatal or SqlError("08006", "connection to the server was lost", "FATAL")
        seq = session.active.seq if session.active is not None else max(self.last_done, session.last_seq)
        session.ended = SessionLost(session.name, error.message, error.sqlstate, self.recorder.now(), seq, idle=True)
        self.recorder.add(session.ended)  # when it was found, before what it released

    def _crash(self, session: SessionConnection, active: Active) -> Outcome:
        """Kill the session as a dying worker process would, and see it lost at once.

        ``terminate``: the control connection calls ``pg_terminate_backend`` and waits until
        the backend is gone (its transaction rolled back, its locks released).
        ``disconnect``: the client's socket is shut down under libpq, as the kernel does
        when a process dies: no goodbye message; the server sees EOF, possibly inside a
        transaction. pgrace waits until the backend has left ``pg_stat_activity``.
        """
        pid = session.pid
        wait_ms = max(1, int(self.options.step_timeout * 1000))
        try:
            if active.step.crash == "terminate":
                row = self.control.execute("SELECT pg_terminate_backend(%s, %s)", (pid, wait_ms)).fetchone()
                gone = row is not None and row[0] is True
            else:
                with socket.socket(fileno=os.dup(session.pgconn.socket)) as wire:
                    wire.shutdown(socket.SHUT_RDWR)
                gone = self._backend_gone(pid, self.options.step_timeout)
        except psycopg.OperationalError as exc:
            raise self._aborted("pgrace's control connection", _first_line(str(exc))) from None
        except psycopg.Error as exc:  # e.g. 42501: not allowed to signal that backend
            return Outcome(error=SqlError(exc.sqlstate or "XX000", _first_line(str(exc)), "ERROR"))
        if not gone:
            raise RunAborted(
                f"step {active.step.name}: session {session.name}'s backend did not end"
                f" within {self.options.step_timeout:g} s of its crash"
            )
        self._consume(session.pgconn)  # the server's last word (57P01), if it sent one: parsing it
        session.pgconn.is_busy()  # hands an idle connection's error to the notice handler
        libpq = "connection closed by pgrace (crash)" if active.step.crash == "disconnect" else ""
        self._lost(session, active, None, libpq)
        return Outcome()

    def _backend_gone(self, pid: int, timeout: float) -> bool:
        """Wait (bounded) until a backend has exited: its locks are released before it leaves pg_stat_activity."""
        deadline = time.perf_counter() + timeout
        pause = 0.001
        while time.perf_counter() < deadline:
            if self.control.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() is None:
                return True
            time.sleep(pause)  # polling a condition the server offers no notification for
            pause = min(pause * 2, 0.02)
            self._idle()
        return False

    def _lost(self, session: SessionConnection, active: Active, received: SqlError | None, libpq: str) -> SqlError:
        """The session's connection is gone: why (the server's FATAL, else libpq's words), noted once.

        Never XX000: a lost connection is 08006 unless the server said more. libpq's own
        words (``libpq``, whole) are kept after the server's: isolationtester prints both.
        """
        if received is not None and received.severity in ("FATAL", "PANIC"):
            error = dataclasses.replace(received, libpq=libpq)
        elif session.fatal is not None:
            error = dataclasses.replace(session.fatal, severity="FATAL", libpq=libpq)
        else:
            said = _first_line(libpq) or "connection to the server was lost"
            error = SqlError("08006", said, "FATAL", text=libpq, libpq=libpq)
        if session.lost is None and session.ended is not None:  # told already, when the server ended it
            session.lost = session.ended
        elif session.lost is None:
            session.lost = SessionLost(session.name, error.message, error.sqlstate, self.recorder.now(), active.seq)
            active.lost = session.lost
        return error

    def _poll_waiting(self, blocking: bool) -> None:
        """Try every waiting step in launch order; repeat while markers may have cleared."""
        while True:
            progressed = False
            notices_before = self._notice_count()
            for active in list(self.waiting):
                if self._try_complete(active, blocking=blocking, retry=True):
                    self.waiting.remove(active)
                    progressed = True
            has_markers = any(a.entry.blockers for a in self.waiting)
            if not (has_markers and (progressed or self._notice_count() != notices_before)):
                return

    def _finish_permutation(self) -> None:
        """Wait for every pending step; finished steps held by markers must get free."""
        while self.waiting:
            pending = len(self.waiting)
            self._poll_waiting(blocking=True)
            if len(self.waiting) == pending:
                names = ", ".join(a.step.name for a in self.waiting)
                raise self._stuck(f"failed to complete permutation due to mutually-blocking steps: {names}")
            self._observe_locks(self.last_done)  # a resolution (commit, deadlock, timeout) changes who holds what

    def _idle(self) -> None:
        """Let a presenter redraw (a growing wait time) while we wait: at most every 100 ms."""
        if self.options.on_idle is not None and time.perf_counter() - self.idle_at >= 0.1:
            self.idle_at = time.perf_counter()
            self.options.on_idle()

    def _notice_count(self) -> int:
        return sum(s.notices for s in self.sessions.values())

    def _try_complete(self, active: Active, blocking: bool, retry: bool = False) -> bool:
        """isolationtester's try_complete_step: True when the step has been reported done."""
        session = self.sessions[active.step.session]
        pgconn = session.pgconn
        if not retry and any(b.step is None for b in active.entry.blockers):
            self._report_waiting(active, by_marker=True)
            return False
        # A spec waits as isolationtester does, in 10 ms slices before each probe: which of
        # several steps freed by one server event is reported first depends on it (while
        # it polls each waiting step for 10 ms, a deadlock may be detected). pgrace's own
        # scenarios start at 0.1 ms, to see a wait as soon as it starts.
        spec_slice = ISOLATIONTESTER_SLICE_S if self.scenario.format == "spec" else None
        slice_s = spec_slice or 0.0001
        called = time.perf_counter()
        while active.outcome is None and pgconn.is_busy():
            readable, _, _ = select.select([pgconn.socket], [], [], slice_s)
            slice_s = spec_slice or min(slice_s * 2, 0.001)
            self._idle()
            if readable:
                self._consume(pgconn)
                continue
            if self._timed_out(active, called):
                continue
            if not blocking and self.inspector.is_blocked(session.pid):
                self._consume(pgconn)
                if pgconn.is_busy():
                    if not active.waiting_reported:
                        self._report_waiting(active, by_marker=False)
                    elif self.last_done != active.seen_after:
                        self._still_waiting(active)
                    return False
        if active.outcome is None:
            self._settle_outcome(session, active)
        if self._held_by_marker(active):
            if not active.waiting_reported:
                self._report_waiting(active, by_marker=True)
            return False
        self._report_done(session, active)
        return True

    def _consume(self, pgconn: pq.abc.PGconn) -> None:
        with suppress(psycopg.OperationalError):  # collecting the result reports a broken connection
            pgconn.consume_input()

    def _timed_out(self, active: Active, called: float) -> bool:
        """Cancel a step that waited longer than the step timeout (once), recording why.

        As isolationtester, the wait is counted from the start of this attempt to
        complete the step, not from its launch: a step seen blocked returns at once
        from non-blocking polls, so it is only cancelled when the runner itself has
        to wait for it that long (a blocking wait, or a slow step that is not blocked).
        """
        elapsed = time.perf_counter() - called
        if active.cancelled or elapsed < self.options.step_timeout:
            if active.cancelled and elapsed > 3 * self.options.step_timeout:
                raise self._stuck(f"step {active.step.name} did not finish even after it was cancelled")
            return False
        graph = self.inspector.blocking_graph()
        holders = self._holders(graph)
        active.cancelled = True
        self.recorder.add(StepCancelled(active.seq, self.options.step_timeout, graph, self.recorder.now(), holders))
        with suppress(psycopg.OperationalError):  # the session may have died meanwhile: nothing to cancel
            self.sessions[active.step.session].pgconn.get_cancel().cancel()
        return True

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

    def _held_by_marker(self, active: Active) -> bool:
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
        if not self.options.describe_waits or self.scenario.format != "pgrace":
            return
        waits = self.inspector.describe_waits(self.sessions[active.step.session].pid)
        self.releases.also_waiting(active.seq, waits)

    def _report_waiting(self, active: Active, by_marker: bool) -> None:
        detected = self.recorder.now()  # before describing: the latency is detection's alone
        active.waiting_reported = True
        active.seen_after = self.last_done
        session = self.sessions[active.step.session]
        waits = () if by_marker or not self.options.describe_waits else self.inspector.describe_waits(session.pid)
        markers = (self.scenario.step(b.step).session for b in active.entry.blockers if b.step is not None)
        self.releases.waiting(active.seq, waits, markers)
        self.recorder.add(StepWaiting(active.seq, waits, detected, by_marker=by_marker))

    def _settle_outcome(self, session: SessionConnection, active: Active) -> None:
        """Collect a finished step's results (not yet its report) and note whether it ended its transaction."""
        active.outcome = self._collect(session, active)
        self._capture(session, active)
        self._note_completion(session, active)

    def _note_completion(self, session: SessionConnection, active: Active) -> None:
        """Tell the release tracker the step is over (once): did it end its transaction, or its session?"""
        assert active.outcome is not None
        lost = active.lost is not None or session.pgconn.status == pq.ConnStatus.BAD
        after = pq.TransactionStatus(pq.TransactionStatus.UNKNOWN if lost else session.pgconn.transaction_status)
        self.releases.completed(active.seq, active.tx_before, after, active.outcome.error, lost)

    def _settle_finished(self, names: Iterable[str]) -> None:
        """Collect the results that already arrived for these sessions' running steps (a deadlock victim's)."""
        for name in names:
            session = self.sessions.get(name)
            active = session.active if session is not None else None
            if session is None or active is None or active.outcome is not None or session.lost is not None:
                continue
            self._consume(session.pgconn)
            if not session.pgconn.is_busy():
                self._settle_outcome(session, active)

    def _gone(self, names: Iterable[str]) -> set[str]:
        """Sessions whose backend no longer exists (terminated, crashed)."""
        known = [self.sessions[name] for name in names if name in self.sessions]
        alive = self.inspector.states([s.pid for s in known if s.lost is None])
        return {s.name for s in known if s.lost is not None or s.pid not in alive}

    def _release(self, active: Active) -> Release | None:
        """What ended the step's wait (None when it never waited)."""
        if not active.waiting_reported:
            return None
        assert active.outcome is not None
        release = self.releases.attribute(
            active.seq,
            active.outcome.error,
            cancelled_by_pgrace=active.cancelled,
            lost=active.lost is not None,
            settle=self._settle_finished,
            gone=self._gone,
        )
        holder = self.sessions.get(release.session or "") if release.cause == "terminated" else None
        if holder is not None and holder is not self.sessions[active.step.session] and release.seq not in self.crashes:
            self._found_ended_idle(holder)  # no step of the scenario did it: the server says what did
            if (why := holder.lost or holder.ended) is not None:
                release = dataclasses.replace(release, reason=f"{why.sqlstate}: {why.message}")
        return release

    def _report_done(self, session: SessionConnection, active: Active) -> None:
        assert active.outcome is not None
        self._note_completion(session, active)  # outcomes set at launch (a crash, a sleep) are noted here
        self.recorder.add(
            StepFinished(
                active.seq,
                active.outcome,
                self.recorder.now(),
                after_wait=active.waiting_reported,
                release=self._release(active),
            )
        )
        self.last_done = active.seq
        if active.lost is not None:
            self.recorder.add(active.lost)
        if self.scenario.format == "pgrace":  # a spec keeps isolationtester's view: a loss shows at the next step
            self._look_for_ended_idle()
        self._consume(session.pgconn)  # as isolationtester: read what arrived since the result
        while (notify := session.pgconn.notifies()) is not None:
            pid = notify.be_pid
            sender = self.inspector.name_of(pid) if pid in self.inspector.sessions else f"PID {pid}"
            self.recorder.add(
                NotifyReceived(
                    session.name, notify.relname.decode(), notify.extra.decode(), sender, self.recorder.now()
                )
            )
        session.active = None

    def _collect(self, session: SessionConnection, active: Active) -> Outcome:
        """Every result of the step. A lost connection ends it with the server's FATAL, if one came."""
        pgconn = session.pgconn
        results: list[ResultSet] = []
        commands: list[str] = []
        error: SqlError | None = None
        libpq = ""  # libpq's own error text, whole: it has no SQLSTATE
        while (res := pgconn.get_result()) is not None:
            status = res.status
            if status == pq.ExecStatus.TUPLES_OK:
                results.append(result_set(res))
            elif status == pq.ExecStatus.COMMAND_OK:
                commands.append((res.command_status or b"").decode())
            elif status in (pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.NONFATAL_ERROR):
                if res.error_field(pq.DiagnosticField.SQLSTATE) is None:
                    libpq = libpq or _raw_message(res.error_message)
                    error = error or sql_error(res)
                else:
                    error = sql_error(res)
            elif status != pq.ExecStatus.EMPTY_QUERY:
                error = SqlError("0A000", f"unexpected result status: PGRES_{pq.ExecStatus(status).name}", "ERROR")
        if pgconn.status == pq.ConnStatus.BAD:
            error = self._lost(session, active, error, libpq or _raw_message(pgconn.error_message))
        elif error is not None and error.sqlstate == "40P01" and error.detail:
            error = dataclasses.replace(error, cycle=self.inspector.deadlock_cycle(error.detail))
        return Outcome(tuple(results), tuple(commands), error)

    def _capture(self, session: SessionConnection, active: Active) -> None:
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

    # -- setup, teardown, checks, locks ------------------------------------------------

    def _with_params(self, text: str) -> str:
        """A pgrace file's setup or teardown with its parameters filled in (a spec has none).

        Done by the callers, not by ``_exec``: checks arrive already substituted with captured
        values too, and pgrace's own ROLLBACK and DISCARD ALL need no scan.
        """
        return substitute(text, self.params) if self.scenario.format == "pgrace" else text

    def _exec_setup(self, pgconn: pq.abc.PGconn, text: str, session: str | None) -> None:
        outcome = self._exec(pgconn, text, session)
        self.recorder.add(SetupRan("setup", session, outcome, self.recorder.now()))
        if outcome.error is not None:  # the run so far goes with the error: isolationtester prints it
            where = f"setup of session {session}" if session else "setup"
            error = outcome.error
            cancelled = f" ({error.detail})" if error.detail and error.detail.startswith("pgrace cancelled") else ""
            raise SetupFailed(
                f"{where} failed: {error.severity}:  {error.message}{cancelled}",
                self.scenario.source,
                self.scenario.setup_line,
            )

    def _exec_teardown(self, pgconn: pq.abc.PGconn, text: str, session: str | None) -> None:
        self.recorder.add(SetupRan("teardown", session, self._exec(pgconn, text, session), self.recorder.now()))

    def _exec(self, pgconn: pq.abc.PGconn, text: str, session: str | None = None) -> Outcome:
        """PQexec semantics (only the last result of a multi-statement block is kept), bounded in time.

        The SQL is sent asynchronously and waited for with ``select``, so Ctrl-C and SIGTERM
        are answered at once, and a statement still running after the step timeout (say a
        teardown's DROP waiting on a session left inside a transaction) is cancelled, as
        a step would be; the error then says pgrace cancelled it.

        The control connection (``session`` None) or a session's setup losing its
        connection ends the run: without it there is no story to tell.
        """
        where = f"session {session}'s connection" if session else "pgrace's control connection"
        try:
            pgconn.send_query(text.encode())
            while pgconn.flush():
                select.select([], [pgconn.socket], [], 0.1)
            cancelled = self._await_idle(pgconn, text)
        except psycopg.OperationalError as exc:
            raise self._aborted(where, _first_line(str(exc))) from None
        res: pq.abc.PGresult | None = None
        while (latest := pgconn.get_result()) is not None:
            res = latest
            if latest.status in (pq.ExecStatus.COPY_IN, pq.ExecStatus.COPY_OUT, pq.ExecStatus.COPY_BOTH):
                break  # as PQexec: COPY ... STDIN/STDOUT has nobody to talk to here
        if pgconn.status == pq.ConnStatus.BAD or res is None:
            server_said = res.error_field(pq.DiagnosticField.MESSAGE_PRIMARY) if res is not None else None
            detail = server_said.decode("utf-8", "replace") if server_said else pgconn.get_error_message()
            raise self._aborted(where, _first_line(detail))
        if res.status in (pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.NONFATAL_ERROR):
            error = sql_error(res)
            if cancelled and error.sqlstate == "57014":
                why = f"pgrace cancelled it after --step-timeout {self.options.step_timeout:g} s"
                error = dataclasses.replace(
                    error,
                    detail=f"{why}; {error.detail}" if error.detail else why,
                    text=f"{error.text}DETAIL:  {why}\n",
                )
            return Outcome(error=error)
        if res.status == pq.ExecStatus.TUPLES_OK:
            return Outcome((result_set(res),))
        return Outcome(commands=((res.command_status or b"").decode(),))

    def _await_idle(self, pgconn: pq.abc.PGconn, text: str) -> bool:
        """Wait until the connection's results are all in; cancel once at the step timeout.

        Returns whether pgrace cancelled the statement. A statement that outlives its
        cancel by twice the timeout again leaves the connection unusable: that ends the run.
        """
        started = time.perf_counter()
        cancelled = False
        while pgconn.is_busy():
            readable, _, _ = select.select([pgconn.socket], [], [], 0.05)
            if readable:
                pgconn.consume_input()
                continue
            self._idle()
            elapsed = time.perf_counter() - started
            if not cancelled and elapsed >= self.options.step_timeout:
                pgconn.get_cancel().cancel()
                cancelled = True
            elif cancelled and elapsed >= 3 * self.options.step_timeout:
                raise self._stuck(f"SQL did not finish even after it was cancelled: {_first_line(text)}")
        return cancelled

    def _run_checks(self) -> None:
        for index, check in enumerate(self.scenario.checks):
            text = substitute(check.sql, self._values(None), self.control)
            outcome = self._exec(self.control.pgconn, text)
            shown = substitute(check.sql, self._values(None, facts=False), self.control)
            self.recorder.add(CheckQueried(index, outcome, self.recorder.now(), shown))

    def _observe_locks(self, seq: int) -> None:
        if self.options.footprints:
            self._observe_footprints()
        if not self.options.track_row_locks:
            return
        snapshot = self.inspector.row_locks() if self.run.row_locks_available else LockSnapshot(None, ())
        others = self.inspector.other_locks()
        self.recorder.add(LocksObserved(seq, snapshot.locks, self.recorder.now(), snapshot.skipped, others))

    def _observe_footprints(self) -> None:
        """Every lock the sessions hold, and who keeps a snapshot: what decides which steps commute."""
        live = {s.pid: s for s in self.sessions.values() if s.lost is None and s.ended is None}
        entries: dict[int, set[str]] = {pid: set() for pid in live}
        for pid, entry in self.observer.execute(FOOTPRINT_QUERY, {"pids": list(live)}).fetchall():
            entries[pid].add(entry)
        held = tuple((s.name, s.busy, frozenset(entries[pid])) for pid, s in live.items())
        self.recorder.add(FootprintObserved(self.seq, held, self.recorder.now()))


FOOTPRINT_QUERY = """
SELECT l.pid, format('%%s|%%s|%%s|%%s|%%s|%%s|%%s|%%s|%%s', l.locktype, l.database,
       CASE WHEN l.relation IS NULL THEN NULL WHEN c.oid IS NULL THEN '?'
            ELSE format('%%I.%%I', n.nspname, c.relname) END,
       l.classid, l.objid, l.objsubid, l.virtualxid, l.mode, CASE WHEN l.granted THEN 't' ELSE 'f' END)
FROM pg_locks l
LEFT JOIN pg_class c ON c.oid = l.relation
LEFT JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE l.pid = ANY(%(pids)s) AND l.locktype <> 'transactionid'
UNION ALL
SELECT pid, 'snapshot' FROM pg_stat_activity
WHERE pid = ANY(%(pids)s) AND backend_xmin IS NOT NULL AND state LIKE 'idle in transaction%%'
"""


def _sockets(sessions: Iterable[SessionConnection]) -> dict[int, SessionConnection]:
    """The sessions by their connection's socket, for select(); a lost connection has none."""
    found: dict[int, SessionConnection] = {}
    for session in sessions:
        with suppress(psycopg.OperationalError):
            found[session.pgconn.socket] = session
    return found


# -- results -----------------------------------------------------------------------------


def result_set(res: pq.abc.PGresult) -> ResultSet:
    """A tuple result as the server's exact text and its column types; values are loaded later, if compared."""
    columns = tuple((res.fname(i) or b"").decode() for i in range(res.nfields))
    text_rows = tuple(tuple(_decode(res.get_value(r, c)) for c in range(res.nfields)) for r in range(res.ntuples))
    types = tuple(res.ftype(i) for i in range(res.nfields))
    command = (res.command_status or b"").decode()
    return ResultSet(columns, text_rows, types, command)


def sql_error(res: pq.abc.PGresult) -> SqlError:
    message = _field(res, pq.DiagnosticField.MESSAGE_PRIMARY)
    if not message:  # built by libpq itself: no fields, the whole message
        message = _first_line(res.get_error_message())
    return SqlError(
        _field(res, pq.DiagnosticField.SQLSTATE) or "XX000",
        message,
        _field(res, pq.DiagnosticField.SEVERITY_NONLOCALIZED) or "ERROR",
        _field(res, pq.DiagnosticField.MESSAGE_DETAIL) or None,
        text=_raw_message(res.error_message),
    )


def _raw_message(message: bytes) -> str:
    """libpq's message exactly as PQerrorMessage gives it (psycopg's own accessors tidy it up)."""
    return message.decode("utf-8", "replace")


def _field(res: pq.abc.PGresult, code: pq.DiagnosticField) -> str:
    value = res.error_field(code)
    return value.decode("utf-8", "replace") if value is not None else ""


def _decode(value: bytes | None) -> str | None:
    return value.decode("utf-8", "replace") if value is not None else None


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else text.strip()
