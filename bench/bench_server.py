"""How long the embedded server and scratch databases take: the fixed cost of every run.

Usage: ``python bench/bench_server.py [--cycles N]``

Measures, in a throwaway cache directory (``PGRACE_CACHE_DIR``) so the real cache is
neither used nor touched:

* *first start*: empty cache, so it includes copying the binaries (as root) and the
  initdb of the template, then start, connect, stop;
* *start-connect-stop*: the same with the template cached, which is what every
  ``pgrace run`` pays;
* *scratch create/drop*: one scratch database (with pgrowlocks) created and dropped on
  a running server, which is what every scenario pays.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import psycopg
from tabulate import tabulate

from pgrace.scratch import scratch_database
from pgrace.servers.embedded import CACHE_ENV_VAR, embedded_server


def start_connect_stop() -> None:
    with embedded_server() as info, psycopg.connect(info.dsn) as conn:
        conn.execute("SELECT 1").fetchone()


def timed(action: Callable[[], None], times: int) -> list[float]:
    samples = []
    for _ in range(times):
        start = time.perf_counter()
        action()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def row(what: str, samples: list[float]) -> list[object]:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return [what, len(samples), statistics.median(samples), p90, ordered[0]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=20, help="repetitions of each cached measurement")
    args = parser.parse_args()

    # World-traversable: as root the server runs as another user, who must reach the cache.
    workdir = tempfile.mkdtemp(prefix="pgrace-bench-")
    os.chmod(workdir, 0o755)
    previous = os.environ.get(CACHE_ENV_VAR)
    try:
        first: list[float] = []
        for attempt in range(3):
            os.environ[CACHE_ENV_VAR] = os.path.join(workdir, f"cache-{attempt}")
            first += timed(start_connect_stop, 1)
        cached = timed(start_connect_stop, args.cycles)

        with embedded_server() as info:

            def scratch_cycle() -> None:
                with scratch_database(info, "bench") as db:
                    assert db.has_pgrowlocks

            scratch = timed(scratch_cycle, args.cycles)
    finally:
        if previous is None:
            os.environ.pop(CACHE_ENV_VAR, None)
        else:
            os.environ[CACHE_ENV_VAR] = previous
        shutil.rmtree(workdir, ignore_errors=True)

    print(
        tabulate(
            [
                row("first start (empty cache)", first),
                row("start-connect-stop (cached)", cached),
                row("scratch create/drop", scratch),
            ],
            headers=["measurement", "n", "median ms", "p90 ms", "min ms"],
            floatfmt=".1f",
        )
    )
    print(f"\nembedded PostgreSQL {info.version}, running as uid {os.geteuid()}")


if __name__ == "__main__":
    main()
