"""Run a scenario's steps in their fixed interleaving and record what happened.

One connection per session, one *control* connection for setup, teardown and final
checks (as isolationtester), and one *observer* connection that watches: the lock-wait
probe, ``pg_locks`` and ``pgrowlocks``. The order of the steps is the
:class:`~pgrace.engine.scheduler.Scheduler`'s (see ``shared/pg-isolation/ISOLATIONTESTER.md``).

A session whose connection is lost (its backend terminated) is recorded once, as
:class:`~pgrace.model.timeline.SessionLost`, and its later steps are not sent; the others go on.
Losing the observer connection ends the run (:class:`~pgrace.errors.RunAborted`). The control
connection runs as the scenario's role, so a step can end it (``pg_terminate_backend`` over
``pg_stat_activity``): it is pgrace's, holds nothing of the scenario's, and is opened again.

The runner records events into a :class:`~pgrace.model.timeline.Run` and never prints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import pq

from pgrace import scratch
from pgrace.engine.connections import RunConnections
from pgrace.engine.control import CONTROL, ControlLink, ControlLost, ControlSql, setup_failed
from pgrace.engine.libpq.own_steps import OwnSteps
from pgrace.engine.libpq.session import LibpqSession
from pgrace.engine.libpq.transport import LibpqTransport
from pgrace.engine.options import RunOptions
from pgrace.engine.retries import attempted
from pgrace.engine.scheduler import Scheduler, uses_facts
from pgrace.engine.sqlerrors import first_line
from pgrace.engine.steps import Recorder, StepBook
from pgrace.errors import RunAborted, ScenarioFailed
from pgrace.model import variables
from pgrace.model.orders import Permutations
from pgrace.model.scenario import PermutationStep, Scenario
from pgrace.model.timeline import CheckQueried, Outcome, PermutationStarted, Run, SetupRan
from pgrace.model.variables import substitute

if TYPE_CHECKING:
    from pgrace.engine.session import LiveSession

# The pg_regress environment that upstream isolation specs assume.
SPEC_SESSION_OPTIONS = "-c intervalstyle=postgres_verbose -c datestyle=Postgres,MDY -c timezone=America/Los_Angeles"


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
    """A scenario's connections and permutations. Use as a context manager so every connection is closed."""

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
        if scenario.isolationtester:  # a spec runs as isolationtester would, whoever asked
            options = dataclasses.replace(options, isolationtester=True)
        self.options = options
        self.recorder = Recorder(run, options.on_event)
        self.stack = ExitStack()
        self.sessions: dict[str, LibpqSession] = {}
        self.params = variables.param_values(scenario)

    # -- connections ------------------------------------------------------------------

    def __enter__(self) -> Runner:
        self.stack.__enter__()
        prefix = f"{self.scenario.application_name_prefix}/{self.scenario.name}"
        self.connections = self.stack.enter_context(
            RunConnections(
                self._open,
                f"{prefix}/control connection",
                f"pgrace/{self.scenario.name}/observer",
                {session.name: f"{prefix}/{session.name}" for session in self.scenario.sessions},
                self.schema,
            )
        )
        self.control = ControlLink(
            self.connections.control,
            lambda: self.connections.connect(f"{prefix}/control connection"),
            self.scenario.setup,
            self.scenario.source,
        )
        for name, conn in self.connections.sessions.items():
            self.sessions[name] = LibpqSession(name, conn, self.recorder)
        self.observer = self.connections.observer
        self.inspector = self.connections.inspector
        self.book = StepBook(self.recorder, self.inspector, self.options.step_timeout)
        own = OwnSteps(self.sessions, self.control.conn, self._aborted, self.recorder, self.options.step_timeout)
        transport = LibpqTransport(own, self.options.isolationtester)
        self.control.on_new = transport.use_control
        self.scheduler = Scheduler(
            self.scenario, self.run, self.options, self.sessions, self.inspector, self.book, transport
        )
        self.sql = ControlSql(self.options.step_timeout, idle=self.scheduler.idle, aborted=self._aborted)
        self.sql.stuck = self.scheduler.stuck
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.__exit__(None, None, None)

    def _open(self, application_name: str, observer: bool = False) -> psycopg.Connection[Any]:
        """A connection isolationtester would open (control or session), or the ``observer``.

        pg_regress sets PGTZ, PGDATESTYLE and intervalstyle in the environment, so they
        apply to the control connection too: setup SQL must read timestamps the way the
        sessions do (classroom-scheduling inserts its rows in setup). Where the connection
        lands (the scratch schema, in schema mode) is :func:`pgrace.scratch.connect`'s to decide.
        """
        options = SPEC_SESSION_OPTIONS if not observer and self.options.isolationtester else ""
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
            raise RunAborted(f"could not connect a session: {first_line(str(exc))}") from None
        return conn

    def _aborted(self, connection: str, detail: str) -> RunAborted:
        """Say whether the server died or only one of pgrace's own connections: one fresh connection decides."""
        try:
            with psycopg.connect(
                self.dsn, autocommit=True, connect_timeout=2, application_name=f"pgrace/{self.scenario.name}/probe"
            ):
                pass
        except psycopg.Error:
            return RunAborted.server_gone(detail)
        if connection == CONTROL:
            return ControlLost(f"{connection} was lost during the run ({detail})")
        return RunAborted(f"{connection} was lost during the run ({detail})")

    def _reconnect(self, session: LibpqSession) -> None:
        """A session lost in an earlier permutation gets a new connection (and pid) for the next one."""
        prefix = f"{self.scenario.application_name_prefix}/{self.scenario.name}"
        session.attach(self.connections.connect(f"{prefix}/{session.name}"))
        self.inspector.set_sessions({s.pid: s.name for s in self.sessions.values()})

    # -- the schedule ------------------------------------------------------------------

    def run_all(self) -> None:
        try:
            schedule = Permutations(self.scenario)
            for index, permutation in enumerate(schedule):
                self._run_permutation(index, permutation, last=index == schedule.size - 1)
        except psycopg.OperationalError as exc:  # the observer's queries raise; sessions' errors are data
            raise self._aborted("pgrace's observer connection", first_line(str(exc))) from None

    def run_one(self, index: int, permutation: tuple[PermutationStep, ...]) -> None:
        """Run one permutation on these connections (explore's reduction picks each after the last)."""
        try:
            self._run_permutation(index, permutation, last=False)
        except psycopg.OperationalError as exc:  # the observer's queries raise; sessions' errors are data
            raise self._aborted("pgrace's observer connection", first_line(str(exc))) from None

    def _run_permutation(self, index: int, permutation: tuple[PermutationStep, ...], last: bool) -> None:
        scheduler = self.scheduler
        self.recorder.add(PermutationStarted(index, tuple(p.step for p in permutation), self.recorder.now()))
        scheduler.start_permutation(permutation)
        self.book.new_permutation()
        for session in self.sessions.values():
            session.attempts = {}
            if session.lost is not None:  # every permutation starts with all sessions connected
                self._reconnect(session)
        for setup in self.scenario.setup:
            self._exec_setup(None, self._with_params(setup), None)
        for declared in self.scenario.sessions:
            if declared.setup is not None:
                self._exec_setup(self.sessions[declared.name].pgconn, self._with_params(declared.setup), declared.name)
        deferred: list[PermutationStep] = []
        for position, entry in enumerate(permutation):
            scheduler.launching(position)
            step = self.scenario.step(entry.step)
            session = self.sessions[step.session]
            # A loop's next attempt, while the attempt before still waits for a lock: whether it
            # is needed is not known yet, and the other sessions' later steps (which may release
            # that lock, or close a deadlock) go on meanwhile, as they would without the loop.
            undecided = step.attempt > 1 and session.busy
            held = any(self.scenario.step(d.step).session == step.session for d in deferred)
            if self.options.defer_busy_sessions or undecided or held:
                deferred.append(entry)
                launch_ready(self.scheduler, self.sessions, deferred)
                continue
            if session.busy and scheduler.overtaken(session):  # the server chose another waiter: the others go on
                deferred.append(entry)
                launch_ready(self.scheduler, self.sessions, deferred)
                continue
            if session.busy:
                scheduler.wait_for_session(session)
            scheduler.launching(position + 1)
            if attempted(step, session):
                scheduler.launch_entry(step, entry)
            if deferred:
                launch_ready(self.scheduler, self.sessions, deferred)
        while deferred:  # only held steps are left: wait for a blocked session, as without deferral
            session = self.sessions[self.scenario.step(deferred[0].step).session]
            oldest = scheduler.oldest_pending()
            if not session.busy and oldest is not None:  # held for a capture that a blocked step will make
                session = self.sessions[oldest.step.session]
            scheduler.wait_for_session(session)
            launch_ready(self.scheduler, self.sessions, deferred)
        scheduler.finish_permutation()
        if self.options.checks_each_permutation or last:
            self._run_checks()
        if self.options.reset_sessions and all(d.teardown is None for d in self.scenario.sessions):
            self._reset_sessions()
            return
        for declared in self.scenario.sessions:
            session = self.sessions[declared.name]
            if declared.teardown is not None and session.lost is None:
                self._exec_teardown(session.pgconn, self._with_params(declared.teardown), declared.name)
            if self.options.reset_sessions and session.lost is None:
                for text in self._reset_sql(session):
                    self._exec_teardown(session.pgconn, text, session.name)
        for teardown in self.scenario.teardown:
            self._exec_teardown(None, self._with_params(teardown), None)

    def _reset_sql(self, session: LibpqSession) -> tuple[str, ...]:
        """Leave nothing of one permutation to the next: an open transaction, advisory locks, settings.

        ``DISCARD ALL`` keeps what the connection was opened with (its application_name and
        options), as a fresh connection would have them.
        """
        if session.pgconn.transaction_status != pq.TransactionStatus.IDLE:
            return ("ROLLBACK", "DISCARD ALL")
        return ("DISCARD ALL",)

    def _reset_sessions(self) -> None:
        """Every session's reset and the scenario's first teardown, on all connections at once.

        The same statements and events as one after the other: the open transactions are
        rolled back first (the teardown must not wait on their locks), then every session's
        ``DISCARD ALL`` goes with the teardown. A round trip each instead of one per statement.
        """
        pending = {s.name: list(self._reset_sql(s)) for s in self.sessions.values() if s.lost is None}
        done: dict[str, list[Outcome]] = {name: [] for name in pending}
        teardowns = [self._with_params(t) for t in self.scenario.teardown]
        control: list[Outcome] = []
        while any(pending.values()):
            batch = [(name, texts.pop(0)) for name, texts in pending.items() if texts]
            jobs = [(self.sessions[name].pgconn, text, self._where(name)) for name, text in batch]
            last = not any(pending.values())
            if last and teardowns:  # the sessions hold no locks now: the teardown goes along
                jobs.append((self.control.live().pgconn, teardowns[0], self._where(None)))
            outcomes = self.sql.execute_all(jobs)
            for (name, _), outcome in zip(batch, outcomes, strict=False):
                done[name].append(outcome)
            control.extend(outcomes[len(batch) :])
        for name, outcomes in done.items():
            for outcome in outcomes:
                self.recorder.add(SetupRan("teardown", name, outcome, self.recorder.now()))
        for outcome in control:
            self.recorder.add(SetupRan("teardown", None, outcome, self.recorder.now()))
        for teardown in teardowns[len(control) :]:
            self._exec_teardown(None, teardown, None)

    # -- setup, teardown, checks --------------------------------------------------------

    def _with_params(self, text: str) -> str:
        """A pgrace file's setup or teardown with its parameters filled in (a spec has none).

        Done by the callers, not by the executor: checks arrive already substituted with captured
        values too, and pgrace's own ROLLBACK and DISCARD ALL need no scan.
        """
        return text if self.options.isolationtester else substitute(text, self.params)

    def _where(self, session: str | None) -> str:
        """The control connection (``session`` None) or a session's setup losing its connection ends the run."""
        return f"session {session}'s connection" if session else CONTROL

    def _execute(self, pgconn: pq.abc.PGconn | None, text: str, session: str | None) -> Outcome:
        """``text`` on a session's connection, or on the control connection (``pgconn`` None)."""
        if pgconn is None:
            return self.control.call(lambda control: self.sql.execute(control, text, CONTROL))
        return self.sql.execute(pgconn, text, self._where(session))

    def _exec_setup(self, pgconn: pq.abc.PGconn | None, text: str, session: str | None) -> None:
        outcome = self._execute(pgconn, text, session)
        self.recorder.add(SetupRan("setup", session, outcome, self.recorder.now()))
        if outcome.error is not None:  # the run so far goes with the error: isolationtester prints it
            where = f"setup of session {session}" if session else "setup"
            raise setup_failed(where, outcome, self.scenario.source, self.scenario.setup_line)

    def _exec_teardown(self, pgconn: pq.abc.PGconn | None, text: str, session: str | None) -> None:
        outcome = self._execute(pgconn, text, session)
        self.recorder.add(SetupRan("teardown", session, outcome, self.recorder.now()))

    def _run_checks(self) -> None:
        for index, check in enumerate(self.scenario.checks):
            text = shown = substitute(check.sql, self.scheduler.values(None), self.control.live())
            outcome = self._execute(None, text, None)
            if uses_facts(check.sql):
                shown = substitute(check.sql, self.scheduler.values(None, facts=False), self.control.conn)
            self.recorder.add(CheckQueried(index, outcome, self.recorder.now(), shown))


