"""``pgrace load``: a scenario's ``[load]`` transaction, driven by PostgreSQL's own pgbench.

pgrace writes the pgbench script, and for each client count: creates a fresh scratch
database, runs the scenario's setup and the load setup, runs pgbench (its clients tagged
with an ``application_name`` of their own), samples ``pg_locks`` every ~50 ms on an
observer connection to see how many of those clients wait on a lock at once and on what,
reads pgbench's per-transaction log for the latency percentiles, then runs the load
checks (the invariants) and drops the database. A Python thread pool is not a load
generator; pgbench is.

Variables: scenario params are composed into the script by :mod:`pgrace.variables`
(psycopg's ``sql``); captured values (``\\gset``) and drawn values (``\\set``) stay pgbench
variables, sent by pgbench as bound parameters (``-M extended``), never pasted into SQL.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgrace.errors import RunAborted, ScenarioError, ScenarioFailed, ServerUnavailable
from pgrace.model import LoadCommand, Scenario
from pgrace.servers import ServerInfo, deferred_interrupts
from pgrace.servers.processes import dies_with_parent, owned_private_dir, pid_alive
from pgrace.variables import find, meta_command, param_values, substitute

APP_PREFIX = "pgrace-load/"
SAMPLE_EVERY_S = 0.05
STOP_GRACE_S = 10.0
MAX_TRIES = 10  # pgbench --max-tries: a 40001/40P01 transaction is retried this many times in all
_NAME_CHAR = re.compile(r"[A-Za-z0-9_\x80-\U0010ffff]")


class NoPgbench(ServerUnavailable):
    """No pgbench could be found for this server (exit 3, as a server that cannot be had)."""


@dataclass(frozen=True)
class Violation:
    """An invariant that did not hold after a load run."""

    check: str
    expected: str
    actual: str


@dataclass
class ClientRun:
    """What one pgbench run at one client count measured."""

    clients: int
    tps: float
    latency_ms: dict[str, float | None]
    failures: int
    retries: int
    transactions: int
    lock_waiters_max: int
    lock_waits_on: str | None
    violations: list[Violation] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "clients": self.clients,
            "tps": self.tps,
            "latency_ms": dict(self.latency_ms),
            "failures": self.failures,
            "retries": self.retries,
            "lock_waiters_max": self.lock_waiters_max,
            "violations": [{"check": v.check, "expected": v.expected, "actual": v.actual} for v in self.violations],
        }


@dataclass
class LoadResult:
    """One variant under load: a run per client count (fewer when interrupted)."""

    scenario: str
    variant: str
    server_version: str
    runs: list[ClientRun] = field(default_factory=list)
    interrupted: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "variant": self.variant,
            "server_version": self.server_version,
            "runs": [r.to_json() for r in self.runs],
        }


@dataclass(frozen=True)
class LoadOptions:
    """``clients``: one pgbench run per count; ``duration`` seconds each (``-T``), or ``transactions`` per client."""

    clients: tuple[int, ...] = (1, 2, 4, 8)
    duration: float | None = 5.0
    transactions: int | None = None
    pgbench: str | None = None
    sample_every: float = SAMPLE_EVERY_S
    on_progress: Callable[[LoadResult, ClientRun], None] | None = None


# -- the script ------------------------------------------------------------------------------


def compose_sql(text: str, scenario: Scenario) -> str:
    """SQL that pgrace itself runs (setup, checks): the scenario's params composed in."""
    return substitute(text, param_values(scenario))


def _pgbench_variables(text: str) -> list[str]:
    """The ``:name`` pgbench's ``-M extended`` will bind in ``text``, by pgbench's own rule (quotes unseen)."""
    found: list[str] = []
    index = 0
    while (index := text.find(":", index)) != -1:
        end = index + 1
        while end < len(text) and _NAME_CHAR.match(text[end]):
            end += 1
        if end == index + 1:
            while index < len(text) and text[index] == ":":
                index += 1
            continue
        found.append(text[index + 1 : end])
        index = end
    return found


