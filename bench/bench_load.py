"""`pgrace load` on the embedded server: the SKIP LOCKED claim, and pgrace's overhead over bare pgbench.

1. Scaling: head-of-line-blocking's [load] (claim a job, 20 ms of simulated work inside the
   transaction, log the claim) at 1 and 8 clients, bug (FOR UPDATE LIMIT 1) and fix (SKIP
   LOCKED). The claim: at 8 clients the fix does >= 4x the bug's throughput, and >= 0.7 x 8 x
   its own 1-client throughput. The work is a sleep, so 2 shared cores are enough.
2. Overhead: the same emitted script (pgrace load --emit) run by bare pgbench (setup by
   psycopg, as psql would) and by pgrace load (which also samples pg_locks every 50 ms),
   alternated ROUNDS times; the ratio pgrace / bare of each pair, and the median.
   lost-update at 4 clients is the CPU-bound case (thousands of tps), skip-locked-fanout
   (fix) at 8 the sleep-bound one.

    python bench/bench_load.py [SECONDS] [ROUNDS]
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgrace.drivers.load import LoadOptions, emit, find_pgbench, run_load, setup_sql, threads_for
from pgrace.frontends import catalog
from pgrace.model.scenario import Scenario
from pgrace.scratch import scratch_database
from pgrace.servers import ServerInfo, open_server


def scaling(server: ServerInfo, seconds: int) -> bool:
    scenario = catalog.read_scenario("head-of-line-blocking")
    tps: dict[tuple[str, int], float] = {}
    for variant in (scenario, scenario.other):
        assert variant is not None
        result = run_load(variant, server, LoadOptions(clients=(1, 8), duration=seconds))
        for run in result.runs:
            tps[(variant.variant, run.clients)] = run.tps
            print(f"  {variant.variant} {run.clients} clients: {run.tps:8.1f} tps, lock waiters {run.lock_waiters_max}")
    vs_bug = tps[("fix", 8)] / tps[("bug", 8)]
    vs_linear = tps[("fix", 8)] / (8 * tps[("fix", 1)])
    print(f"  fix/bug at 8 clients: {vs_bug:.2f}x (claim >= 4)")
    print(f"  fix at 8 / (8 x fix at 1): {vs_linear:.2f} (claim >= 0.7)")
    return vs_bug >= 4 and vs_linear >= 0.7


def bare_pgbench(server: ServerInfo, scenario: Scenario, script: Path, clients: int, seconds: int) -> float:
    """The emitted script, run by pgbench alone in a fresh scratch database."""
    with scratch_database(server, f"bare_{scenario.name}") as db:
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            for text in setup_sql(scenario):
                conn.execute(text.encode())
        params = {k: str(v) for k, v in conninfo_to_dict(db.dsn).items() if v is not None}
        env = dict(os.environ)
        if "password" in params:
            env["PGPASSWORD"] = params.pop("password")
        argv = [find_pgbench(server), "-n", "-M", "extended", "-f", str(script), "-c", str(clients)]
        argv += ["-j", str(threads_for(clients)), "-T", str(seconds), make_conninfo(**params)]  # as pgrace load
        out = subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout
    match = re.search(r"^tps = ([0-9.]+)", out, re.MULTILINE)
    assert match, out
    return float(match.group(1))


def overhead(server: ServerInfo, name: str, fix: bool, clients: int, seconds: int, rounds: int) -> float:
    loaded = catalog.read_scenario(name)
    scenario = loaded.variant_named("fix" if fix else "bug")
    with tempfile.TemporaryDirectory() as work:
        script = emit(scenario, Path(work))[0]
        ratios = []
        for index in range(rounds):
            order = ("bare", "pgrace") if index % 2 == 0 else ("pgrace", "bare")  # alternate who goes first
            got: dict[str, float] = {}
            for who in order:
                if who == "bare":
                    got[who] = bare_pgbench(server, scenario, script, clients, seconds)
                else:
                    got[who] = run_load(scenario, server, LoadOptions(clients=(clients,), duration=seconds)).runs[0].tps
            ratios.append(got["pgrace"] / got["bare"])
            print(f"  {name} ({scenario.variant}) {clients} clients: bare {got['bare']:8.1f} tps,"
                  f" pgrace {got['pgrace']:8.1f} tps, ratio {ratios[-1]:.3f}")  # fmt: skip
    median = statistics.median(ratios)
    print(f"  median ratio pgrace / bare: {median:.3f} (claim: within 5%)")
    return median


def main() -> None:
    seconds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    with open_server() as server:
        print(f"server: {server.label}, {seconds} s per run")
        print("1. SKIP LOCKED against FOR UPDATE LIMIT 1, 20 ms of work per transaction")
        scales = scaling(server, seconds)
        print("2. pgrace load against bare pgbench running the emitted script")
        cpu = overhead(server, "lost-update", False, 4, seconds, rounds)
        sleepy = overhead(server, "skip-locked-fanout", True, 8, seconds, rounds)
    within = all(ratio >= 0.95 for ratio in (cpu, sleepy))
    print(f"claims hold: scaling {'yes' if scales else 'NO'}, overhead {'yes' if within else 'NO'}")
    sys.exit(0 if scales and within else 1)


if __name__ == "__main__":
    main()
