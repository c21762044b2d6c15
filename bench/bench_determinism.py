"""Determinism: every shipped scenario gives the identical text timeline, run after run.

For each shipped scenario and variant: RUNS consecutive runs, then LOADED_RUNS more
while every core is kept busy by another process. Prints the number of distinct
timelines per scenario (it must be 1) and exits 1 if any scenario gave more than one.

    python bench/bench_determinism.py [RUNS] [LOADED_RUNS]
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections import Counter

from pgrace import api
from pgrace.frontends import catalog
from pgrace.render.text import render_text
from pgrace.servers import open_server


def burn(stop: multiprocessing.synchronize.Event) -> None:
    """Keep one core busy until told to stop."""
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x = (x * 31 + 7) % 1_000_003


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    loaded_runs = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    cores = os.cpu_count() or 2
    failures = 0
    with open_server() as server:
        for name in catalog.shipped_names():
            scenario = catalog.read_scenario(name)
            for variant in scenario.variants:
                chosen = scenario.variant_named(variant)
                texts: Counter[str] = Counter()
                started = time.perf_counter()
                for _ in range(runs):
                    texts[render_text(api.run(chosen, server=server))] += 1
                quiet = len(texts)
                stop = multiprocessing.Event()
                burners = [multiprocessing.Process(target=burn, args=(stop,)) for _ in range(cores)]
                for process in burners:
                    process.start()
                try:
                    for _ in range(loaded_runs):
                        texts[render_text(api.run(chosen, server=server))] += 1
                finally:
                    stop.set()
                    for process in burners:
                        process.join()
                elapsed = time.perf_counter() - started
                failures += len(texts) != 1
                print(
                    f"{name:<24} {variant:<4} distinct timelines: {len(texts)} "
                    f"({runs} quiet runs: {quiet}, +{loaded_runs} with {cores} cores busy) in {elapsed:.1f} s"
                )
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