def _statement(text: str, scenario: Scenario, command: LoadCommand) -> str:
    """One statement for pgbench: params composed, runtime variables as pgbench's ``:name``."""
    composed = compose_sql(text, scenario)
    pieces: list[str] = []
    names: list[str] = []
    position = 0
    for use in find(composed):
        pieces.append(composed[position : use.start])
        pieces.append(f":{use.name}" if use.form == "value" else f"CAST(:{use.name} AS text)")
        names.append(use.name)
        position = use.end
    pieces.append(composed[position:])
    result = "".join(pieces)
    _no_meta_command(result, scenario, command.line)
    seen = _pgbench_variables(result)
    if seen != names:
        stray = next((n for n in seen if n not in names), seen[0] if seen else "?")
        raise ScenarioError(
            f"load SQL {' '.join(text.split())[:60]!r}: pgbench would read ':{stray}' as a variable"
            " (it does not see quotes or comments); write it without a colon before a name",
            scenario.source,
            command.line,
        )
    return result


def pgbench_script(scenario: Scenario) -> str:
    """The pgbench script of ``scenario``'s ``[load]`` transaction (for ``pgbench -M extended -f``)."""
    from pglast import split
    from pglast.parser import ParseError

    load = _load_of(scenario)
    lines = [f"-- pgrace load: {_one_line(scenario.name)} ({scenario.variant}); run with pgbench -n -M extended -f"]
    for command in load.transaction:
        if command.kind == "set":
            lines.append(f"\\set {command.name} random({command.low}, {command.high})")
            continue
        if command.kind == "sleep":
            lines.append(f"\\sleep {max(1, round(command.seconds * 1_000_000))} us")
            continue
        if command.step:
            lines.append(f"-- step {_one_line(command.step)}")
        try:
            statements = [s.strip() for s in split(command.sql, with_parser=False) if s.strip()]
        except ParseError as exc:  # PostgreSQL's scanner cannot read it: pgbench could not either
            raise ScenarioError(
                f"load SQL {' '.join(command.sql.split())[:60]!r} cannot be split into statements: {exc}",
                scenario.source,
                command.line,
            ) from None
        for index, statement in enumerate(statements):
            # A trailing `-- comment` would swallow what pgrace writes after it on its line.
            if _ends_in_line_comment(statement):
                statement += "\n"
            if index == len(statements) - 1 and command.capture:
                if any(variable != column for variable, column in command.capture):
                    columns = sql.SQL(", ").join(
                        sql.SQL("{} AS {}").format(sql.Identifier(column), sql.Identifier(variable))
                        for variable, column in command.capture
                    )
                    statement = (
                        sql.SQL("WITH pgrace_step AS ({}) SELECT {} FROM pgrace_step")
                        .format(sql.SQL(statement), columns)
                        .as_string(None)
                    )
                text = _statement(statement, scenario, command)
                lines.append(f"{text}{'' if text.endswith(chr(10)) else ' '}\\gset")
            else:
                lines.append(f"{_statement(statement, scenario, command)};")
    return "\n".join(lines) + "\n"


def setup_sql(scenario: Scenario) -> list[str]:
    """The scenario's setup, then the load setup, params composed: run before each client count."""
    load = _load_of(scenario)
    texts = [compose_sql(text, scenario) for text in (*scenario.setup, *load.setup)]
    for text in texts:
        _no_meta_command(text, scenario, load.line)
    return texts


def _no_meta_command(text: str, scenario: Scenario, line: int | None) -> None:
    """The last word before pgbench or psql reads ``text``: the file's own text was checked when it was read.

    Composed params are quoted literals or a choice's plain words, so this never fires on a
    scenario that passed; it keeps a future change to composing from opening a shell.
    """
    if (found := meta_command(text)) is not None:
        raise ScenarioError(
            f'load SQL holds the meta-command "{found}" (a backslash outside quotes)', scenario.source, line
        )


