"""Run ``--exec`` commands through the proxy: their connections are sessions, one statement at a time.

One scratch database, one proxy, one set of pgrace connections (control, observer) for as many
runs as asked; each run makes the file's setup, starts every command once (``DATABASE_URL`` and
the ``PG*`` variables point at the proxy), orders their statements on the one
:class:`~pgrace.engine.scheduler.Scheduler`, waits for the commands to end and their backends to
go, runs the final checks, and resets the database as a code run does. A command's non-zero
exit is an outcome on the timeline. A client backend in the run's database that did not come
through the proxy makes the run no proof: :class:`~pgrace.errors.ExecError` (exit 2).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgrace import scratch
from pgrace.engine.connections import RunConnections
from pgrace.engine.control import ControlSql, setup_failed
from pgrace.engine.options import RunOptions
from pgrace.engine.proxy.peers import proxy_sockets
from pgrace.engine.proxy.processes import Actor, start
from pgrace.engine.proxy.relay import Proxy
from pgrace.engine.proxy.session import ProxyHooks, ProxySession, relay_asleep
from pgrace.engine.proxy.tasks import AsyncSession, TaskActor
from pgrace.engine.scheduler import Scheduler
from pgrace.engine.sqlerrors import first_line
from pgrace.engine.steps import Recorder, StepBook
from pgrace.engine.threads.order import Chooser
from pgrace.engine.threads.waiting import GateWaiting
from pgrace.engine.transport import Plain
from pgrace.engine.waiting import FIRST_SLICE_S, backoff
from pgrace.errors import ExecError, ScenarioFailed, StepsStuck
from pgrace.model.scenario import Command, PermutationStep, Scenario, Session, Step, set_by_pgrace
from pgrace.model.timeline import CheckQueried, Outcome, PermutationStarted, Run, SetupRan, SqlError
from pgrace.scratch import schema_reset_sql
from pgrace.servers import ServerInfo

EXEC_SCHEMA = "pgrace_exec"


class ExecOrder:
    """One run of the commands: the chooser's order over whichever connections they open."""

    def __init__(self, runner: ExecRunner, book: StepBook, observe: bool, footprints: bool) -> None:
        self.runner = runner
        self.hooks = runner.hooks
        self.cond = runner.cond
        self.book = book
        self.step_timeout = runner.step_timeout
        self.sessions: dict[str, ProxySession] = {}  # grows as clients connect: the scheduler's own mapping
        self.steps: list[Step] = []
        self.counts: dict[str, int] = {}
        self.raised: list[str] = []  # steps that are a command's exit, no statement
        options = RunOptions(
            step_timeout=self.step_timeout, track_row_locks=observe, describe_waits=observe, footprints=footprints
        )
        self.scheduler = Scheduler(
            Scenario(runner.scenario.name, runner.scenario.title, runner.scenario.source),
            runner.run,
            options,
            self.sessions,
            runner.inspector,
            book,
            Plain(GateWaiting(self.sessions, self.cond, runner.inspector, self.step_timeout)),
            locks_each_completion=True,  # what each statement left held, as the clients go
        )

    def run(self, chooser: Chooser) -> list[tuple[str, ...]]:
        """Let the statements go under ``chooser``'s order until every command has ended."""
        met: list[tuple[str, ...]] = []
        self.settle()
        while True:
            with self.cond:
                ready = sorted(n for n, s in self.sessions.items() if s.gate.state == "ready")
            if not ready:
                if self.scheduler.oldest_pending() is not None:
                    self.scheduler.wait_for_oldest()
                    self.settle()
                    continue
                if self._all_ended():
                    self._report_exits()  # a command that ended since the last settle is an outcome too
                    return met
                self._await_news()
                continue
            met.append(tuple(ready))
            self._launch(self.sessions[chooser(ready)])
            self.settle()

    def _await_news(self) -> None:
        """Nothing is held or running, yet a command lives: it is ending, or about to connect or send.

        Waited for on the condition (a hook notifies it) and the commands' exits, up to the step timeout.
        """
        since = time.perf_counter()
        deadline = since + self.step_timeout
        slice_s = FIRST_SLICE_S
        while time.perf_counter() < deadline:
            self._adopt()
            self._report_exits()
            with self.cond:
                if any(s.gate.state == "ready" for s in self.sessions.values()) or self.hooks.fresh:
                    break
            if self._all_ended():
                break
            with self.cond:
                self.cond.wait(slice_s)
            slice_s = backoff(slice_s, time.perf_counter() - since)
        else:
            raise StepsStuck(
                f"for {self.step_timeout:g} s every command waited with no statement held or running: they wait"
                " for each other or for something besides the database",
                self.runner.scenario.source,
            )
        self.settle()

    def _all_ended(self) -> bool:
        with self.cond:
            return all(c.exit_code() is not None for c in self.hooks.commands) and all(
                s.gate.state == "done" for s in self.sessions.values()
            )

    def _step_name(self, session: str) -> str:
        self.counts[session] = self.counts.get(session, 0) + 1
        return f"{session}.{self.counts[session]}"

    def _launch(self, session: ProxySession) -> None:
        with self.cond:
            request = session.gate.request
            assert request is not None
            session.gate.steps += 1
        step = Step(self._step_name(session.name), session.name, request.sql, prepares_only=request.prepares_only)
        self.steps.append(step)
        self.scheduler.launch_entry(step, PermutationStep(step.name))

    def _adopt(self) -> None:
        """Connections opened since the last look join the scheduler's sessions (and the inspector's names)."""
        with self.cond:
            fresh, self.hooks.fresh = self.hooks.fresh, []
        if fresh:
            for session in fresh:
                self.sessions[session.name] = session
            self.runner.inspector.set_sessions({s.pid: n for n, s in self.sessions.items()})

    def settle(self) -> None:
        """Until every connection is held, blocked or closed, and every live command provably waits.

        A command still moving after the step timeout, with nothing of its held, is bad input:
        pgrace cannot tell when it would send its next statement.
        """
        slice_s = FIRST_SLICE_S
        since = time.perf_counter()
        while True:
            self._adopt()
            self._report_exits()
            if self.scheduler.oldest_pending() is not None:
                self.scheduler.poll_pending(blocking=False)
            why = self._unsettled()
            if why is None:
                self._adopt()
                if not self.hooks.fresh:
                    return
                continue
            if time.perf_counter() - since > self.step_timeout:
                raise ExecError(
                    f"{why} for more than {self.step_timeout:g} s: pgrace cannot tell when it sends its next"
                    " statement (a timer, a sleep, or work besides the database)",
                    self.runner.scenario.source,
                )
            with self.cond:
                self.cond.wait(slice_s)
            slice_s = backoff(slice_s, time.perf_counter() - since)

    def _unsettled(self) -> str | None:
        """Who may still act on their own, for people; None when nobody may.

        One reading of two sides that move apart: the commands' processes first, the proxy's side
        after, and the proxy's answers to its clients counted around both. A client that sent its
        bytes (a statement, a start-up) and then went to sleep shows them at the proxy's reading: in
        transit, being read, or a held statement. A client the proxy answered in between (its
        start-up's last bytes, a statement's result) may be running again: the count says so. Read
        the other way round, a client that connects or sends between the two looks asleep with its
        bytes unseen, and the scheduler chooses without its statement.
        """
        proxy = self.runner.proxy
        answered = proxy.answered()
        if answered is None:
            return "the proxy is answering a client"
        with self.cond:
            held = [s for s in self.sessions.values() if s.gate.state in ("ready", "running")]
        proxied: set[int] = set()
        if held:
            known = proxy.client_sockets()
            proxied = known if known is not None else proxy_sockets(self.runner.proxy_port)
        for started in self.hooks.commands:
            if started.exit_code() is not None:
                continue
            mine = any(s.owner is started for s in held)
            # A thread asleep past two step timeouts cannot wake before pgrace looks again: a step and a settle
            # each end within one.
            moving = started.moving(proxied, mine, 2 * self.step_timeout)
            if moving is not None:
                return f"{started.name} ({moving}) runs"
        between = proxy.in_between()
        if between is not None:
            return between
        with self.cond:
            states = {name: (s.gate.state, s.owner, s.relay_tid) for name, s in self.sessions.items()}
        pending = self.scheduler.pending_sessions()
        for name, (state, owner, relay_tid) in states.items():
            if state == "running" and name not in pending:
                return f"session {name}'s statement runs"
            if state == "python":
                if owner is None:
                    return f"session {name} (not opened by an --exec command) is the client's turn"
                if owner.exit_code() is not None:
                    return f"session {name}'s command ended and its connection is closing"
                if not relay_asleep(relay_tid):
                    return f"session {name}'s bytes are being read"
        if proxy.answered() != answered:
            return "the proxy answered a client meanwhile"
        return None

    def _report_exits(self) -> None:
        """A command that ended is a step of its own when its exit was not 0: an outcome, not a crash."""
        for started in self.hooks.commands:
            code = started.exit_code()
            if code is None or started.reported:
                continue
            started.reported = True
            if code == 0:
                continue
            with self.cond:
                mine = [n for n, s in self.sessions.items() if s.owner is started]
            column = mine[-1] if mine else started.name
            if column not in self.sessions and column not in self.runner.columns:
                self.runner.columns.append(column)
            last = started.last_words()
            name = self._step_name(column)
            text = f"exit {code}" if code > 0 else f"killed by signal {-code}"
            self.steps.append(Step(name, column, text))
            self.raised.append(name)
            seq = self.book.launch(name, column, text)
            error = SqlError(f"exit {code}", last or text, "ERROR", started.name)
            self.book.finished(seq, Outcome(error=error))


