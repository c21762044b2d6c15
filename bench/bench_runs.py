"""The cost of one run of an exploration, exhaustive and reduced, on three shipped scenarios.

For each scenario and search, REPEAT explores on one embedded server, after a warm-up: the median
runs per second (wall), and per run the CPU time of pgrace (this process) and of the server (the
postmaster and the backends it reaped). ``exhaustive`` runs every interleaving; ``reduced`` (what
``pgrace explore`` runs) reads every session's footprint after each step, and the ratio line says
what a reduced run costs against an exhaustive one. The machine is shared: the CPU figures say more
than the wall ones when other work loads it.

    python bench/bench_runs.py [REPEAT] [exhaustive|reduced|both]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import NamedTuple

from pgrace.drivers.explore import explore
from pgrace.drivers.searches import Exhaustive, Reduced
from pgrace.frontends import catalog
from pgrace.model.orders.space import Space
from pgrace.model.scenario import Scenario
from pgrace.servers import ServerInfo, open_server

SCENARIOS = ("lost-update", "deadlock-transfer", "phantom-count")


def server_cpu() -> float:
    """CPU seconds of this process's descendants (the embedded server), with the backends they reaped (/proc)."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))  # ppid; utime stime cutime cstime
    ours, total, grew = {os.getpid()}, 0, True
    while grew:
        grew = False
        for pid, (ppid, ticks) in stats.items():
            if ppid in ours and pid not in ours:
                ours.add(pid)
                total += ticks
                grew = True
    return total / os.sysconf("SC_CLK_TCK")


SEARCHES = {"exhaustive": Exhaustive(), "reduced": Reduced()}


def measure(scenario: Scenario, server: ServerInfo, search: Exhaustive | Reduced, repeat: int) -> Figures:
    """The medians of ``repeat`` explores, after one to warm up (caches, the first scratch database)."""
    explore(scenario, server, search=search)
    rates, ours, theirs, runs = [], [], [], 0
    for _ in range(repeat):
        wall, cpu, served = time.perf_counter(), time.process_time(), server_cpu()
        runs = explore(scenario, server, search=search).run_count
        rates.append(runs / (time.perf_counter() - wall))
        ours.append((time.process_time() - cpu) / runs)
        theirs.append((server_cpu() - served) / runs)
    return Figures(runs, statistics.median(rates), statistics.median(ours) * 1000, statistics.median(theirs) * 1000)


class Figures(NamedTuple):
    runs: int
    rate: float  # runs per second, wall
    ours: float  # ms of pgrace's CPU per run
    theirs: float  # ms of the server's CPU per run


def main() -> None:
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    chosen = sys.argv[2] if len(sys.argv) > 2 else "exhaustive"
    names = list(SEARCHES) if chosen == "both" else [chosen]
    with open_server("embedded") as server:
        for name in SCENARIOS:
            scenario = catalog.read_scenario(name)
            found = {}
            for search in names:
                f = found[search] = measure(scenario, server, SEARCHES[search], repeat)
                print(
                    f"{name} {search}: {f.runs} of {Space(scenario).size} runs, median of {repeat}:"
                    f" {f.rate:.1f} runs/s; CPU per run: pgrace {f.ours:.2f} ms, server {f.theirs:.2f} ms"
                )
            if len(found) == 2:
                e, r = found["exhaustive"], found["reduced"]
                print(
                    f"{name} reduced/exhaustive per run: wall {e.rate / r.rate:.2f}x,"
                    f" CPU pgrace {r.ours / e.ours:.2f}x, server {r.theirs / e.theirs:.2f}x"
                )


if __name__ == "__main__":
    main()
