"""Startup: `pgrace run lost-update` against `python -c "import psycopg, click"`, side by side.

Usage: ``python bench/bench_startup.py [--runs N]``

The two commands alternate N times in one run, so a busy machine slows both alike; the
medians and their ratio are printed. Both run with bytecode cached, as a user's do:
``PYTHONDONTWRITEBYTECODE`` is removed from the children's environment and
``PYTHONPYCACHEPREFIX`` points at a throwaway directory, filled by a first (untimed) run
of each command, so nothing is written into the source tree. The run uses the embedded
server with its cache (the template) as it is; the warm-up builds it when missing.

Each command's CPU time (user + system, of the whole process tree: pgrace's server and its
backends included) is printed too, and the fastest run of each: on a busy machine of two
cores the medians move with the load, the fastest runs much less.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL = 1.5  # the ratio pgrace's own work may add to the imports it cannot avoid


def pgrace_command() -> list[str]:
    """The ``pgrace`` console script of this interpreter, as a user types it; else ``python -m pgrace``."""
    script = Path(sys.executable).parent / "pgrace"
    prefix = [str(script)] if script.exists() else [sys.executable, "-m", "pgrace"]
    return [*prefix, "run", "lost-update"]


BASELINE = [sys.executable, "-c", "import psycopg, click"]


def cpu() -> float:
    """CPU seconds of every child process ended so far (their own children included once reaped)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``command``."""
    cpu_before = cpu()
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr}")
    return elapsed, cpu() - cpu_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs of each command (default 20)")
    args = parser.parse_args()
    pgrace = pgrace_command()
    prefix = tempfile.mkdtemp(prefix="pgrace-bench-pycache-")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PGRACE_DSN")}
    env["PYTHONPYCACHEPREFIX"] = prefix
    try:
        for command in (pgrace, BASELINE, pgrace, BASELINE):  # compile once into the prefix, then warm
            timed(command, env)
        ours: list[tuple[float, float]] = []
        base: list[tuple[float, float]] = []
        for _ in range(args.runs):
            ours.append(timed(pgrace, env))
            base.append(timed(BASELINE, env))
    finally:
        shutil.rmtree(prefix, ignore_errors=True)
    wall = statistics.median(w for w, _ in ours) / statistics.median(w for w, _ in base)
    fastest = min(w for w, _ in ours) / min(w for w, _ in base)
    shown = " ".join([Path(pgrace[0]).name, *pgrace[1:]])
    print(f"bytecode cached (PYTHONPYCACHEPREFIX), {args.runs} alternated runs each, medians:")
    for label, samples in ((shown, ours), ("python -c 'import psycopg, click'", base)):
        median_wall = statistics.median(w for w, _ in samples)
        median_cpu = statistics.median(c for _, c in samples)
        fastest_wall = min(w for w, _ in samples)
        print(f"  {label:34} {median_wall:.3f} s wall (fastest {fastest_wall:.3f} s), {median_cpu:.3f} s CPU")
    print(f"  ratio {wall:.2f}x of the medians (goal <= {GOAL}x), {fastest:.2f}x of the fastest runs")


if __name__ == "__main__":
    main()
