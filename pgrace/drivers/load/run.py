"""Running pgbench once per client count, each on a fresh scratch database, with nothing left behind."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgrace.drivers.load.measure import (
    check_invariants,
    control_sql,
    number_in,
    percentiles_of,
    pgbench_error_line,
    read_latencies,
    sample_waits,
)
from pgrace.drivers.load.script import pgbench_script, setup_sql
from pgrace.drivers.load.waits import DEADLOCK_TIMEOUT, log_offset, read_waits
from pgrace.errors import Interrupted, OptionError, RunAborted, ScenarioError, ScenarioFailed
from pgrace.model.load import ClientRun, LoadOptions, LoadSeries, NoPgbench
from pgrace.model.scenario import Scenario
from pgrace.servers import ServerInfo, deferred_interrupts
from pgrace.servers.processes import dies_with_parent, held_temporary_dir, sweep_dead_dirs

APP_PREFIX = "pgrace-load/"


STOP_GRACE_S = 10.0
MAX_TRIES = 10  # pgbench --max-tries: a 40001/40P01 transaction is retried this many times in all


def find_pgbench(server: ServerInfo, explicit: str | None = None) -> str:
    """pgbench from the server's own installation (embedded, --server BINDIR), else from PATH."""
    candidates = [explicit] if explicit else []
    if not explicit and server.bindir:
        candidates.append(os.path.join(server.bindir, "pgbench"))
    if not explicit:
        found = shutil.which("pgbench")
        if found:
            candidates.append(found)
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK) and os.path.isfile(candidate):
            return candidate
    where = explicit or (f"{server.bindir} or PATH" if server.bindir else "PATH")
    raise NoPgbench(f"no pgbench found in {where}; install PostgreSQL's client tools or name the pgbench to run")


def pgbench_major(pgbench: str) -> int:
    try:
        out = subprocess.run([pgbench, "--version"], capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise NoPgbench(f"cannot run {pgbench} --version: {exc}") from exc
    match = re.search(r"(\d+)", out)
    return int(match.group(1)) if match else 0


# -- running ---------------------------------------------------------------------------------


def run_load(scenario: Scenario, server: ServerInfo, options: LoadOptions) -> LoadSeries:
    """Run ``scenario``'s load transaction once per client count; a fresh scratch database each time.

    Ctrl-C (or SIGTERM) stops pgbench's process group, waits for it, drops the scratch
    database and raises :class:`Interrupted`, whose ``partial`` is what was measured so far.
    """
    script = pgbench_script(scenario)
    sweep_work_dirs()
    pgbench = find_pgbench(server, options.pgbench)
    major = pgbench_major(pgbench)
    check_machine(max(options.clients, default=0))
    check_room(server, max(options.clients, default=0))
    result = LoadSeries(scenario.name, scenario.variant, server.version)
    try:
        for clients in options.clients:
            try:
                run = _one_count(scenario, server, options, script, pgbench, major, clients)
            except psycopg.OperationalError as exc:  # pgrace's own setup or check connection
                raise _aborted(server, "a connection of pgrace's", exc) from None
            result.runs.append(run)
            if options.on_progress is not None:
                options.on_progress(result, run)
    except KeyboardInterrupt as exc:
        result.interrupted = True
        raise Interrupted(result, exc) from exc
    return result


def _one_count(
    scenario: Scenario, server: ServerInfo, options: LoadOptions, script: str, pgbench: str, major: int, clients: int
) -> ClientRun:
    from pgrace.scratch import scratch_database

    app = f"{APP_PREFIX}{scenario.name[:30]}/{secrets.token_hex(4)}"
    with (
        scratch_database(server, f"load_{scenario.name}", with_pgrowlocks=False) as db,  # pg_locks is sampled
        held_temporary_dir(WORK_PREFIX) as work,
    ):
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            for text in setup_sql(scenario):
                error = control_sql(options.setup_timeout).execute(conn.pgconn, text).error
                if error is not None:
                    why = f" ({error.detail})" if error.detail and error.sqlstate == "57014" else ""
                    raise ScenarioFailed(
                        f"load setup failed: {error.sqlstate}: {error.message}{why}", scenario.source, None
                    )
        script_path = os.path.join(work, "load.sql")
        Path(script_path).write_text(script, encoding="utf-8")
        params = {k: str(v) for k, v in conninfo_to_dict(db.dsn).items() if v is not None}
        env = dict(os.environ, PGAPPNAME=app)
        params.update(_secrets_aside(params, work, env))
        params["application_name"] = app
        argv = pgbench_argv(pgbench, major, script_path, clients, options, work, make_conninfo(**params))
        logged = _log_waits(server, db.name, db.schema)  # before pgbench's clients connect: they take the settings
        offset = log_offset(server.log_path) if logged and server.log_path else None
        with psycopg.connect(db.dsn, autocommit=True, application_name="pgrace-load-observer") as observer:
            try:
                waiters, on_what, out, err, code = _drive(argv, env, work, observer, app, options.sample_every)
                if code != 0:  # pgbench's clients may have lost the server: the observer tells
                    observer.execute("SELECT 1")
            except psycopg.OperationalError as exc:
                raise _aborted(server, "pgrace's observer connection", exc) from None
        if code != 0:
            raise ScenarioFailed(
                f"pgbench failed at {clients} clients: {pgbench_error_line(err)}", scenario.source, None
            )
        latencies = read_latencies(work)
        waits = None
        if offset is not None and server.log_path is not None:
            waits = read_waits(server.log_path, offset, db.name, _relations(db.dsn))
            if waits.on:
                on_what = waits.on.most_common(1)[0][0]
        run = ClientRun(
            clients=clients,
            tps=number_in(r"^tps = ([0-9.]+)", out),
            latency_ms=percentiles_of(latencies),
            failures=int(number_in(r"^number of failed transactions: (\d+)", out)),
            retries=int(number_in(r"^total number of retries: (\d+)", out)),
            transactions=int(number_in(r"^number of transactions actually processed: (\d+)", out)),
            lock_waiters_max=waiters,
            lock_waits_on=on_what,
            lock_waits=None if waits is None else waits.count,
            lock_waited_ms=None if waits is None else round(waits.waited_ms, 3),
            lock_waits_by=() if waits is None else tuple(waits.on.most_common()),
            lock_waits_rows=()
            if waits is None
            else tuple((relation, ctid, count) for (relation, ctid), count in waits.rows.most_common(MOST_ROWS)),
            lock_waits_cut=waits is not None and waits.cut,
        )
        run.violations = check_invariants(scenario, db.dsn, options.setup_timeout)
    return run


MOST_ROWS = 10  # the rows waited on most, by ctid, that a count reports


def _log_waits(server: ServerInfo, database: str, schema: str | None) -> bool:
    """Have the server log every lock wait of ``database`` of 1 ms or more; False where it cannot be read back.

    Only a server pgrace started (its log is a file pgrace reads, its superuser pgrace's) in a
    scratch database of its own; elsewhere the waits are sampled (``lock_waiters_max``) and not counted.
    """
    if server.log_path is None or not server.scenario_role or schema is not None:
        return False
    name = sql.Identifier(database)
    with psycopg.connect(server.dsn, autocommit=True, application_name="pgrace-load-setup") as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} SET log_lock_waits = on").format(name))
        admin.execute(sql.SQL("ALTER DATABASE {} SET deadlock_timeout = {}").format(name, DEADLOCK_TIMEOUT))
    return True


