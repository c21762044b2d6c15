"""A bigger fuzz campaign than `make test`'s: the same properties, SCALE times the examples.

The suite's fuzz tests (tests/test_fuzz_parsers.py and tests/test_fuzz_cli.py) run
about 15,000 inputs: hostile scenario and spec files (deep nesting, huge dotted keys,
NUL and control characters, invalid UTF-8, files past 1 MiB, long lines), random ``-p``
and option values for every command, and a sample of runs on a real server. Each input
must end in a documented exit code (or a located ScenarioError) within its deadline,
with no traceback. This runs them SCALE times over (default 10, about 160,000 inputs)
and prints the count and the time.

    python bench/bench_fuzz.py [SCALE]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/test_fuzz_parsers.py", "tests/test_fuzz_cli.py"]
PER_SCALE = {  # the examples each fuzz test runs at scale 1 (their fuzz_settings defaults)
    "parsers: malformed .toml": 3000,
    "parsers: malformed .spec": 3000,
    "parsers: hostile .toml": 2000,
    "parsers: hostile .spec": 2000,
    "cli: show": 1500,
    "cli: run (no server)": 1500,
    "cli: check (no server)": 500,
    "cli: explore (no server)": 500,
    "cli: sweep (no server)": 500,
    "cli: clean, list, matrix (no server)": 900,
    "cli: run on the server": 20,
}


def main() -> int:
    scale = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    env = {**os.environ, "PGRACE_FUZZ_SCALE": str(scale)}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-show-statistics", *TESTS],
        cwd=ROOT,
        env=env,
        check=False,
    )
    took = time.perf_counter() - started
    total = 0
    for name, count in PER_SCALE.items():
        inputs = max(1, int(count * scale))
        total += inputs
        print(f"  {name:<32} {inputs:>9,} inputs")
    verdict = "0 tracebacks, 0 hangs, only documented exit codes" if done.returncode == 0 else "FAILED (see above)"
    print(f"fuzz at scale {scale:g}: {total:,} inputs in {took:.0f} s: {verdict}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
