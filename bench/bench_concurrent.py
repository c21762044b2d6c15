"""Sixteen ``pgrace run`` processes at once against one server, in both scratch modes: all must be right.

Usage: ``python bench/bench_concurrent.py [--rounds 5] [--runs 16] [--seed S]``

Each round starts ``--runs`` runs together on one embedded server: half in schema mode
(``--allow-scratch-schema``, as a role without CREATEDB, in one shared user database full
of look-alike tables), half in database mode; a mix of shipped scenarios and isolation
specs from ``../shared/pg-isolation``. A run is right when a scenario's expectations hold
(exit 0) and a spec prints exactly its expected output. Then nothing may be left: no
scratch database or schema, no ``pgrace`` backend, and the user's tables unchanged.

Prints one line per round and exits 1 on any wrong run, traceback or leftover.
``tests/test_concurrent_runs.py`` runs one round of this.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgrace.drivers.speccheck import compare_output, expected_files
from pgrace.frontends import catalog
from pgrace.servers import ServerInfo, open_server

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "pg-isolation" / "specs"
# Two sessions each: sixteen runs stay within the server's 100 connections.
SPECS = ("nowait", "skip-locked", "simple-write-skew", "deadlock-simple", "lock-nowait", "fk-contention")
SCENARIOS = (("lost-update", "bug"), ("lost-update", "fix"), ("nowait", "bug"), ("nowait", "fix"))
DATABASE = "concurrent_shop"
ROLE = "concurrent_clerk"
PASSWORD = "c0ncurrent-pw"


@dataclass(frozen=True)
class Job:
    """One run: what, in which mode, and the command line."""

    label: str
    argv: tuple[str, ...]
    spec: Path | None


@contextmanager
def user_database(server: ServerInfo) -> Iterator[tuple[str, str]]:
    """A user's database with tables named like the runs', and a role that may not create databases.

    Yields (the superuser's DSN of it, the role's DSN of it).
    """
    with psycopg.connect(server.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(ROLE)))
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN NOCREATEDB PASSWORD {}").format(sql.Identifier(ROLE), sql.Literal(PASSWORD))
        )
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
        admin.execute(
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(DATABASE), sql.Identifier(ROLE))
        )
    owner = make_conninfo(server.dsn, dbname=DATABASE)
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pgrowlocks")
        for name in ("accounts", "jobs", "foo", "bar", "test", "parent", "child", "t"):
            conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text)").format(sql.Identifier(name)))
            conn.execute(
                sql.SQL("INSERT INTO {} SELECT g, 'user row ' || g FROM generate_series(1, 10) g").format(
                    sql.Identifier(name)
                )
            )
    try:
        yield owner, make_conninfo(owner, user=ROLE, password=PASSWORD)
    finally:
        with psycopg.connect(server.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(ROLE)))


def jobs(count: int, rng: random.Random, owner_dsn: str, role_dsn: str) -> list[Job]:
    """``count`` runs, half in each mode, scenarios and specs mixed."""
    made = []
    for index in range(count):
        schema_mode = index % 2 == 0
        where = ["--allow-scratch-schema", "--dsn", role_dsn] if schema_mode else ["--dsn", owner_dsn]
        mode = "schema" if schema_mode else "database"
        if index % 4 < 2 and CORPUS.is_dir():
            spec = CORPUS / f"{rng.choice(SPECS)}.spec"
            argv = ("run", str(spec), "--format", "isolation", *where)
            made.append(Job(f"{mode} mode: {spec.name}", argv, spec))
        else:
            name, variant = rng.choice(SCENARIOS)
            argv = ("run", name, f"--{variant}", *where)
            made.append(Job(f"{mode} mode: {name} --{variant}", argv, None))
    return made


def state(owner_dsn: str) -> tuple[object, ...]:
    """What must be as it was, or gone, after the runs: user rows, scratch objects, pgrace backends."""
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r'"
            " ORDER BY 1"
        ).fetchall()
        rows = [
            conn.execute(
                sql.SQL("SELECT count(*), md5(string_agg(t::text, ',' ORDER BY t::text)) FROM {} t").format(
                    sql.Identifier(name)
                )
            ).fetchone()
            for (name,) in tables
        ]
        scratch = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'pgrace%'"
            " UNION ALL SELECT datname FROM pg_database WHERE datname LIKE 'pgrace%'"
        ).fetchall()
        backends = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name LIKE 'pgrace/%' OR application_name LIKE 'isolation/%'"
        ).fetchone()
    return tables, rows, scratch, backends


def run_round(jobs: Sequence[Job], owner_dsn: str) -> tuple[int, list[str]]:
    """Start every job at once; how many were right, and what went wrong (nothing left, user data intact)."""
    before = state(owner_dsn)
    env = {k: v for k, v in os.environ.items() if k != "PGRACE_DSN"}
    env["NO_COLOR"] = "1"
    started = [
        (
            job,
            subprocess.Popen(
                [sys.executable, "-m", "pgrace", *job.argv],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            ),
        )
        for job in jobs
    ]
    problems: list[str] = []
    right = 0
    for job, proc in started:
        found = len(problems)
        stdout, stderr = proc.communicate(timeout=300)
        if "Traceback" in stderr or "Traceback" in stdout:
            problems.append(f"{job.label}: traceback: {stderr.strip()[-400:]}")
        elif proc.returncode != 0:
            problems.append(f"{job.label}: exit {proc.returncode}: {stderr.strip()[-400:]}")
        elif job.spec is not None:
            compared = compare_output(stdout, expected_files(job.spec), actual_name="pgrace")
            if compared.matched is None:
                problems.append(f"{job.label}: output differs from {compared.closest.name}:\n{compared.diff[:600]}")
        right += len(problems) == found
    after = state(owner_dsn)
    if after[:2] != before[:2]:
        problems.append("the user's tables changed")
    if after[2]:
        problems.append(f"scratch objects left: {after[2]}")
    if after[3] != (0,):
        problems.append(f"pgrace backends left: {after[3]}")
    return right, problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of concurrent runs (default 5)")
    parser.add_argument("--runs", type=int, default=16, help="runs started together per round (default 16)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: time)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    print(f"seed {seed}; {args.runs} runs at once, {args.rounds} rounds", flush=True)
    failed = 0
    with open_server("embedded") as server, user_database(server) as (owner, role):
        catalog.shipped_names()  # fail early without the shipped scenarios
        for index in range(args.rounds):
            batch = jobs(args.runs, rng, owner, role)
            began = time.monotonic()
            right, problems = run_round(batch, owner)
            print(f"round {index + 1}: {right}/{args.runs} right in {time.monotonic() - began:.1f} s", flush=True)
            for problem in problems:
                print(f"  {problem}", flush=True)
            failed += bool(problems)
    print(f"{args.rounds - failed}/{args.rounds} rounds with every run right and nothing left")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