def _relations(dsn: str) -> dict[int, str]:
    """The scratch database's tables and indexes by OID: a logged tuple or relation wait names an OID."""
    with psycopg.connect(dsn, autocommit=True, application_name="pgrace-load-setup") as conn:
        return {int(oid): str(name) for oid, name in conn.execute("SELECT oid, oid::regclass::text FROM pg_class")}


def _secrets_aside(params: dict[str, str], work: str, env: dict[str, str]) -> dict[str, str]:
    """Take the secrets out of ``params``, which end up in pgbench's argv, visible to everyone in ``ps``.

    The password goes into ``PGPASSWORD``, server ``options`` into ``PGOPTIONS``. libpq has
    no variable for ``sslpassword``: it goes into a connection service file in ``work``
    (mode 0700, the file 0600) that libpq reads through ``PGSERVICEFILE``; the returned
    ``service`` parameter names it.
    """
    password = params.pop("password", None)
    if password is not None:
        env["PGPASSWORD"] = password
    options = params.pop("options", None)  # may set anything, a password too: not for ps to show
    if options is not None:
        env["PGOPTIONS"] = options
    sslpassword = params.pop("sslpassword", None)
    if sslpassword is None:
        return {}
    if "service" in params:
        raise ScenarioError("a DSN naming a service cannot also give sslpassword to pgbench: put it in the service")
    if "\n" in sslpassword or "\r" in sslpassword or sslpassword != sslpassword.strip():
        raise ScenarioError("an sslpassword with a line break or surrounding spaces cannot be handed to pgbench")
    path = os.path.join(work, "pg_service.conf")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(f"[pgrace]\nsslpassword={sslpassword}\n")
    env["PGSERVICEFILE"] = path
    env.pop("PGSERVICE", None)
    return {"service": "pgrace"}


WORK_PREFIX = "pgrace-load-"


def sweep_work_dirs() -> list[str]:
    """Remove the work directories (pgbench's script and logs) that killed loads of this user left."""
    return sweep_dead_dirs(WORK_PREFIX)


