"""Wait-detection latency: from sending a step to recording it as waiting.

Runs one scenario with ROUNDS rounds of "a locks row 1, b updates row 1 (waits),
a commits", on the embedded PostgreSQL (or PGRACE_DSN), and reports the latency
distribution over every wait. PostgreSQL's isolationtester polls every 10 ms.

    python bench/bench_wait_detection.py [ROUNDS]
"""

from __future__ import annotations

import statistics
import sys
import time

from pgrace import api
from pgrace.engine.options import RunOptions
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.servers import open_server

ROUND = """
[[step]]
session = "a"
sql = "BEGIN; UPDATE t SET v = v + 1 WHERE id = 1"
[[step]]
session = "b"
sql = "UPDATE t SET v = v + 1 WHERE id = 1"
expect = {{ waits = true }}
[[step]]
session = "a"
sql = "COMMIT"
"""


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 320
    text = (
        'setup = "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0)"\n'
        'sessions = ["a", "b"]\n' + ROUND.format() * rounds
    )
    scenario = parse_toml_scenario(text, "bench-wait-detection.toml")
    with open_server() as server:
        for track in (False, True):
            started = time.perf_counter()
            run = api.run(scenario, server=server, options=RunOptions(track_row_locks=track))
            wall = time.perf_counter() - started
            latencies = [s.wait_detected_ms - s.started_ms for s in run.step_runs() if s.wait_detected_ms is not None]
            assert run.ok and len(latencies) == rounds, "every round must be seen waiting"
            print(
                f"waits={len(latencies)} row-lock tracking={'on ' if track else 'off'} "
                f"median={statistics.median(latencies):.3f} ms p90={percentile(latencies, 90):.3f} ms "
                f"p99={percentile(latencies, 99):.3f} ms max={max(latencies):.3f} ms "
                f"(run: {wall:.2f} s for {len(run.step_runs())} steps)"
            )


if __name__ == "__main__":
    main()