def launch_ready(scheduler: Scheduler, sessions: Mapping[str, LiveSession], deferred: list[PermutationStep]) -> None:
    """Launch, in order, every deferred step whose session is free (``defer_busy_sessions``).

    A session runs one statement at a time: a step whose session is still blocked waits
    in ``deferred`` (with the session's later steps) while other sessions' steps go
    ahead, and is launched as soon as its session is free again. A step that uses a
    variable (``:session.name``) that a held or still blocked step captures waits for it
    as well: it runs after the step that captures it, with the captured value.
    """

    def blocked_captures() -> set[str]:
        return {f"{s.name}.{variable}" for s in sessions.values() if s.active for variable, _ in s.active.step.capture}

    position = 0
    held: set[str] = set()
    held_variables = blocked_captures()  # whoever uses these waits too
    while position < len(deferred):
        step = scheduler.scenario.step(deferred[position].step)
        busy = step.session in held or sessions[step.session].busy
        if busy or (held_variables and any(use.key in held_variables for use in variables.find(step.sql))):
            held.add(step.session)
            held_variables.update(f"{step.session}.{variable}" for variable, _ in step.capture)
            position += 1
            continue
        entry = deferred.pop(position)
        if not attempted(step, sessions[step.session]):
            continue  # an attempt nobody needs: its place in the interleaving stays empty
        scheduler.launch_entry(step, entry)
        position, held, held_variables = 0, set(), blocked_captures()  # that launch may have freed a session
