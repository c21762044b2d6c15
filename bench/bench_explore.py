"""Explore's speed and scale on the embedded server: throughput, -j scaling, shard merge.

1. Throughput: every interleaving of lost-update (two sessions of 4 steps: 70) run, none
   reduced away (``Exhaustive()``), REPEAT times, scratch database included; against the
   floor, the same statements sent one after the other on one plain connection (setup,
   8 steps, final check, teardown), measured between the runs (medians of each). Then the
   fixed part of that cost, the scratch database made and dropped as explore makes it:
   without pgrowlocks (an exhaustive explore reads no row locks) and with it (as before),
   alternated, and what it is per interleaving.
2. -j scaling: a sample of SAMPLE interleavings of skip-locked-fanout (3 × 3 steps,
   1680 in all), every one run (``Exhaustive()``: -j 1 would reduce the whole space), with
   -j 1 and -j 2 (this machine has 2 cores, shared: compare the ratio, not the seconds).
3. Shard merge: 4 shards of that sample, merged, equal the whole (and the -j runs).

    python bench/bench_explore.py [REPEAT] [SAMPLE]
"""

from __future__ import annotations

import statistics
import sys
import time

import psycopg

from pgrace.drivers.explore import explore
from pgrace.drivers.exploring import EXPLORE_SCHEMA
from pgrace.drivers.searches import Exhaustive, Sample
from pgrace.drivers.shards import merge_explorations
from pgrace.frontends import catalog
from pgrace.model.orders.space import Space
from pgrace.scratch import scratch_database, scratch_database_with_schema
from pgrace.servers import ServerInfo, open_server


def floor_per_interleaving(server: ServerInfo, count: int) -> float:
    """Seconds per interleaving if pgrace cost nothing: the statements alone, on one connection."""
    scenario = catalog.read_scenario("lost-update")
    steps = [scenario.step(p.step).sql.replace(":balance", "500") for p in scenario.permutations[0]]
    with scratch_database(server, "floor") as db, psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {EXPLORE_SCHEMA}; SET search_path = {EXPLORE_SCHEMA}, public")
        started = time.perf_counter()
        for _ in range(count):
            conn.execute(scenario.setup[0])
            for sql in steps:
                conn.execute(sql)
            conn.execute(scenario.checks[0].sql)
            conn.execute(f"DROP SCHEMA {EXPLORE_SCHEMA} CASCADE; CREATE SCHEMA {EXPLORE_SCHEMA}")
        return (time.perf_counter() - started) / count


def main() -> None:
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    sample = int(sys.argv[2]) if len(sys.argv) > 2 else 1680
    lost_update = catalog.read_scenario("lost-update")
    fanout = catalog.read_scenario("skip-locked-fanout")
    with open_server("embedded") as server:
        explore(lost_update, server, search=Exhaustive())  # warm up: caches, first scratch database
        rates, floors = [], []
        for _ in range(repeat):  # alternated with the floor: the machine is shared and noisy
            started = time.perf_counter()
            found = explore(lost_update, server, search=Exhaustive())  # every interleaving run, none reduced away
            rates.append(found.explored / (time.perf_counter() - started))
            floors.append(floor_per_interleaving(server, 70))
        floor = statistics.median(floors)
        print(f"lost-update, {Space(lost_update).size} interleavings (4 + 4 steps), -j 1, n={repeat}:")
        print(f"  median {statistics.median(rates):.0f} interleavings/s (min {min(rates):.0f}, max {max(rates):.0f})")
        cost = 1 / statistics.median(rates)
        ratio = cost / floor
        print(f"  {cost * 1000:.1f} ms per interleaving; the statements alone: {floor * 1000:.1f} ms ({ratio:.2f}×)")
        made: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(repeat):
            for with_pgrowlocks in (False, True):
                started = time.perf_counter()
                with scratch_database_with_schema(server, "explore_lost-update", EXPLORE_SCHEMA, with_pgrowlocks):
                    pass
                made[with_pgrowlocks].append(time.perf_counter() - started)
        fixed, before = statistics.median(made[False]), statistics.median(made[True])
        print(
            f"  of which the scratch database: {fixed * 1000:.0f} ms an explore ({fixed / 70 * 1000:.1f} ms an"
            f" interleaving); {before * 1000:.0f} ms with pgrowlocks, as before"
        )

        timings: dict[int, list[float]] = {1: [], 2: []}
        results = {}
        for jobs in (1, 2, 1, 2, 1, 2):  # alternated, best of three: the machine is shared and noisy
            started = time.perf_counter()
            results[jobs] = explore(fanout, server, search=Sample(sample, 1, reduce=False), jobs=jobs)
            timings[jobs].append(time.perf_counter() - started)
        print(f"skip-locked-fanout, {sample} of {Space(fanout).size} interleavings (3 × 3 steps), best of 3:")
        for jobs, seconds in timings.items():
            print(f"  -j {jobs}: {min(seconds):.2f} s, {sample / min(seconds):.0f} interleavings/s")
        speedup = min(timings[1]) / min(timings[2])
        print(f"  -j 2 speed-up: {speedup:.2f}× (2 cores, shared with the machine's other work)")

        shards = [explore(fanout, server, search=Sample(sample, 1, reduce=False), shard=(k, 4)) for k in range(1, 5)]
        merged, one, two = (e.to_dict() for e in (merge_explorations(shards), results[1], results[2]))
        for found in (merged, one, two):  # 4 shards held or 1: the classes are compared
            found.pop("shard")
        equal = merged == one == two
        print(f"4 shards merged equal the whole (and -j 2): {equal}")
        if not equal:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
