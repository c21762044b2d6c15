"""from-log's speed and memory on a big server log: at least 50 MB/s, at most 128 MiB, whatever the size.

Generates a stderr log of SIZE (default 1 GB) in a temporary directory: a busy server's
lines (log_statement = all from 200 backends, durations, connections) with the real
deadlock of examples/from-log/deadlock.log spliced in INCIDENTS times (default 20,000),
evenly, each with pids of its own. Then, in a child process, a plain Python loop over the
file's lines (the baseline), a ``bytes.find`` scan of it (``records.scan``), ``pgrace
from-log --list`` and ``from_log`` writing the last incident's scenario, and reports their
throughput (wall clock and CPU time: on a machine others load, the CPU time and the ratios
to the baseline are the figures that hold) and the child's own peak RSS (``VmHWM``, see
tools/memory.py). The log is deleted afterwards.

    python bench/bench_from_log.py [SIZE_MB [INCIDENTS]]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "from-log" / "deadlock.log"
MIN_MB_S = 50.0
MAX_RSS_MIB = 128.0

CHILD = """
import json, sys, time
from pgrace.drivers.fromlog import from_log
from pgrace.drivers.fromlog.records import scan
from tools.memory import peak_mib
cpu = time.process_time()
with open(sys.argv[1], "rb") as f:
    for line in f:
        pass
looped_cpu = time.process_time() - cpu
started, cpu = time.perf_counter(), time.process_time()
scan(sys.argv[1])
scanned, scanned_cpu = time.perf_counter() - started, time.process_time() - cpu
started, cpu = time.perf_counter(), time.process_time()
found = from_log([sys.argv[1]], list_only=True)
listed, listed_cpu = time.perf_counter() - started, time.process_time() - cpu
listed_peak = peak_mib()
started = time.perf_counter()
written = from_log([sys.argv[1]], incident=len(found.incidents), verify=False)
wrote = time.perf_counter() - started
print(json.dumps({
    "found": len(found.incidents), "lines": found.lines, "looped_cpu": looped_cpu,
    "scanned": scanned, "scanned_cpu": scanned_cpu, "listed": listed, "listed_cpu": listed_cpu,
    "listed_peak": listed_peak, "wrote": wrote, "peak": peak_mib(),
}))
"""


def busy_block(seed: int) -> str:
    """About 1 MB of a busy server's log: statements of 200 backends, durations, connections."""
    lines = []
    for n in range(6000):
        pid = 10000 + (seed * 7 + n) % 200
        vxid = f"{pid % 97}/{seed * 6000 + n}"
        stamp = f"2026-12-01 10:{(seed // 60) % 60:02d}:{seed % 60:02d}.{n % 1000:03d} UTC"
        kind = n % 10
        if kind < 6:
            msg = (
                f"LOG:  statement: UPDATE orders SET status = 'shipped', updated_at = now() WHERE id = {n * 13 + seed}"
            )
        elif kind < 8:
            msg = f"LOG:  statement: SELECT id, status FROM orders WHERE customer_id = {n % 5000} ORDER BY id LIMIT 20"
        elif kind == 8:
            msg = f"LOG:  duration: {n % 97}.{n % 1000:03d} ms"
        else:
            msg = "LOG:  connection authorized: user=app database=shop application_name=web"
        lines.append(f"{stamp} [{pid}] web {vxid} {0 if n % 3 else 700 + n} {msg}\n")
    return "".join(lines)


def generate(path: Path, size: int, count: int) -> int:
    """Write the log; return how many incidents it holds."""
    incident = "".join(EXAMPLE.read_text().splitlines(keepends=True)[5:])  # the incident's lines
    every = max(1, size // count)
    written = incidents = 0
    with path.open("w") as f:
        seed = 0
        while written < size:
            block = busy_block(seed % 64)
            f.write(block)
            written += len(block)
            seed += 1
            while incidents < count and written // every > incidents:
                one = incident.replace("24914", str(400_000 + incidents)).replace("24915", str(600_000 + incidents))
                f.write(one)
                written += len(one)
                incidents += 1
    return incidents


def main() -> None:
    size = int(sys.argv[1]) << 20 if len(sys.argv) > 1 else 1 << 30
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
    with tempfile.TemporaryDirectory(prefix="pgrace-bench-from-log-") as tmp:
        log = Path(tmp) / "postgresql.log"
        started = time.perf_counter()
        expected = generate(log, size, count)
        actual = log.stat().st_size
        print(f"generated {actual / 1e6:,.0f} MB with {expected} deadlocks in {time.perf_counter() - started:.1f} s")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        out = json.loads(
            subprocess.run(
                [sys.executable, "-c", CHILD, str(log)], env=env, check=True, capture_output=True, text=True
            ).stdout
        )
        found, lines, listed, listed_cpu = out["found"], out["lines"], out["listed"], out["listed_cpu"]
        looped_cpu, scanned, scanned_cpu, peak_mib = out["looped_cpu"], out["scanned"], out["scanned_cpu"], out["peak"]
        mb = actual / 1e6
        mb_s = mb / listed_cpu
        print(f"Python line loop (baseline): CPU {looped_cpu:.2f} s ({mb / looped_cpu:,.0f} MB/s)")
        print(
            f"bytes.find scan: {scanned:.2f} s ({mb / scanned:,.0f} MB/s), CPU {scanned_cpu:.2f} s, "
            f"{scanned_cpu / looped_cpu:.1f} times the baseline's CPU"
        )
        print(
            f"--list: {found} incidents in {lines:,} lines, {listed:.2f} s ({mb / listed:,.0f} MB/s), "
            f"CPU {listed_cpu:.2f} s: {mb_s:,.0f} MB/s (floor {MIN_MB_S:.0f}), "
            f"{listed_cpu / looped_cpu:.1f} times the baseline's CPU, {listed_cpu / scanned_cpu:.1f} times the scan's"
        )
        print(f"writing the last incident's scenario: {out['wrote']:.2f} s ({mb / out['wrote']:,.0f} MB/s)")
        print(
            f"peak RSS of the child (VmHWM): {out['listed_peak']:.0f} MiB after --list, {peak_mib:.0f} MiB in all "
            f"(ceiling {MAX_RSS_MIB:.0f})"
        )
    ok = found == expected and mb_s >= MIN_MB_S and peak_mib <= MAX_RSS_MIB
    print("ok" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