class ExecRunner:
    """The proxy, pgrace's connections and one scratch database; runs the commands as often as asked."""

    def __init__(
        self,
        scenario: Scenario,
        commands: Sequence[Command | AsyncSession],
        dsn: str,
        *,
        step_timeout: float,
        server: ServerInfo,
        observer_dsn: str | None = None,
        cwd: str | None = None,
    ) -> None:
        self.scenario = scenario
        self.commands = list(commands)
        self.dsn = dsn
        self.observer_dsn = observer_dsn or dsn
        self.step_timeout = step_timeout
        self.server = server
        self.cwd = cwd
        self.cond = threading.Condition()
        self.stack = contextlib.ExitStack()
        self.sql = ControlSql(step_timeout, timeout_name="the step timeout")
        self.hooks = ProxyHooks(self.cond, self._cancel, step_timeout)
        self.raised: list[str] = []
        self.columns: list[str] = []  # sessions that are a command without a connection (its exit shown there)
        self.has_row_locks = True
        self.started: list[Actor] = []
        self.counted: int | None = None  # sessions the server should have counted in the database by now

    def __enter__(self) -> ExecRunner:
        try:
            connections = self.stack.enter_context(
                RunConnections(
                    lambda name, observer: scratch.connect(
                        self.observer_dsn if observer else self.dsn,
                        None,
                        observer=observer,
                        application_name=name[:63],
                        client_encoding="UTF8",
                    ),
                    f"pgrace/{self.scenario.name}/control connection",
                    f"pgrace/{self.scenario.name}/observer",
                )
            )
            self.control, self.observer, self.inspector = (
                connections.control,
                connections.observer,
                connections.inspector,
            )
            params = conninfo_to_dict(self.dsn)
            host = str(params.get("host") or "localhost").split(",")[0]
            port = int(str(params.get("port") or 5432).split(",")[0])
            self.proxy = self.stack.enter_context(Proxy(host, port, self.hooks))
            self.proxy_port = self.proxy.port
            self.stack.callback(self._kill_all)
        except BaseException:
            self.stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.hooks.stop()
        self.stack.close()

    def _cancel(self, pid: int) -> None:
        with contextlib.suppress(psycopg.Error):
            self.control.execute("SELECT pg_catalog.pg_cancel_backend(%s)", (pid,))

    def environment(self) -> dict[str, str]:
        """The commands' environment: this one's, with every libpq variable pointing at the proxy."""
        params = conninfo_to_dict(self.dsn)
        env = {k: v for k, v in os.environ.items() if not set_by_pgrace(k)}
        user, password, database = (
            str(params.get("user") or ""),
            str(params.get("password") or ""),
            str(params["dbname"]),
        )
        env.update(
            PGHOST=self.proxy.host,
            PGPORT=str(self.proxy.port),
            PGDATABASE=database,
            PGUSER=user,
            PGPASSWORD=password,
            PGSSLMODE="disable",
            DATABASE_URL=f"postgresql://{quote(user, safe='')}:{quote(password, safe='')}@{self.proxy.host}:"
            f"{self.proxy.port}/{quote(database, safe='')}?sslmode=disable",
        )
        return env

    # -- one run -------------------------------------------------------------------------

    def run_once(self, chooser: Chooser, observe: bool, footprints: bool = False) -> tuple[Run, list[tuple[str, ...]]]:
        """Setup, the commands under ``chooser``'s order, the final checks, the reset."""
        locks = observe and self.has_row_locks
        self.run = Run(
            Scenario(self.scenario.name, self.scenario.title, ""), self.server.version, self.server.label, locks
        )
        self.recorder = Recorder(self.run, None)
        book = StepBook(self.recorder, self.inspector, self.step_timeout)
        self.recorder.add(PermutationStarted(0, (), self.recorder.now()))
        self.columns = []
        try:
            for text in self.scenario.setup:
                self._setup(text)
        except ScenarioFailed as failed:
            failed.run = self.run
            raise
        order = ExecOrder(self, book, observe, footprints)
        self.raised = order.raised
        env = self.environment()

        def checked(ready: list[str]) -> str:
            self._check_ordered(order)
            return chooser(ready)

        if self.counted is None:
            self.counted = self._first_count()
        try:
            self.started = []
            self.hooks.begin(self.started)  # the same list: a connection is matched to whoever is started so far
            for command in self.commands:
                with self.cond:  # a connection that opens meanwhile waits in the hook for its owner to be listed
                    self.started.append(self._start(command, env))
            met = order.run(checked)
        except BaseException:
            self.hooks.stop()
            self._kill_all()
            raise
        self.hooks.stop()
        self._kill_all()
        self._backends_gone(order)
        self._check_ordered(order)
        self._check_counted(len(order.sessions))
        for index, check in enumerate(self.scenario.checks):
            outcome = self.sql.execute(self.control.pgconn, check.sql)
            self.recorder.add(CheckQueried(index, outcome, self.recorder.now(), check.sql))
        self._reset()
        self.run.scenario = self._scenario(order)
        return self.run, met

    def _start(self, command: Command | AsyncSession, env: Mapping[str, str]) -> Actor:
        if isinstance(command, Command):
            return start(command, env, self.cwd)
        dsn = f"{env['DATABASE_URL']}&application_name={quote(command.name, safe='')}"  # a URL: asyncpg takes no other
        return TaskActor(command, dsn).start()

    def _kill_all(self) -> None:
        for started in self.started:
            started.stop()
        self.started = []

    def _backends_gone(self, order: ExecOrder) -> None:
        """The server's answer that the sessions' backends ended (their locks released) before the checks."""
        pids = [s.pid for s in order.sessions.values()]
        since = time.perf_counter()
        slice_s = FIRST_SLICE_S
        while pids and time.perf_counter() < since + self.step_timeout:
            left = self.observer.execute(
                "SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE pid = ANY(%s)", (pids,)
            ).fetchone()
            if not left or not left[0]:
                return
            with self.cond:
                self.cond.wait(slice_s)
            slice_s = backoff(slice_s, time.perf_counter() - since)
        if pids:
            raise StepsStuck("the commands' backends did not end after their connections closed", self.scenario.source)

    def _check_ordered(self, order: ExecOrder) -> None:
        """A client backend of the run's database that is neither pgrace's nor a proxy session's: no proof.

        A proxied connection's backend is on the server before its start-up ends and the hooks learn
        its pid (from BackendKeyData): a connection the proxy accepted a moment after the commands
        settled shows so. A backend seen then is a stranger only if it is still unknown once every
        start-up under way has ended.
        """
        own = [self.control.pgconn.backend_pid, self.observer.pgconn.backend_pid]
        rows = self.observer.execute(
            "SELECT pid, coalesce(application_name, ''), coalesce(query, '') FROM pg_catalog.pg_stat_activity"
            " WHERE datname = current_database() AND usesysid IS NOT NULL"
            " AND coalesce(backend_type, 'client backend') = 'client backend' AND pid <> ALL(%s)"
            " ORDER BY backend_start, pid",
            (own,),
        ).fetchall()
        if rows:
            self._start_ups_ended()
        with self.cond:
            known = {s.pid for s in self.hooks.sessions.values()}
        for pid, application, query in (row for row in rows if row[0] not in known):
            said = f"sending {first_line(str(query))!r}" if query else "no statement seen yet"
            raise ExecError(
                f"a connection that did not come through pgrace's proxy reached the run's database (application_name"
                f" {str(application)!r}, backend {pid}, {said}); pgrace did not order its statements: connect with"
                " DATABASE_URL or the PG* variables pgrace sets",
                self.scenario.source,
            )

    def _start_ups_ended(self) -> None:
        """Until no connection the proxy accepted is in its start-up (bounded by the step timeout)."""
        since = time.perf_counter()
        slice_s = FIRST_SLICE_S
        while self.proxy.in_between() and time.perf_counter() < since + self.step_timeout:
            with self.cond:
                self.cond.wait(slice_s)  # the hooks notify it when a start-up ends
            slice_s = backoff(slice_s, time.perf_counter() - since)

    def _first_count(self) -> int:
        """The session count before the first run, pgrace's own connections in it.

        A backend adds itself to the count when it first flushes its statistics, which it puts off for a
        second or more if another backend of the database holds the entry then: into a run, where it would
        pass for a stranger. Each of pgrace's connections forces that flush first (PostgreSQL 15 and later;
        it is done before the statement's answer).
        """
        if self.control.info.server_version >= 150000:
            for conn in (self.control, self.observer):
                with contextlib.suppress(psycopg.errors.InsufficientPrivilege):  # revoked by an administrator
                    conn.execute("SELECT pg_catalog.pg_stat_force_next_flush()")
        return self._sessions_count()

    def _sessions_count(self) -> int:
        """How many sessions the server has counted in the run's database (``pg_stat_database.sessions``)."""
        self.observer.execute("SELECT pg_catalog.pg_stat_clear_snapshot()")
        row = self.observer.execute(
            "SELECT sessions FROM pg_catalog.pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def _check_counted(self, proxied: int) -> None:
        """Every session the server counted during the run came through the proxy.

        A session is counted when its backend flushes its statistics, which may come after it left
        ``pg_stat_activity``: the count is waited for until it holds this run's sessions (the server's
        answer, bounded by the step timeout), and a late one is expected in the next run's count, never
        taken for a stranger. One that came and went between two looks at ``pg_stat_activity`` is
        counted here.
        """
        assert self.counted is not None
        self.counted += proxied
        since = time.perf_counter()
        slice_s = FIRST_SLICE_S
        while (now := self._sessions_count()) < self.counted and time.perf_counter() < since + self.step_timeout:
            with self.cond:
                self.cond.wait(slice_s)
            slice_s = backoff(slice_s, time.perf_counter() - since)
        around = now - self.counted
        if around > 0:
            self.counted = now
            raise ExecError(
                f"{around} connection{'s' if around > 1 else ''} reached the run's database around pgrace's proxy"
                " (the server counted them); pgrace did not order their statements: connect with DATABASE_URL or"
                " the PG* variables pgrace sets",
                self.scenario.source,
            )

    def _scenario(self, order: ExecOrder) -> Scenario:
        rank = {c.name: k for k, c in enumerate(self.commands)}
        opened = sorted(
            order.sessions.values(),
            key=lambda s: (rank.get(s.owner.name, len(rank)) if s.owner else len(rank), s.client.number),
        )
        names = [s.name for s in opened] + [c for c in self.columns if c not in order.sessions]
        steps = tuple(order.steps)
        return Scenario(
            self.scenario.name,
            self.scenario.title,
            self.scenario.source,
            variant=self.scenario.variant,
            setup=self.scenario.setup,
            sessions=tuple(Session(name) for name in names),
            steps=steps,
            permutations=(tuple(PermutationStep(s.name) for s in steps),),
            checks=self.scenario.checks,
        )

    def _setup(self, text: str) -> None:
        outcome = self.sql.execute(self.control.pgconn, text)
        self.recorder.add(SetupRan("setup", None, outcome, self.recorder.now()))
        if outcome.error is not None:
            raise setup_failed("setup", outcome, self.scenario.source, self.scenario.setup_line)

    def _reset(self) -> None:
        for text in self.scenario.teardown:
            outcome = self.sql.execute(self.control.pgconn, text)
            self.recorder.add(SetupRan("teardown", None, outcome, self.recorder.now()))
        self.sql.execute(self.control.pgconn, schema_reset_sql(EXEC_SCHEMA))


def commands_of(pairs: Mapping[str, str]) -> list[Command]:
    return [Command(name, line) for name, line in pairs.items()]