def pgbench_argv(
    pgbench: str, major: int, script: str, clients: int, options: LoadOptions, work: str, conninfo: str
) -> list[str]:
    """The pgbench command line for one client count."""
    argv = [pgbench, "-n", "-M", "extended", "-f", script, "-c", str(clients), "-j", str(threads_for(clients))]
    argv += ["-T", f"{options.duration:g}"] if options.transactions is None else ["-t", str(options.transactions)]
    argv += ["--log", f"--log-prefix={os.path.join(work, 'tx')}"]
    if major >= 15:
        argv += [f"--max-tries={MAX_TRIES}", "--failures-detailed"]
    return [*argv, conninfo]


def threads_for(clients: int) -> int:
    """pgbench's ``-j``: a thread per core this process may run on, never more than one per client.

    A pgbench thread drives its share of the clients asynchronously, so threads beyond the
    cores add nothing but scheduling; one thread per client fails outright at high counts
    (``-c 1000``: "could not create thread").
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(clients, cores))


DEFAULT_CONNECTIONS = 100  # what pgrace's own server allows unless a load asks for more
_OUR_CONNECTIONS = 10  # pgrace's own (setup, observer, a probe) and PostgreSQL's superuser reserve


def connections_for(clients: int) -> int:
    """``max_connections`` for a server pgrace starts to take ``clients`` pgbench clients beside its own."""
    return max(DEFAULT_CONNECTIONS, clients + _OUR_CONNECTIONS)


def check_machine(clients: int) -> None:
    """Refuse (exit 2) a client count this process cannot open files for: pgbench holds a socket per client."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = clients + 64  # pgbench's logs, its libraries, stdio
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard == resource.RLIM_INFINITY or hard >= needed:
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))  # pgbench inherits it
            return
        raise OptionError(
            f"{clients}: this machine lets a process open {hard} files at most (ulimit -Hn),"
            " and pgbench needs one per client and about 64 more; run fewer",
            "clients",
        )


def check_room(server: ServerInfo, clients: int) -> None:
    """Refuse (exit 2) a client count the server has no connections for, before pgbench fails on it.

    pgbench's clients, pgrace's observer and the connection that sets up and checks each
    count need that many free slots; the ones reserved for superusers are not counted on.
    """
    from pgrace.scratch import connection_room

    room = connection_room(server)
    if clients + 2 > room.free:
        raise OptionError(
            f"{clients}: the server has room for {max(0, room.free - 2)} clients ({room},"
            " and pgrace's own 2); run fewer or raise max_connections",
            "clients",
        )


def _drive(
    argv: list[str], env: dict[str, str], work: str, observer: Any, app: str, every: float
) -> tuple[int, str | None, str, str, int]:
    """Run pgbench, sampling lock waits until it ends; on an interrupt stop its process group first."""
    out_path, err_path = os.path.join(work, "stdout"), os.path.join(work, "stderr")
    most, on_what = 0, None
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        with deferred_interrupts():  # a Ctrl-C while forking is taken after `proc` is known
            # Its own session (a Ctrl-C at the terminal is pgrace's to pass on), and gone with pgrace,
            # even a SIGKILLed one: a pgbench left running would load the server until it ended.
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=work,
                                    start_new_session=True, preexec_fn=dies_with_parent())  # fmt: skip
        try:
            while True:
                waiting = sample_waits(observer, app)
                if len(waiting) > most:
                    most = len(waiting)
                    on_what = Counter(waiting.values()).most_common(1)[0][0]
                try:
                    proc.wait(timeout=every)
                    break
                except subprocess.TimeoutExpired:
                    continue
        except BaseException:
            with deferred_interrupts():
                _stop(proc)
            raise
    return (
        most,
        on_what,
        Path(out_path).read_text(errors="replace"),
        Path(err_path).read_text(errors="replace"),
        (proc.returncode),
    )


def _aborted(server: ServerInfo, connection: str, exc: psycopg.Error) -> RunAborted:
    """The server went away, or only one of pgrace's connections: one fresh connection decides (as ``run``)."""
    from pgrace.servers import scrub_secrets

    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    detail = scrub_secrets(f"{exc.sqlstate}: {first}" if exc.sqlstate else first, server.dsn)
    try:
        with psycopg.connect(server.dsn, autocommit=True, connect_timeout=2, application_name="pgrace-load-probe"):
            pass
    except psycopg.Error:
        return RunAborted(f"the server went away during the load run ({detail})")
    return RunAborted(f"{connection} was lost during the load run ({detail})")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT to pgbench's process group, wait for it; SIGKILL if it does not go."""
    for sig in (signal.SIGINT, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=STOP_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue
