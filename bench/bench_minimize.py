"""``pgrace minimize`` on every shipped race's bug variant, as shipped and padded.

Padded: an unrelated session of four steps, a table and two seed rows added, as an
incident brings them along. For each: runs, seconds, steps before and after, whether the
result is locally minimal, and how often a chancy failure was run per candidate.

    python bench/bench_minimize.py [NAME ...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pgrace.drivers.minimize import minimize
from pgrace.formats import catalog
from pgrace.servers import open_server

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository's tools/
from tools.padded import padded


def main() -> None:
    names = sys.argv[1:] or [
        n
        for n in catalog.shipped_names()
        if "bug" in catalog.load(n).variants and catalog.load(n).variant_named("bug").checks
    ]
    print(f"{'scenario':<28} {'input':<8} {'runs':>5} {'seconds':>8} {'steps':>9} {'repeats':>7} minimal")
    with open_server(None) as server:
        for name in names:
            shipped = catalog.load(name).variant_named("bug")
            for label, scenario in (("shipped", shipped), ("padded", padded(shipped))):
                order = tuple(p.step for p in scenario.permutations[0])
                started = time.monotonic()
                try:
                    found = minimize(scenario, server, order)
                except Exception as exc:  # a bug variant whose file order does not fail: say so and go on
                    print(f"{name:<28} {label:<8} {str(exc)[:80]}")
                    continue
                seconds = time.monotonic() - started
                steps = f"{found.before['steps']}→{found.after['steps']}"
                print(
                    f"{name:<28} {label:<8} {found.runs:>5} {seconds:>8.2f} {steps:>9} {found.repeats:>7}"
                    f" {'yes' if found.locally_minimal else 'no'}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