def _ends_in_line_comment(text: str) -> bool:
    from pglast.parser import ParseError, scan

    try:
        tokens = scan(text)
    except ParseError:
        return False
    return bool(tokens) and tokens[-1].name == "SQL_COMMENT"


def _load_of(scenario: Scenario) -> Any:
    if scenario.load is None:
        raise ScenarioError(
            f"scenario {scenario.name!r} ({scenario.variant}) has no [load] section", scenario.source, None
        )
    return scenario.load


def _one_line(text: str) -> str:
    """File text for a ``--`` comment line of a script: nothing in it may end the line or act on a terminal."""
    from pgrace.text import visible

    return visible(" ".join(text.split()).replace("--", "- -"))


def emit(scenario: Scenario, directory: Path) -> list[Path]:
    """Write the pgbench script, the setup SQL and the checks' SQL, to drive a server with pgbench alone.

    Every file is made before any is written, so invalid input leaves nothing; a file that
    cannot be written is invalid input (exit 2), and a symbolic link in its place is not
    followed (it could point anywhere).
    """
    stem = f"{scenario.name}.{scenario.variant}"
    check_text = []
    for check in _load_of(scenario).checks:
        query = compose_sql(check.sql, scenario)
        _no_meta_command(query, scenario, check.line)
        check_text.append(f"-- {_one_line(check.description)}: (expected, actual[, detail])\n")
        check_text.append(_terminated(query))
    files = {
        directory / f"{stem}.pgbench.sql": pgbench_script(scenario),
        directory / f"{stem}.setup.sql": "".join(_terminated(text) for text in setup_sql(scenario)),
        directory / f"{stem}.check.sql": "".join(check_text),
    }
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ScenarioError(f"--emit: cannot make the folder: {exc.strerror or exc}", str(directory)) from None
    for path in files:  # all refused before any is written: nothing is left half done
        with contextlib.suppress(FileNotFoundError):
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                raise ScenarioError(
                    "--emit: cannot write: a symbolic link is there; pgrace does not write through one", str(path)
                )
            if not stat.S_ISREG(st.st_mode):
                raise ScenarioError("--emit: cannot write: something that is not a file is there", str(path))
    for path, text in files.items():
        _write_file(path, text)
    return list(files)


def _write_file(path: Path, text: str) -> None:
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # no FIFO hang
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        why = "a symbolic link is there; pgrace does not write through one" if path.is_symlink() else exc.strerror
        raise ScenarioError(f"--emit: cannot write: {why or exc}", str(path)) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:  # a full disk, say
        raise ScenarioError(f"--emit: cannot write: {exc.strerror or exc}", str(path)) from None


def _terminated(text: str) -> str:
    text = text.strip()
    if _ends_in_line_comment(text):
        return text + "\n;\n"
    return text + ("\n" if text.endswith(";") else ";\n")


# -- finding pgbench -----------------------------------------------------------------------


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
    raise NoPgbench(f"no pgbench found in {where}; install PostgreSQL's client tools or pass --pgbench PATH")


