"""Explore's partial-order reduction: runs and seconds, reduced against every interleaving.

For every shipped scenario (both variants), the hard ones in tests/explore/hard/, the rows
ones in tests/explore/rows/ and the two shapes of the acceptance (three withdrawals: 3
sessions x 4 steps; two independent lost updates: 4 x 4, on two tables and on two rows of one
table in tests/explore/reads/, with the other reads ones) and the clock ones in
tests/explore/clock/ (the stale-reclaim queue: 3 x 4, whose check reads now()), runs the reduced search and,
where the space is at most MAX_WHOLE, the exhaustive one, and says whether their outcome
classes are the same (they must be).

    python bench/bench_reduce.py [MAX_WHOLE] [NAME ...]   # default 40,000: includes the 34,650 (about 6 min)

NAME: only the scenarios of these names (``one-reader-two-writers two-pairs-one-table``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pgrace.drivers.explore import explore
from pgrace.drivers.searches import Exhaustive
from pgrace.frontends import catalog
from pgrace.model.orders.space import Space
from pgrace.servers import open_server

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    max_whole = int(sys.argv[1]) if len(sys.argv) > 1 else 40_000
    files = [
        *sorted((ROOT / "scenarios").glob("*.toml")),
        *sorted((ROOT / "tests" / "explore" / "hard").glob("*.toml")),
        *sorted((ROOT / "tests" / "explore" / "rows").glob("*.toml")),
        *sorted((ROOT / "tests" / "explore" / "reads").glob("*.toml")),
        *sorted((ROOT / "tests" / "explore" / "clock").glob("*.toml")),
    ]
    files += [
        ROOT / "tests" / "explore" / "three-withdrawals.toml",
        ROOT / "tests" / "explore" / "two-lost-updates.toml",
    ]
    names = set(sys.argv[2:])
    files = [f for f in files if not names or f.stem in names]
    print(
        "| scenario | variant | interleavings | reduced runs | reduced s | exhaustive runs | exhaustive s | classes |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---|")
    failed = False
    with open_server("embedded") as server:
        for path in files:
            loaded = catalog.read_scenario(str(path))
            for variant in loaded.variants:
                scenario = loaded.variant_named(variant)
                space = Space(scenario).size
                started = time.perf_counter()
                reduced = explore(scenario, server)
                reduced_s = time.perf_counter() - started
                whole, whole_s, same = "-", "-", "not compared"
                if space <= max_whole:
                    started = time.perf_counter()
                    every = explore(scenario, server, search=Exhaustive())
                    whole, whole_s = f"{every.run_count:,}", f"{time.perf_counter() - started:.1f}"
                    equal = sorted(c.key for c in reduced.classes) == sorted(c.key for c in every.classes)
                    same = "same" if equal else "DIFFERENT"
                    failed = failed or not equal
                complete = "" if reduced.covers_all else " (not complete)"
                print(
                    f"| {scenario.name} | {variant} | {space:,} | {reduced.run_count:,}{complete} | {reduced_s:.1f} |"
                    f" {whole} | {whole_s} | {len(reduced.classes)}, {same} |",
                    flush=True,
                )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
