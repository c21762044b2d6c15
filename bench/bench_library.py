"""The shipped library: byte-stable, fast, and proven over every interleaving.

1. Determinism and speed: `pgrace check --golden` on every file in scenarios/ REPEAT times (default
   20) on the embedded server and on Debian's PostgreSQL 15 (when installed); every run must
   pass (its timeline equal to the golden file), and each variant's time is reported (max,
   mean): a warm run must stay under 1 s.
2. Proof: `pgrace check --explore` on each file, every interleaving (the test suite only
   samples 12): each bug reproduces in some order, each cure holds in all.

    python bench/bench_library.py [REPEAT]
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG15 = Path("/usr/lib/postgresql/15/bin")
PATHS = [str(path) for path in sorted((ROOT / "scenarios").glob("*.toml"))]  # the whole shipped library
LINE = re.compile(r"^(PASS|FAIL)\s+(\S+ \((?:bug|fix)\))\s+.*\((\d+\.\d+) s\)$")


def pgrace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pgrace", *args], capture_output=True, text=True, cwd=ROOT)


def determinism(server: list[str], label: str, repeat: int) -> bool:
    times: dict[str, list[float]] = defaultdict(list)
    failures = 0
    for _ in range(repeat):
        done = pgrace("check", "--golden", *PATHS, *server)
        if done.returncode != 0:
            failures += 1
            print(done.stdout[-2000:], done.stderr[-2000:])
        for line in done.stdout.splitlines():
            if m := LINE.match(line):
                times[m[2]].append(float(m[3]))
    print(f"\n{label}: {repeat} runs of `pgrace check --golden`, {failures} failed")
    print(f"  {'variant':40} {'max s':>7} {'mean s':>7}")
    for variant, seconds in sorted(times.items()):
        print(f"  {variant:40} {max(seconds):7.2f} {sum(seconds) / len(seconds):7.2f}")
    slow = [v for v, s in times.items() if sorted(s)[len(s) // 2] > 1.0]
    if slow:
        print(f"  median over 1 s: {', '.join(slow)}")
    return failures == 0 and not slow


def proof() -> bool:
    started = time.perf_counter()
    done = pgrace("check", "--explore", *PATHS)
    print(f"\n`pgrace check --explore`, every interleaving ({time.perf_counter() - started:.1f} s):")
    print(done.stdout)
    return done.returncode == 0


def main() -> int:
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    ok = determinism([], "embedded", repeat)
    if (PG15 / "postgres").exists():
        ok = determinism(["--server", str(PG15)], "PostgreSQL 15", repeat) and ok
    ok = proof() and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
