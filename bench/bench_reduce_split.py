"""The reduced search split in shards and processes: runs and seconds against one search.

Shards search prefixes of the space on their own, so equivalent runs under two prefixes
are each run: this says how many more runs 2, 3 and 4 shards take in all than one search,
what ``-j 2`` takes in seconds against ``-j 1``, and whether the classes are the same.

    python bench/bench_reduce_split.py [FILE ...]    # default: the two acceptance shapes
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pgrace.drivers.explore import explore
from pgrace.drivers.shards import merge_explorations
from pgrace.frontends import catalog
from pgrace.servers import open_server

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    files = sys.argv[1:] or [
        str(ROOT / "tests" / "explore" / "three-withdrawals.toml"),
        str(ROOT / "tests" / "explore" / "two-lost-updates.toml"),
    ]
    print("| scenario | how | runs | seconds | covers all | classes |")
    print("|---|---|---:|---:|---|---|")
    with open_server("embedded") as server:
        for path in files:
            scenario = catalog.read_scenario(path).variant_named(None)
            started = time.perf_counter()
            one = explore(scenario, server)
            seconds = time.perf_counter() - started
            keys = sorted(c.key for c in one.classes)
            name = scenario.name
            print(f"| {name} | one search | {one.run_count} | {seconds:.1f} | {one.covers_all} | {len(keys)} |")
            for n in (2, 3, 4):
                started = time.perf_counter()
                merged = merge_explorations([explore(scenario, server, shard=(k, n)) for k in range(1, n + 1)])
                seconds = time.perf_counter() - started
                same = "same" if sorted(c.key for c in merged.classes) == keys else "DIFFERENT"
                print(f"| | {n} shards | {merged.run_count} | {seconds:.1f} | {merged.covers_all} | {same} |")
            started = time.perf_counter()
            two = explore(scenario, server, jobs=2)
            seconds = time.perf_counter() - started
            same = "same" if sorted(c.key for c in two.classes) == keys else "DIFFERENT"
            print(f"| | -j 2 | {two.run_count} | {seconds:.1f} | {two.covers_all} | {same} |")


if __name__ == "__main__":
    main()
