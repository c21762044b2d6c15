"""explore_code against pgrace explore: the two-withdrawal example, side by side in one run.

The issue's bound: exploring the application's two ``withdraw()`` calls (pgrace.drivers.code,
examples/code/withdraw_psycopg.py) costs no more than 3× exploring the same statements
written as a scenario file (bench/code/two-withdrawals.toml) with ``pgrace explore``.
Both include their scratch database; they alternate, REPEAT times, on one embedded server;
the cost is per exploration (the whole space each: 20 interleavings for the file, the
distinct schedules for the code, where a blocked session is no choice), and the ratio
of the medians is what counts (the machine is shared: seconds alone mean little).

    python bench/bench_code.py [REPEAT]
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from pathlib import Path

from pgrace.drivers.code import explore_code
from pgrace.drivers.explore import explore
from pgrace.frontends import catalog
from pgrace.servers import open_server

HERE = Path(__file__).resolve().parent
BOUND = 3.0


def main() -> int:
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    spec = importlib.util.spec_from_file_location("withdraw_psycopg", HERE.parent / "examples/code/withdraw_psycopg.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    scenario = catalog.read_scenario(str(HERE / "code" / "two-withdrawals.toml"))
    sessions = {"alice": example.withdraw, "bob": example.withdraw}
    with open_server("embedded") as server:
        explore(scenario, server)  # warm up both
        explore_code(sessions, setup=example.SETUP, final=example.FINAL, server=server)
        files, codes = [], []
        for _ in range(repeat):
            started = time.perf_counter()
            by_file = explore(scenario, server)
            files.append(time.perf_counter() - started)
            started = time.perf_counter()
            by_code = explore_code(sessions, setup=example.SETUP, final=example.FINAL, server=server)
            codes.append(time.perf_counter() - started)
    file_finals = sorted(c.final[0] for c in by_file.classes)
    code_finals = sorted(c.final[0] for c in by_code.classes)
    print(f"pgrace explore  {scenario.name}: {by_file.explored} interleavings, finals {file_finals}")
    print(f"explore_code    withdraw ×2: {by_code.explored} schedules, finals {code_finals}")
    file_s, code_s = statistics.median(files), statistics.median(codes)
    ratio = code_s / file_s
    print(f"median of {repeat}: scenario file {file_s * 1000:.0f} ms, code {code_s * 1000:.0f} ms")
    print(f"ratio code / file: {ratio:.2f} (bound {BOUND:g}×) {'ok' if ratio <= BOUND else 'TOO SLOW'}")
    return 0 if ratio <= BOUND else 1


if __name__ == "__main__":
    sys.exit(main())
