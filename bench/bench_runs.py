"""The cost of one run of an exploration: every interleaving of three shipped scenarios, none reduced away.

For each scenario, REPEAT exhaustive explores (``search=Exhaustive()``) on one embedded server, after a
warm-up: the median runs per second (wall), and per run the CPU time of pgrace (this process)
and of the server (the postmaster and the backends it reaped). The machine is shared: the CPU
figures say more than the wall ones when other work loads it.

    python bench/bench_runs.py [REPEAT]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from pgrace.drivers.explore import explore
from pgrace.drivers.searches import Exhaustive
from pgrace.frontends import catalog
from pgrace.model.orders.space import Space
from pgrace.servers import open_server

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


def main() -> None:
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with open_server("embedded") as server:
        for name in SCENARIOS:
            scenario = catalog.read_scenario(name)
            explore(scenario, server, search=Exhaustive())  # warm up: caches, the first scratch database
            rates, ours, theirs = [], [], []
            for _ in range(repeat):
                wall, cpu, served = time.perf_counter(), time.process_time(), server_cpu()
                found = explore(scenario, server, search=Exhaustive())
                runs = found.run_count
                rates.append(runs / (time.perf_counter() - wall))
                ours.append((time.process_time() - cpu) / runs)
                theirs.append((server_cpu() - served) / runs)
            print(
                f"{name}: {Space(scenario).size} runs, median of {repeat}: {statistics.median(rates):.1f} runs/s;"
                f" CPU per run: pgrace {statistics.median(ours) * 1000:.2f} ms,"
                f" server {statistics.median(theirs) * 1000:.2f} ms"
            )


if __name__ == "__main__":
    main()