def pgbench_major(pgbench: str) -> int:
    try:
        out = subprocess.run([pgbench, "--version"], capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise NoPgbench(f"cannot run {pgbench} --version: {exc}") from exc
    match = re.search(r"(\d+)", out)
    return int(match.group(1)) if match else 0


# -- running ---------------------------------------------------------------------------------


def run_load(scenario: Scenario, server: ServerInfo, options: LoadOptions) -> LoadResult:
    """Run ``scenario``'s load transaction once per client count; a fresh scratch database each time.

    Ctrl-C (or SIGTERM) stops pgbench's process group, waits for it, drops the scratch
    database and re-raises; the exception carries what was measured so far as ``partial``.
    """
    script = pgbench_script(scenario)
    sweep_work_dirs()
    pgbench = find_pgbench(server, options.pgbench)
    major = pgbench_major(pgbench)
    check_room(server, max(options.clients, default=0))
    result = LoadResult(scenario.name, scenario.variant, server.version)
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
        exc.partial = result  # type: ignore[attr-defined]  # what was measured so far, for the CLI to show
        raise
    return result


def _one_count(
    scenario: Scenario, server: ServerInfo, options: LoadOptions, script: str, pgbench: str, major: int, clients: int
) -> ClientRun:
    from pgrace.scratch import scratch_database

    app = f"{APP_PREFIX}{scenario.name[:30]}/{secrets.token_hex(4)}"
    with (
        scratch_database(server, f"load_{scenario.name}", with_pgrowlocks=False) as db,  # pg_locks is sampled
        tempfile.TemporaryDirectory(prefix=f"{WORK_PREFIX}{os.getpid()}-") as work,
    ):
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            for text in setup_sql(scenario):
                try:
                    conn.execute(text.encode())
                except psycopg.Error as exc:
                    raise ScenarioFailed(
                        f"load setup failed: {exc.sqlstate}: {exc.diag.message_primary}", scenario.source, None
                    ) from None
        script_path = os.path.join(work, "load.sql")
        Path(script_path).write_text(script, encoding="utf-8")
        params = {k: str(v) for k, v in conninfo_to_dict(db.dsn).items() if v is not None}
        env = dict(os.environ, PGAPPNAME=app)
        params.update(_secrets_aside(params, work, env))
        params["application_name"] = app
        argv = pgbench_argv(pgbench, major, script_path, clients, options, work, make_conninfo(**params))
        with psycopg.connect(db.dsn, autocommit=True, application_name="pgrace-load-observer") as observer:
            try:
                waiters, on_what, out, err, code = _drive(argv, env, work, observer, app, options.sample_every)
                if code != 0:  # pgbench's clients may have lost the server: the observer tells
                    observer.execute("SELECT 1")
            except psycopg.OperationalError as exc:
                raise _aborted(server, "pgrace's observer connection", exc) from None
        if code != 0:
            raise ScenarioFailed(f"pgbench failed at {clients} clients: {_pgbench_error(err)}", scenario.source, None)
        latencies = _latencies(work)
        run = ClientRun(
            clients=clients,
            tps=_number(r"^tps = ([0-9.]+)", out),
            latency_ms=_percentiles(latencies),
            failures=int(_number(r"^number of failed transactions: (\d+)", out)),
            retries=int(_number(r"^total number of retries: (\d+)", out)),
            transactions=int(_number(r"^number of transactions actually processed: (\d+)", out)),
            lock_waiters_max=waiters,
            lock_waits_on=on_what,
        )
        run.violations = check_invariants(scenario, db.dsn)
    return run


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
_WORK_DIR = re.compile(r"^pgrace-load-(\d+)-")


def sweep_work_dirs() -> list[str]:
    """Remove the work directories (pgbench's script and logs) that killed loads of this user left.

    The temporary folder is everyone's: only a 0700 directory of this user, named for a
    process that is gone, is taken.
    """
    base = tempfile.gettempdir()
    removed: list[str] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        match = _WORK_DIR.match(entry.name)
        if match is None or int(match[1]) == os.getpid() or pid_alive(int(match[1])):
            continue
        if owned_private_dir(entry.path, {os.geteuid()}):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


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


def check_room(server: ServerInfo, clients: int) -> None:
    """Refuse (exit 2) a client count the server has no connections for, before pgbench fails on it.

    pgbench's clients, pgrace's observer and the connection that sets up and checks each
    count need that many free slots; the ones reserved for superusers are not counted on.
    """
    from pgrace.scratch import connection_room

    room = connection_room(server)
    if clients + 2 > room.free:
        raise ScenarioError(
            f"-c/--clients {clients}: the server has room for {max(0, room.free - 2)} clients ({room},"
            " and pgrace's own 2); lower -c or raise max_connections"
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
                waiting = _sample(observer, app)
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


_GONE = frozenset({"57P01", "57P02", "57P03"})  # admin shutdown, crash shutdown, cannot connect now


def connection_lost(exc: psycopg.Error) -> bool:
    """Whether ``exc`` says the connection (or the server) went away, by its SQLSTATE.

    No SQLSTATE on an OperationalError is libpq's own word: refused, reset, closed unexpectedly.
    """
    if exc.sqlstate is None:
        return isinstance(exc, psycopg.OperationalError)
    return exc.sqlstate in _GONE or exc.sqlstate.startswith("08")


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


_SAMPLE = """
WITH l AS MATERIALIZED (SELECT * FROM pg_locks)  -- one reading of the lock table for the whole sample
SELECT w.pid, w.locktype, coalesce(w.relation, t.relation)::regclass::text
FROM l w
JOIN pg_stat_activity a ON a.pid = w.pid
LEFT JOIN LATERAL (
  SELECT relation FROM l t WHERE t.pid = w.pid AND t.locktype = 'tuple' AND t.granted LIMIT 1
) t ON true
WHERE NOT w.granted AND a.application_name = %s
"""


def _sample(observer: Any, app: str) -> dict[int, str]:
    """pgbench's clients waiting on a lock right now, and on what, by pid."""
    waiting: dict[int, str] = {}
    for pid, locktype, relation in observer.execute(_SAMPLE, (app,)).fetchall():
        waiting[pid] = _describe(locktype, relation)
    return waiting


def _describe(locktype: str, relation: str | None) -> str:
    if locktype in ("tuple", "transactionid") and relation:
        return f"a row of {relation}"
    if locktype == "transactionid":
        return "another transaction"
    if locktype == "relation" and relation:
        return f"table {relation}"
    if locktype == "advisory":
        return "an advisory lock"
    return locktype


def _pgbench_error(err: str) -> str:
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    for line in lines:
        if "aborted" in line or "ERROR" in line or "error" in line:
            return line
    return lines[0] if lines else "no message"


def _number(pattern: str, text: str) -> float:
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _latencies(work: str) -> list[float]:
    """Milliseconds of every successful transaction, from pgbench's per-transaction logs (one per thread)."""
    values: list[float] = []
    for path in glob.glob(os.path.join(work, "tx.*")):
        with open(path, encoding="utf-8", errors="replace") as log:
            for line in log:
                fields = line.split()
                if len(fields) >= 3 and fields[2].isdigit():
                    values.append(int(fields[2]) / 1000.0)
    return values


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    ordered = sorted(values)

    def rank(p: float) -> float:  # nearest rank
        index = max(0, min(len(ordered) - 1, int(-(-p * len(ordered) // 100)) - 1))
        return round(ordered[index], 3)

    return {"p50": rank(50), "p95": rank(95), "p99": rank(99)}


def check_invariants(scenario: Scenario, dsn: str) -> list[Violation]:
    """Each load check's ``(expected, actual[, detail])``; a violation where they differ."""
    violations: list[Violation] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for check in _load_of(scenario).checks:
            try:
                row = conn.execute(compose_sql(check.sql, scenario).encode()).fetchone()
            except psycopg.Error as exc:
                if connection_lost(exc):  # not the check's answer: the run cannot be judged
                    raise
                violations.append(Violation(check.description, "a row", f"error {exc.sqlstate}: {exc}"))
                continue
            if row is None or len(row) < 2:
                violations.append(Violation(check.description, "a row (expected, actual)", repr(row)))
                continue
            expected, actual = row[0], row[1]
            if expected != actual:
                shown = _text(actual) + (f" ({row[2]})" if len(row) > 2 and row[2] is not None else "")
                violations.append(Violation(check.description, _text(expected), shown))
    return violations


def _text(value: Any) -> str:
    return "NULL" if value is None else str(value)
