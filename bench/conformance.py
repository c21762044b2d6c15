"""Run PostgreSQL's isolation corpus through pgrace and compare byte for byte.

Usage: ``python bench/conformance.py [CORPUS_DIR] [-k NAME ...] [--step-timeout S] [-v]``

CORPUS_DIR holds ``specs/*.spec`` and ``expected/*.out`` (default: ``../shared/pg-isolation``
relative to the repository root). One embedded server serves every spec; each spec gets
a fresh scratch database. One line per spec, then the totals and where the time went:

* *waiting*: wall time during which at least one step was reported waiting (blocked in
  the server, or held by a completion marker), taken from the run's event timestamps
  (a step's ``StepWaiting`` to its ``StepFinished``, intervals merged per run). This is
  time the scenarios themselves ask for: lock waits, ``deadlock_timeout`` and the like.
* *pgrace CPU*: CPU time of this process (parsing, scheduling, probing, rendering,
  comparing). What pgrace itself costs, independent of the server.
* the rest of the wall time is the server executing SQL and answering probes, plus
  creating and dropping scratch databases.

Exit status: 0 when every spec passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pgrace.drivers.speccheck import prepare_check, run_check
from pgrace.engine.options import RunOptions
from pgrace.errors import PgraceError
from pgrace.model.timeline import Run, StepFinished, StepLaunched, StepWaiting
from pgrace.servers import open_server

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = REPO.parent / "shared" / "pg-isolation"


def waiting_seconds(run: Run) -> float:
    """Wall time with at least one step waiting, from the events (merged intervals)."""
    started: dict[int, float] = {}
    intervals: list[tuple[float, float]] = []
    end = 0.0
    for event in run.events:
        end = max(end, getattr(event, "t", 0.0))
        if isinstance(event, StepWaiting) and event.seq not in started:
            started[event.seq] = event.t
        elif isinstance(event, StepFinished) and event.seq in started:
            intervals.append((started.pop(event.seq), event.t))
    intervals.extend((t, end) for t in started.values())  # never finished (cancelled run)
    total, reach = 0.0, float("-inf")
    for begin, finish in sorted(intervals):
        if finish <= reach:
            continue
        total += finish - max(begin, reach)
        reach = finish
    return total / 1000.0


def step_count(run: Run) -> int:
    return sum(1 for event in run.events if isinstance(event, StepLaunched))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", nargs="?", type=Path, default=DEFAULT_CORPUS, help="corpus directory")
    parser.add_argument("-k", "--only", action="append", default=[], metavar="NAME", help="run only these specs")
    parser.add_argument("--step-timeout", type=float, default=10.0, metavar="S", help="cancel a step after S seconds")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the diff of each failing spec")
    args = parser.parse_args(argv)

    specs = sorted((args.corpus / "specs").glob("*.spec"))
    if args.only:
        specs = [s for s in specs if s.stem in args.only]
    if not specs:
        print(f"no specs found in {args.corpus / 'specs'}", file=sys.stderr)
        return 2

    options = RunOptions(track_row_locks=False, step_timeout=args.step_timeout)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    passed = failed = steps = 0
    waiting = 0.0
    width = max(len(s.stem) for s in specs)
    with open_server() as server:
        started = time.perf_counter() - wall0
        print(f"server: {server.label} (ready in {started:.2f} s)")
        for spec in specs:
            t0 = time.perf_counter()
            try:
                checked = run_check(prepare_check(spec), server, options)
            except PgraceError as exc:
                failed += 1
                print(f"FAIL  {spec.stem:<{width}}  {time.perf_counter() - t0:6.2f} s  {exc}")
                continue
            waited = waiting_seconds(checked.run)
            waiting += waited
            steps += step_count(checked.run)
            timing = f"{checked.seconds:6.2f} s" + (f" (waiting {waited:.2f} s)" if waited >= 0.01 else "")
            if checked.passed:
                passed += 1
                print(f"PASS  {spec.stem:<{width}}  {timing}")
                continue
            failed += 1
            where = checked.comparison.first_difference
            detail = f"{checked.comparison.closest.name} {where.describe()}" if where else ""
            print(f"FAIL  {spec.stem:<{width}}  {timing}  {detail}")
            if args.verbose:
                print(checked.comparison.diff, end="")
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    print()
    print(f"{len(specs)} specs: {passed} passed, {failed} failed ({steps} steps)")
    print(f"wall time    {wall:6.2f} s")
    print(f"waiting      {waiting:6.2f} s  (at least one step waiting; from event timestamps)")
    print(f"pgrace CPU   {cpu:6.2f} s  (this process: scheduling, probes, rendering, comparing)")
    print(f"server, rest {max(0.0, wall - waiting - cpu):6.2f} s  (SQL, probe round trips, scratch databases)")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
