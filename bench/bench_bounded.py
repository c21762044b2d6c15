"""Bounded searches: runs and seconds of --max-preemptions K and --pct D, against the complete reduced search.

For the shipped lost update, deadlock and write skew (bug variants), three withdrawals (3
sessions x 4 steps) and two independent lost updates (4 x 4, 63,063,000 interleavings),
runs the reduced search (every interleaving covered: the outcome classes there are) and
then each bound, and says how many of those classes the bound found.

    python bench/bench_bounded.py [MAX_K]      # default 3: K = 0 … 3 and D = 1 … 3 (100 schedules each)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pgrace.drivers.explore import explore
from pgrace.drivers.searches import REDUCED, Pct, PreemptionBounded, SearchMode
from pgrace.frontends import catalog
from pgrace.model.exploration import Exploration
from pgrace.servers import ServerInfo, open_server

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [
    "lost-update",
    "deadlock-transfer",
    "write-skew",
    str(ROOT / "tests" / "explore" / "three-withdrawals.toml"),
    str(ROOT / "tests" / "explore" / "two-lost-updates.toml"),
]


def timed(server: ServerInfo, name: str, search: SearchMode = REDUCED) -> tuple[Exploration, float]:
    scenario = catalog.read_scenario(name).variant_named(catalog.read_scenario(name).variants[0])
    started = time.perf_counter()
    found = explore(scenario, server, search=search)
    return found, time.perf_counter() - started


def main() -> None:
    max_k = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print("| scenario | interleavings | search | runs | s | classes found (of the complete search's) | guarantee |")
    print("|---|---:|---|---:|---:|---|---|")
    with open_server("embedded") as server:
        for name in SHAPES:
            whole, whole_s = timed(server, name)
            keys = {c.key for c in whole.classes}
            label = Path(name).stem
            print(
                f"| {label} | {whole.space:,} | reduced (complete) | {whole.run_count:,} | {whole_s:.1f} |"
                f" {len(keys)} | complete: {whole.covers_all} |",
                flush=True,
            )
            searches: list[tuple[str, int, SearchMode]] = [
                ("--max-preemptions", k, PreemptionBounded(k)) for k in range(max_k + 1)
            ]
            searches += [("--pct", d, Pct(d)) for d in range(1, 4)]
            for option, value, search in searches:
                found, seconds = timed(server, name, search)
                got = {c.key for c in found.classes}
                assert found.bound is not None
                said = found.bound.words(found.space).split(":")[0]
                print(
                    f"| {label} | {found.space:,} | {option} {value} | {found.run_count:,} |"
                    f" {seconds:.1f} | {len(got & keys)} of {len(keys)}{'' if got <= keys else ' (+ others!)'} |"
                    f" {said} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
