"""End to end: `pgrace run lost-update` as a user types it, embedded server included.

Measures the very first run (empty cache: the PostgreSQL tree is copied and the
template cluster built) and RUNS runs with the template cached. Each run is a fresh
process, so Python start-up and imports count too.

    python bench/bench_end_to_end.py [RUNS]
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PGRACE = [sys.executable, "-m", "pgrace", "run", "lost-update"]


def timed(env: dict[str, str]) -> float:
    started = time.perf_counter()
    result = subprocess.run(PGRACE, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"pgrace failed ({result.returncode}): {result.stderr}")
    return elapsed


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    env = {k: v for k, v in os.environ.items() if k != "PGRACE_DSN"}
    # A cache directory the unprivileged server user can read, as the real one is.
    cache = Path(tempfile.mkdtemp(prefix="pgrace-bench-cache-", dir="/var/tmp"))
    cache.chmod(0o755)
    try:
        first = timed({**env, "PGRACE_CACHE_DIR": str(cache)})
        cached = [timed({**env, "PGRACE_CACHE_DIR": str(cache)}) for _ in range(runs)]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"first run (cache built):  {first:.2f} s")
    print(
        f"cached runs (n={runs}):    median {statistics.median(cached):.3f} s, "
        f"min {min(cached):.3f} s, max {max(cached):.3f} s"
    )


if __name__ == "__main__":
    main()
