"""Kill ``pgrace run``, ``pgrace clean`` and the parallel drivers at random moments, over and over: nothing is left.

Usage: ``python bench/bench_kills.py [--kills N] [--seed S] [--drivers run|parallel|all] [-v]``

Rounds cycle over three places: the embedded server, a ``--dsn`` server (one embedded
server that this process starts for the purpose), and schema mode on that server
(``--allow-scratch-schema`` as a role without CREATEDB, in a user database full of tables
named like the scenarios'). Each round starts ``python -m pgrace run <scenario> --step``
in a child process, answers its prompts, and sends SIGINT, SIGTERM or SIGKILL at a random
moment of a chosen phase:

* *startup*: Python starts, pgrace sweeps; no run directory (embedded) or scratch object yet;
* *setup*: the embedded server is being copied or started, the scratch object created,
  the setup SQL run; no step has been offered yet;
* *between steps*: pgrace waits for Enter, nothing is running;
* *mid-step*: Enter was just pressed, the step is on its way to the server;
* *blocked step*: a step is pending, blocked by another session's lock;
* *teardown*: every step has been sent; checks, teardown, the scratch drop, server stop;
* *create database* (``--dsn``): inside ``CREATE DATABASE`` (held there by a connection
  to template1 until the signal has left, so a SIGKILL leaves a database that exists
  and that nothing but its name marks);
* *sweep*: leftovers of dead runs are planted, and a ``pgrace run`` or ``pgrace clean``
  is killed while it removes them (named *sweep* only when some were gone and some not),
  with a live run of the same scenario paused beside it;
* *pid namespace*: a live run is paused mid-run and ``pgrace clean`` runs in a second PID
  namespace (``unshare -p -f --mount-proc``), killed at a random moment of its sweep.

The phase is named from what the child had done when the signal left, not from what
was aimed at. Then, once the child has exited:

* embedded: its postmaster is dead, no process works in its run directory, and the
  directory is gone (after SIGKILL: once a later run has swept it);
* ``--dsn`` and schema mode: no backend named ``pgrace/%`` remains, no other backend
  holds a lock, and after one later ``pgrace clean`` (after SIGKILL, or planted leftovers)
  no scratch database or schema is left, none unrecognised, and the user's tables are
  unchanged; a live run paused beside a sweep is *disturbed* unless its scratch object
  survived the sweep and the run then finished with every expectation holding.

The parallel drivers (``--drivers parallel``, or ``all``, the default, alternating with the
rounds above) get rounds of their own: ``explore -j 3``, ``sweep --explore -j 2``, ``load``
(pgbench) and ``check --explore -j 2``, each on the embedded server or the ``--dsn`` one,
started in a session of its own as a terminal would. SIGINT goes to the whole process
group (Ctrl-C: pgrace and its workers; pgbench has a session of its own), SIGTERM and
SIGKILL to pgrace alone, at a random moment of a phase:

* *startup*: from Python's start until a worker process (or pgbench) exists;
* *workers*: up to 1.5 s after one does: workers import, create their databases, explore.

Then every process of the session, and any working in a load's work directory, must be
gone (after SIGKILL too: workers and pgbench die with pgrace), no backend named
``pgrace%`` remain, and after SIGKILL, once ``pgrace clean`` has run, no scratch database,
schema or role and no load work directory. Each SIGINT or SIGTERM must end pgrace within
2 s: the slowest exit of each driver is reported.

Prints the kills per signal and per phase and every leftover; exits 1 if there was any
leftover, unrecognised object, disturbed live run or slow exit.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgrace import api
from pgrace.frontends import catalog
from pgrace.scratch import is_scratch_name, lock_key, scratch_name
from pgrace.servers import ServerInfo, open_server

RUN_ROOT = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
PROMPT = re.compile(r"▶ next: step (\d+) ")
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
AIMS = ("startup", "setup", "mid-step", "blocked step", "teardown", "between steps")
PLACES = ("embedded", "dsn", "schema")
MORE_AIMS = {"embedded": (), "dsn": ("create database", "sweep", "pid namespace"), "schema": ("sweep", "pid namespace")}
USER_DB = "killshop"
ROLE = "killclerk"
PASSWORD = "k1ll-pw"
USER_TABLES = ("accounts", "jobs", "foo", "bar", "t", "test", "parent", "child")
PGRACE_LOCKS = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND classid::bigint = %s"
    " AND pid <> pg_backend_pid()"
)
EXPECTED_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGKILL: -signal.SIGKILL}
DEADLINE_S = 15.0
SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
PARALLEL = {  # each is seconds of work at least, unless stopped
    "explore -j": ("explore", "skip-locked-fanout", "-p", "workers=4", "--max", "3000", "-j", "3"),
    "sweep --explore": ("sweep", "skip-locked-fanout", "-p", "workers=3,4", "--explore", "--max", "1500", "-j", "2"),
    "load": ("load", "lost-update", "-c", "2,4", "-T", "4"),
    "check --explore": ("check", "--explore", "--max", "1500", "-j", "2", str(SCENARIOS / "skip-locked-fanout.toml")),
}
WORKER_MARKS = ("spawn_main",)  # a driver's worker processes, in their command lines
EXIT_WITHIN_S = 2.0


@dataclass(frozen=True)
class Variant:
    """A shipped scenario variant and what a clean run of it looks like."""

    name: str
    variant: str
    steps: int
    blocked: tuple[tuple[int, int], ...]  # (step that waits, step that releases it)


@dataclass
class Tally:
    kills: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # server, signal, phase
    finished_first: int = 0
    exits: Counter[tuple[str, int]] = field(default_factory=Counter)  # signal, exit status
    leftovers: list[str] = field(default_factory=list)
    unrecognised: list[str] = field(default_factory=list)
    disturbed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tracebacks: Counter[str] = field(default_factory=Counter)
    exit_s: dict[str, list[float]] = field(default_factory=dict)  # driver: SIGINT/SIGTERM to exit
    slow: list[str] = field(default_factory=list)


def traceback_kind(stderr: str) -> str:
    """Where a signal raised outside pgrace's handling: both known places have nothing to clean up."""
    if "<frozen runpy>" in stderr and ", in invoke" not in stderr:
        return "while Python imported pgrace (nothing started yet)"
    if "Fatal Python error: init_import_site" in stderr:
        return "while Python started, before pgrace (nothing started yet)"
    if "Exception ignored in: <module 'threading'" in stderr:
        return "in interpreter shutdown, after pgrace had cleaned up"
    return "elsewhere"


class Child:
    """``pgrace run --step`` in a child process, its output read by threads as it comes."""

    def __init__(self, argv: list[str]) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PGRACE_DSN"}
        env.update(PYTHONUNBUFFERED="1", NO_COLOR="1")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self.stderr: list[str] = []
        threading.Thread(target=self._pump_stdout, daemon=True).start()
        self.err_thread = threading.Thread(target=self._pump_stderr, daemon=True)
        self.err_thread.start()

    def _pump_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _pump_stderr(self) -> None:
        assert self.proc.stderr is not None
        self.stderr.extend(self.proc.stderr)

    def next_prompt(self) -> int | None:
        """Read until pgrace offers a step; its number, or None when the output ended."""
        end = time.monotonic() + DEADLINE_S
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:
                return None
            self.seen.append(line)
            if match := PROMPT.search(line):
                return int(match.group(1))
        raise TimeoutError("no prompt from pgrace within the deadline:\n" + "".join(self.seen[-20:]))

    def enter(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it ended meanwhile

    def drain(self) -> None:
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return
            if line is not None:
                self.seen.append(line)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def poll_until(check: object, deadline_s: float = DEADLINE_S) -> bool:
    """Poll ``check()`` until it is true (processes and backends exit asynchronously)."""
    assert callable(check)
    end = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def working_in(prefix: str) -> list[tuple[int, str]]:
    """Live processes whose working directory starts with ``prefix``, and that directory."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if cwd.startswith(prefix) and alive(int(entry.name)):
                found.append((int(entry.name), cwd))
    return found


def processes_in(run_dir: Path) -> list[int]:
    """Processes working in a run directory (postgres chdirs into its data directory)."""
    return [pid for pid, _ in working_in(str(run_dir) + "/")]


def run_dirs(pid: int) -> list[Path]:
    return sorted(RUN_ROOT.glob(f"pgrace-{pid}-*"))


def postmaster_pid(run_dir: Path) -> int | None:
    try:
        return int((run_dir / "data" / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def session_processes(sid: int) -> list[str]:
    """Live processes of a session (a parallel driver's child started it): pid and command line."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except (OSError, IndexError):
                continue
            if int(fields[3]) == sid and alive(int(entry.name)):
                found.append(f"{entry.name} {cmdline[:100]}")
    return found


def load_work_dirs(pid: int) -> list[Path]:
    return sorted(Path(tempfile.gettempdir()).glob(f"pgrace-load-{pid}-*"))


def load_processes(pid: int) -> list[str]:
    """pgbench runs in a session of its own, in the load's work directory: processes working there."""
    return [f"{found} (in {cwd})" for found, cwd in working_in(f"{tempfile.gettempdir()}/pgrace-load-{pid}-")]


def learn(server: ServerInfo) -> list[Variant]:
    """Run every shipped variant once: how many steps, which ones block and what frees them."""
    variants = []
    for name in catalog.shipped_names():
        loaded = catalog.read_scenario(name)
        for variant in loaded.variants:
            run = api.run(loaded.variant_named(variant), server=server)
            steps = run.step_runs()
            blocked = tuple((s.seq, s.released_by) for s in steps if s.waited and s.released_by is not None)
            variants.append(Variant(name, variant, len(steps), blocked))
    return variants


@dataclass
class Place:
    """Where a round's run goes: its ``--dsn`` arguments, and the DSN a later ``pgrace clean`` is given."""

    name: str
    args: tuple[str, ...]
    clean_dsn: str


class Bench:
    def __init__(
        self, dsn_server: ServerInfo, role_dsn: str, variants: list[Variant], rng: random.Random, verbose: bool
    ) -> None:
        self.dsn_server = dsn_server
        self.user_dsn = make_conninfo(dsn_server.dsn, dbname=USER_DB)  # the superuser, in the user's database
        self.places = {
            "embedded": Place("embedded", (), dsn_server.dsn),
            "dsn": Place("dsn", ("--dsn", dsn_server.dsn), dsn_server.dsn),
            "schema": Place("schema", ("--allow-scratch-schema", "--dsn", role_dsn), role_dsn),
        }
        self.variants = variants
        self.rng = rng
        self.verbose = verbose
        self.tally = Tally()
        self.unswept: list[Path] = []  # run directories of SIGKILLed embedded runs
        self.first_prompt_s = 0.6  # measured as we go: spawn to first prompt, embedded and dsn alike
        self.teardown_s = 0.05  # last Enter to exit
        self.watcher: psycopg.Connection[tuple[object, ...]] | None = None
        self.user_rows = self.user_tables()

    # -- one round -----------------------------------------------------------------------

    def round(self, index: int) -> None:
        place = self.places[PLACES[index % len(PLACES)]]
        signum = self.rng.choice(SIGNALS)
        aim = self.rng.choice(AIMS + MORE_AIMS[place.name])
        candidates = [v for v in self.variants if v.blocked] if aim == "blocked step" else self.variants
        variant = self.rng.choice(candidates)
        label = f"round {index} ({place.name}, {variant.name} --{variant.variant}, {signum.name}"
        if aim == "create database":
            self.create_round(label, place, variant, signum)
        elif aim == "sweep":
            self.sweep_round(label, place, variant, signum)
        elif aim == "pid namespace":
            self.namespace_round(label, place, variant, signum)
        else:
            self.run_round(label, place, variant, signum, aim)

    def run_argv(self, variant: Variant, place: Place) -> list[str]:
        return [sys.executable, "-m", "pgrace", "run", variant.name, f"--{variant.variant}", "--step", *place.args]

    def run_round(self, label: str, place: Place, variant: Variant, signum: signal.Signals, aim: str) -> None:
        child = Child(self.run_argv(variant, place))
        phase = self.drive(child, variant, aim, place.name)
        run_dir = next(iter(run_dirs(child.proc.pid)), None)
        postmaster = postmaster_pid(run_dir) if run_dir else None
        if phase in ("startup", "setup") and place.name != "embedded":
            phase = "setup" if self.scratch_objects() else "startup"
        elif phase in ("startup", "setup"):  # the run directory comes first, then the server in it
            phase = "setup" if run_dir is not None else "startup"
        label = f"{label}, {phase})"
        self.kill(label, child, signum, phase, place.name)
        if place.name == "embedded":
            self.check_embedded(label, child.proc.pid, run_dir, postmaster, signum)
        else:
            self.check_dsn(label, place, clean=signum == signal.SIGKILL)

    def kill(self, label: str, child: Child, signum: signal.Signals, phase: str, where: str, pid: int = 0) -> bool:
        """Signal the child (or ``pid``, a process inside it) unless it ended first; tally how it ended."""
        killed = child.proc.poll() is None
        if killed:
            try:
                os.kill(pid or child.proc.pid, signum)
            except ProcessLookupError:  # the process inside ended just now
                killed = False
        try:
            child.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()
            self.leftover(label, f"pgrace did not exit within 60 s after {signum.name}")
        child.err_thread.join(timeout=5)
        child.drain()
        stderr = "".join(child.stderr)
        if killed:
            self.tally.kills[where, signum.name, phase] += 1
            self.tally.exits[signum.name, child.proc.returncode] += 1
            # 0 or 1: the signal came as it finished; -signum: before pgrace set its handlers, or after
            quiet_death = child.proc.returncode == -signum and "pgrace:" not in stderr
            if child.proc.returncode not in (EXPECTED_EXIT[signum], 0, 1) and not quiet_death:
                self.tally.notes.append(f"{label}: exit {child.proc.returncode}: {stderr.strip()[-300:]}")
        else:
            self.tally.finished_first += 1
        if "Traceback" in stderr:
            self.tally.tracebacks[traceback_kind(stderr)] += 1
            if traceback_kind(stderr) == "elsewhere":
                self.tally.notes.append(f"{label}: traceback on stderr: {stderr.strip()[-600:]}")
        if self.verbose:
            print(f"{label}: exit {child.proc.returncode} {stderr.strip()[:120]}", flush=True)
        return killed

    def create_round(self, label: str, place: Place, variant: Variant, signum: signal.Signals) -> None:
        """Kill inside CREATE DATABASE: a connection to template1 holds it there until the signal has left."""
        blocker = psycopg.connect(make_conninfo(self.dsn_server.dsn, dbname="template1"), autocommit=True)
        try:
            child = Child(self.run_argv(variant, place))
            creating = poll_until(lambda: child.proc.poll() is not None or self.creating())
            time.sleep(self.rng.uniform(0, 0.02))
            phase = "create database" if creating and self.creating() else "setup"
            self.kill(f"{label}, {phase})", child, signum, phase, place.name)
        finally:
            blocker.close()
        self.check_dsn(f"{label}, {phase})", place, clean=True)

    def creating(self) -> bool:
        with psycopg.connect(self.dsn_server.dsn, autocommit=True) as admin:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE query LIKE 'CREATE DATABASE \"pgrace\\_%' AND state = 'active'"
            ).fetchone()
        return row is not None and row[0] > 0

    def sweep_round(self, label: str, place: Place, variant: Variant, signum: signal.Signals) -> None:
        """Plant dead runs' leftovers, then kill a run or a clean while it sweeps them; a live run waits beside."""
        live = Child(self.run_argv(variant, place))
        live_prompt = live.next_prompt()
        live_object = self.newest_scratch(place)
        planted = self.plant(place, self.rng.randint(3, 6))
        if self.rng.random() < 0.5:
            argv = [sys.executable, "-m", "pgrace", "clean", "--dsn", place.clean_dsn]
        else:
            argv = self.run_argv(variant, place)
        child = Child(argv)
        phase = self.when_sweeping(child, planted)
        self.kill(f"{label}, {phase})", child, signum, phase, place.name)
        self.check_live(f"{label}, {phase})", live, live_prompt, live_object, place)
        self.check_dsn(f"{label}, {phase})", place, clean=True)

    def namespace_round(self, label: str, place: Place, variant: Variant, signum: signal.Signals) -> None:
        """``pgrace clean`` from a second PID namespace, killed mid-sweep, beside a live run paused mid-run."""
        live = Child(self.run_argv(variant, place))
        prompt = live.next_prompt()
        prompt = Bench.advance(live, prompt, self.rng.randint(1, variant.steps))
        live_object = self.newest_scratch(place)
        planted = self.plant(place, self.rng.randint(3, 8))
        child = Child(
            ["unshare", "-p", "-f", "--mount-proc", sys.executable, "-m", "pgrace", "clean", "--dsn", place.clean_dsn]
        )
        phase = self.when_sweeping(child, planted, linger=0.002)
        inside = self.child_of(child.proc.pid)  # unshare forks: pgrace is its child, PID 1 of the namespace
        phase = f"pid namespace {phase}"
        self.kill(f"{label}, {phase})", child, signum, phase, place.name, pid=inside)
        self.check_live(f"{label}, {phase})", live, prompt, live_object, place)
        self.check_dsn(f"{label}, {phase})", place, clean=True)

    def when_sweeping(self, child: Child, planted: list[str], linger: float = 0.01) -> str:
        """Wait until the child has removed some of the planted leftovers (or ended), then up to ``linger`` s more."""
        poll_until(lambda: child.proc.poll() is not None or len(self.remaining(planted)) < len(planted))
        time.sleep(self.rng.uniform(0, linger))
        left = len(self.remaining(planted))
        return "sweep" if 0 < left < len(planted) else "before sweep" if left == len(planted) else "after sweep"

    @staticmethod
    def child_of(pid: int) -> int:
        for _ in range(1000):
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    try:
                        if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                            return int(entry.name)
                    except (OSError, IndexError, ValueError):
                        continue
            time.sleep(0.001)
        return pid

    def check_live(self, label: str, live: Child, prompt: int | None, obj: str | None, place: Place) -> None:
        """The live run's scratch object survived, and the run finishes with every expectation holding."""
        if obj is not None and obj not in self.scratch_objects():
            self.tally.disturbed.append(f"{label}: the live run's {obj} was removed")
        while prompt is not None:
            live.enter()
            prompt = live.next_prompt()
        try:
            live.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            live.proc.kill()
            live.proc.wait()
        live.err_thread.join(timeout=5)
        if live.proc.returncode != 0:
            stderr = "".join(live.stderr).strip()[-300:]
            self.tally.disturbed.append(f"{label}: the live run exited {live.proc.returncode}: {stderr}")

    def plant(self, place: Place, count: int) -> list[str]:
        """Leftovers of runs that died: named as pgrace names them, nothing else (as after a SIGKILL)."""
        names = [scratch_name("planted") for _ in range(count)]
        if place.name == "schema":
            with psycopg.connect(place.clean_dsn, autocommit=True) as conn:
                for name in names:
                    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
                    conn.execute(sql.SQL("CREATE TABLE {}.t (id int)").format(sql.Identifier(name)))
        else:
            with psycopg.connect(self.dsn_server.dsn, autocommit=True) as admin:
                for name in names:
                    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return names

    def remaining(self, names: list[str]) -> list[str]:
        found = set(self.scratch_objects())
        return [name for name in names if name in found]

    def newest_scratch(self, place: Place) -> str | None:
        """The live run's scratch object: the one whose lock is held."""
        with psycopg.connect(self.user_dsn, autocommit=True) as conn:
            for name in self.scratch_objects():
                held = conn.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2"
                    " AND classid::bigint = %s AND objid::bigint = %s",
                    lock_key(name),
                ).fetchone()
                if held != (0,):
                    return name
        return None

    def drive(self, child: Child, variant: Variant, aim: str, where: str) -> str:
        """Answer prompts up to the aimed moment and return the phase the child is in."""
        if aim in ("startup", "setup"):
            if aim == "startup":  # anywhere from Python's start to the first prompt
                time.sleep(self.rng.uniform(0, self.first_prompt_s))
            else:  # once the server, or the scratch object, is there: starting, creating, setup SQL
                poll_until(lambda: child.proc.poll() is not None or self.resource_ready(child, where))
                time.sleep(self.rng.uniform(0, 0.03))
            child.drain()
            return "between steps" if any(PROMPT.search(line) for line in child.seen) else "setup"
        prompt = child.next_prompt()
        self.first_prompt_s = 0.8 * self.first_prompt_s + 0.2 * (time.monotonic() - child.started)
        if aim == "blocked step":
            waits, released = self.rng.choice(variant.blocked)
            prompt = self.advance(child, prompt, self.rng.randint(waits + 1, released))  # still blocked there
            return aim if prompt is not None else "teardown"
        if aim == "between steps":
            prompt = self.advance(child, prompt, self.rng.randint(1, variant.steps))
            return aim if prompt is not None else "teardown"
        last = variant.steps if aim == "teardown" else self.rng.randint(1, max(1, variant.steps - 1))
        if self.advance(child, prompt, last) is None:
            return "teardown"
        child.enter()
        sent = time.monotonic()
        if aim == "teardown":
            time.sleep(self.rng.uniform(0, self.teardown_s))
            if child.proc.poll() is not None:  # too late: aim a little earlier next time
                self.teardown_s = max(0.005, 0.8 * self.teardown_s + 0.2 * (time.monotonic() - sent) * 0.8)
            return "teardown"
        time.sleep(self.rng.uniform(0, 0.003))
        child.drain()
        return "between steps" if self._offered_after(child, last) else "mid-step"

    def resource_ready(self, child: Child, where: str) -> bool:
        if where != "embedded":
            return bool(self.scratch_objects())
        return any((d / "data").is_dir() for d in run_dirs(child.proc.pid))

    @staticmethod
    def _offered_after(child: Child, step: int) -> bool:
        """Whether the next step was offered already: the sent one had finished."""
        return any((m := PROMPT.search(line)) is not None and int(m.group(1)) > step for line in child.seen)

    @staticmethod
    def advance(child: Child, prompt: int | None, until: int) -> int | None:
        """Press Enter at every prompt before step ``until``; the prompt reached (None: the run ended)."""
        while prompt is not None and prompt < until:
            child.enter()
            prompt = child.next_prompt()
        return prompt

    # -- the parallel drivers --------------------------------------------------------------

    def parallel_round(self, index: int) -> None:
        driver = list(PARALLEL)[index % len(PARALLEL)]
        place = self.places[("embedded", "dsn")[index // len(PARALLEL) % 2]]
        signum = self.rng.choice(SIGNALS)
        argv = [sys.executable, "-m", "pgrace", *PARALLEL[driver], *place.args]
        if driver == "load" and place.name == "dsn" and self.dsn_server.bindir:
            argv += ["--pgbench", str(Path(self.dsn_server.bindir) / "pgbench")]
        env = {k: v for k, v in os.environ.items() if k != "PGRACE_DSN"}
        proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
        )
        aim = self.rng.choice(("startup", "workers"))
        if aim == "startup":
            time.sleep(self.rng.uniform(0, self.first_worker_s))
        else:
            started = time.monotonic()
            poll_until(lambda: proc.poll() is not None or bool(self.workers(proc.pid)), 60)
            self.first_worker_s = 0.8 * self.first_worker_s + 0.2 * (time.monotonic() - started)
            time.sleep(self.rng.uniform(0, 1.5))
        phase = f"{driver}: {'workers' if self.workers(proc.pid) else 'startup'}"
        run_dir = next(iter(run_dirs(proc.pid)), None)
        label = f"round {index} ({place.name}, {driver}, {signum.name}, {phase})"
        killed = proc.poll() is None
        sent = time.monotonic()
        if killed:
            with contextlib.suppress(ProcessLookupError):
                if signum == signal.SIGINT:
                    os.killpg(proc.pid, signum)  # Ctrl-C at a terminal reaches the whole group
                else:
                    proc.send_signal(signum)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.leftover(label, f"pgrace did not exit within 60 s after {signum.name}")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        took = time.monotonic() - sent
        if not poll_until(lambda: not session_processes(proc.pid) and not load_processes(proc.pid), 5):
            self.leftover(label, f"processes left: {session_processes(proc.pid) + load_processes(proc.pid)}")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        self.tally_parallel(label, driver, signum, phase, place.name, killed, proc.returncode, took, stderr)
        self.check_parallel(label, place, proc.pid, run_dir, signum)

    first_worker_s = 1.0  # measured as we go: spawn to the first worker process

    def workers(self, pid: int) -> list[str]:
        return [p for p in session_processes(pid) if any(mark in p for mark in WORKER_MARKS)] + load_processes(pid)

    def tally_parallel(
        self,
        label: str,
        driver: str,
        signum: signal.Signals,
        phase: str,
        where: str,
        killed: bool,
        code: int,
        took: float,
        stderr: str,
    ) -> None:
        if not killed:
            self.tally.finished_first += 1
            return
        self.tally.kills[where, signum.name, phase] += 1
        self.tally.exits[signum.name, code] += 1
        quiet_death = code == -signum and "pgrace:" not in stderr
        if code not in (EXPECTED_EXIT[signum], 0, 1) and not quiet_death:
            self.tally.notes.append(f"{label}: exit {code}: {stderr.strip()[-300:]}")
        if signum != signal.SIGKILL:
            self.tally.exit_s.setdefault(driver, []).append(took)
            if took > EXIT_WITHIN_S:
                self.tally.slow.append(f"{label}: exited {took:.2f} s after {signum.name}")
            if stderr.count("\n") > 1 and "Traceback" not in stderr:  # a traceback is tallied below
                self.tally.notes.append(f"{label}: more than one line on stderr: {stderr.strip()[-600:]}")
        if "Traceback" in stderr:
            self.tally.tracebacks[traceback_kind(stderr)] += 1
            if traceback_kind(stderr) == "elsewhere":
                self.tally.notes.append(f"{label}: traceback on stderr: {stderr.strip()[-600:]}")
        if self.verbose:
            print(f"{label}: exit {code} in {took:.2f} s {stderr.strip()[:120]}", flush=True)

    def check_parallel(self, label: str, place: Place, pid: int, run_dir: Path | None, signum: signal.Signals) -> None:
        """Nothing of the child's left; after SIGKILL, once ``pgrace clean`` has run."""
        if run_dir is not None:
            self.check_swept(label)  # it started a server: that swept what earlier killed runs left
        if signum == signal.SIGKILL:
            self.unswept.extend(run_dirs(pid))  # the next embedded server start removes them
        else:
            for directory in run_dirs(pid):
                self.leftover(label, f"run directory {directory} still there after {signum.name}")
        self.check_dsn(label, self.places["dsn"], clean=signum == signal.SIGKILL)
        if roles := self.scratch_roles():
            self.leftover(label, f"scratch roles left: {roles}")
            self.drop_roles(roles)
        for directory in load_work_dirs(pid):
            self.leftover(label, f"load work directory {directory} left")
            shutil.rmtree(directory, ignore_errors=True)

    def scratch_roles(self) -> list[str]:
        with psycopg.connect(self.user_dsn, autocommit=True) as admin:
            rows = admin.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE 'pgrace\\_%'").fetchall()
        return [str(name) for (name,) in rows]

    def drop_roles(self, roles: list[str]) -> None:
        with psycopg.connect(self.user_dsn, autocommit=True) as admin:
            for role in roles:
                with contextlib.suppress(psycopg.Error):
                    admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))

    # -- what must not be left -------------------------------------------------------------

    def leftover(self, index: int | str, what: str) -> None:
        self.tally.leftovers.append(f"{index}: {what}")
        print(f"LEFTOVER {index}: {what}", flush=True)

    def check_embedded(
        self, label: str, pid: int, run_dir: Path | None, postmaster: int | None, signum: signal.Signals
    ) -> None:
        if postmaster is not None and not poll_until(lambda: not alive(postmaster)):
            self.leftover(label, f"postmaster {postmaster} still alive")
        if run_dir is not None:  # this run got its server: it swept what earlier killed runs left
            self.check_swept(label)
        for directory in run_dirs(pid):
            if not poll_until(lambda d=directory: not processes_in(d)):
                self.leftover(label, f"processes still working in {directory}: {processes_in(directory)}")
            if signum == signal.SIGKILL:
                self.unswept.append(directory)  # the next embedded run removes it
            else:
                self.leftover(label, f"run directory {directory} still there after {signum.name}")

    def check_swept(self, label: str) -> None:
        for directory in self.unswept:
            if directory.exists():
                self.leftover(label, f"{directory} of a SIGKILLed run was not swept by the next run")
        self.unswept = []

    def scratch_objects(self) -> list[str]:
        """Every pgrace-looking database of the server and schema of the user database."""
        if self.watcher is None or self.watcher.closed:  # one connection for polling: fast enough to see a sweep
            self.watcher = psycopg.connect(self.user_dsn, autocommit=True)
        rows = self.watcher.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'pgrace\\_%'"
            " UNION ALL SELECT nspname FROM pg_namespace WHERE nspname LIKE 'pgrace\\_%'"
        ).fetchall()
        return [str(r[0]) for r in rows]

    def user_tables(self) -> list[tuple[object, ...]]:
        with psycopg.connect(self.user_dsn, autocommit=True) as conn:
            return [
                (name, *row)
                for name in USER_TABLES
                for row in conn.execute(
                    sql.SQL("SELECT count(*), md5(string_agg(t::text, ',' ORDER BY t::text)) FROM {} t").format(
                        sql.Identifier("public", name)
                    )
                ).fetchall()
            ]

    def check_dsn(self, label: str, place: Place, clean: bool) -> None:
        """No backend, lock or pgrace lock holder left; after one ``pgrace clean`` (if asked), no scratch object."""
        with psycopg.connect(self.user_dsn, autocommit=True) as admin:

            def backends() -> list[tuple[int, str]]:
                return admin.execute(
                    "SELECT pid, application_name FROM pg_stat_activity"
                    " WHERE application_name LIKE 'pgrace/%' AND pid <> pg_backend_pid()"
                ).fetchall()

            def holders() -> int:
                row = admin.execute(PGRACE_LOCKS, (lock_key("")[0],)).fetchone()
                return row[0] if row else 0

            if not poll_until(lambda: not backends()):
                self.leftover(label, f"backends left: {backends()}")
            if not poll_until(lambda: holders() == 0):  # a SIGKILLed run's admin backend ends when it notices
                self.leftover(label, f"pgrace lock holders left: {holders()}")
            locks = admin.execute(
                "SELECT l.pid, l.locktype, l.mode FROM pg_locks l WHERE l.pid IS DISTINCT FROM pg_backend_pid()"
            ).fetchall()
            if locks:
                self.leftover(label, f"locks held: {locks}")
        if clean:
            subprocess.run(
                [sys.executable, "-m", "pgrace", "clean", "--dsn", place.clean_dsn],
                capture_output=True,
                check=True,
            )
        if left := self.scratch_objects():
            unrecognised = [name for name in left if not is_scratch_name(name)]
            if unrecognised:
                self.tally.unrecognised.append(f"{label}: {unrecognised}")
            self.leftover(label, f"scratch objects left: {self.describe_scratch()}")
            self.drop_scratch()  # reported once; the next rounds start clean
        if self.user_tables() != self.user_rows:
            self.leftover(label, "the user's tables changed")

    def describe_scratch(self) -> list[tuple[object, ...]]:
        """Each leftover database with whoever is still connected to it, and each leftover schema."""
        with psycopg.connect(self.user_dsn, autocommit=True) as admin:
            return admin.execute(
                "SELECT d.datname, ARRAY(SELECT a.pid || ' ' || a.application_name || ' ' || coalesce(a.state, '')"
                "       FROM pg_stat_activity a WHERE a.datname = d.datname)"
                " FROM pg_database d WHERE d.datname LIKE 'pgrace\\_%'"
                " UNION ALL SELECT nspname, NULL FROM pg_namespace WHERE nspname LIKE 'pgrace\\_%'"
            ).fetchall()

    def drop_scratch(self) -> None:
        with psycopg.connect(self.user_dsn, autocommit=True) as admin:
            for (name,) in admin.execute("SELECT datname FROM pg_database WHERE datname LIKE 'pgrace\\_%'").fetchall():
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            for (name,) in admin.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'pgrace\\_%'").fetchall():
                admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))

    def finish(self) -> None:
        """Sweep what the last SIGKILLed embedded runs left, with one more run."""
        if self.unswept:
            subprocess.run([sys.executable, "-m", "pgrace", "run", "nowait"], capture_output=True, check=False)
            self.check_swept("final sweep")


@contextmanager
def user_database(server: ServerInfo) -> Iterator[str]:
    """A user's database full of look-alike tables, and a role without CREATEDB; yields the role's DSN."""
    with psycopg.connect(server.dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN NOCREATEDB PASSWORD {}").format(sql.Identifier(ROLE), sql.Literal(PASSWORD))
        )
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(USER_DB)))
        admin.execute(
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(USER_DB), sql.Identifier(ROLE))
        )
    with psycopg.connect(make_conninfo(server.dsn, dbname=USER_DB), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pgrowlocks")  # the user installed it: row-lock expectations hold
        for name in USER_TABLES:
            table = sql.Identifier("public", name)
            conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text)").format(table))
            conn.execute(
                sql.SQL("INSERT INTO {} SELECT g, 'user row ' || g FROM generate_series(1, 9) g").format(table)
            )
    yield make_conninfo(server.dsn, dbname=USER_DB, user=ROLE, password=PASSWORD)


def report(tally: Tally, seconds: float) -> None:
    kills = sum(tally.kills.values())
    print(f"\n{kills} kills in {seconds:.0f} s ({tally.finished_first} runs finished before their signal)")
    for title, key in (("server", 0), ("signal", 1), ("phase", 2)):
        counts: Counter[str] = Counter()
        for parts, n in tally.kills.items():
            counts[parts[key]] += n
        print(f"  per {title}: " + ", ".join(f"{name} {n}" for name, n in sorted(counts.items())))
    print("  signal × phase:")
    phases = sorted({p for _, _, p in tally.kills})
    width = max(15, *(len(p) + 2 for p in phases))
    print("    " + " " * 8 + "".join(f"{p:>{width}}" for p in phases))
    for sig in ("SIGINT", "SIGTERM", "SIGKILL"):
        row = [sum(n for (_, s, p), n in tally.kills.items() if s == sig and p == phase) for phase in phases]
        print(f"    {sig:<8}" + "".join(f"{n:>{width}}" for n in row))
    exits = ", ".join(f"{sig} → {code} ×{n}" for (sig, code), n in sorted(tally.exits.items()))
    print(f"  exit statuses: {exits}")
    for kind, n in sorted(tally.tracebacks.items()):
        print(f"  Python traceback on stderr {kind}: {n}")
    for note in tally.notes:
        print(f"  note: {note}")
    for driver, times in sorted(tally.exit_s.items()):
        print(f"  {driver}: {len(times)} SIGINT/SIGTERM exits, slowest {max(times):.2f} s, median {median(times):.2f}")
    if tally.exit_s:
        every = [t for times in tally.exit_s.values() for t in times]
        print(f"slowest SIGINT/SIGTERM exit of a parallel driver: {max(every):.2f} s")
    print(f"exits slower than {EXIT_WITHIN_S:.0f} s: {len(tally.slow)}")
    for item in tally.slow:
        print(f"  {item}")
    print(f"leftovers: {len(tally.leftovers)}")
    for item in tally.leftovers:
        print(f"  {item}")
    print(f"objects left unrecognised: {len(tally.unrecognised)}")
    for item in tally.unrecognised:
        print(f"  {item}")
    print(f"live runs disturbed: {len(tally.disturbed)}")
    for item in tally.disturbed:
        print(f"  {item}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--kills", type=int, default=300, help="kills to make (default 300)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: time)")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per round")
    parser.add_argument(
        "--drivers",
        choices=("run", "parallel", "all"),
        default="all",
        help="run --step rounds, the parallel drivers' rounds (explore -j, sweep, load, check), or both (default)",
    )
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int(time.time())
    print(f"seed {seed}", flush=True)
    rng = random.Random(seed)
    started = time.monotonic()
    with open_server("embedded") as server, user_database(server) as role_dsn:
        bench = Bench(server, role_dsn, learn(server) if args.drivers != "parallel" else [], rng, args.verbose)
        index = 0
        while sum(bench.tally.kills.values()) < args.kills:
            if args.drivers == "run" or (args.drivers == "all" and index % 2 == 0):
                bench.round(index if args.drivers == "run" else index // 2)
            else:
                bench.parallel_round(index if args.drivers == "parallel" else index // 2)
            index += 1
        bench.finish()
        for place in ("dsn", "schema"):  # one last clean of each place: nothing may be left, all recognised
            bench.check_dsn("final clean", bench.places[place], clean=True)
    report(bench.tally, time.monotonic() - started)
    failed = bench.tally.leftovers or bench.tally.unrecognised or bench.tally.disturbed or bench.tally.slow
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
