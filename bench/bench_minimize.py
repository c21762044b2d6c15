"""``pgrace minimize`` on every shipped race's bug variant, as shipped and padded, and on from-log's incidents.

Padded: an unrelated session of four steps, a table and two seed rows added, as an
incident brings them along. Incidents: real sessions deadlock or wait on a server that
logs (tools/incidents.py), from-log writes the scenario from that server's own log, and
it is minimized in the order that reproduced it. For each: runs, seconds, steps before
and after, whether the result is locally minimal, and how often a chancy failure was run
per candidate.

    python bench/bench_minimize.py [NAME ...]     # NAME: a shipped scenario, or an incident: deadlock,
                                                  # busy-deadlock, cycle, lock-wait
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pgrace.drivers.minimize import minimize
from pgrace.formats import catalog
from pgrace.model.scenario import Scenario
from pgrace.servers import ServerInfo, open_server

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository's tools/
import tools.incidents as real
from tools.padded import padded

INCIDENTS: dict[str, Callable[[real.LoggingServer], None]] = {
    "deadlock": real.deadlock,
    "busy-deadlock": real.busy_deadlock,
    "cycle": real.cycle,
    "lock-wait": real.lock_wait,
}


def _row(name: str, label: str, scenario: Scenario, server: ServerInfo) -> None:
    order = tuple(p.step for p in scenario.permutations[0])
    started = time.monotonic()
    try:
        found = minimize(scenario, server, order)
    except Exception as exc:  # a bug variant whose file order does not fail: say so and go on
        print(f"{name:<28} {label:<8} {str(exc)[:80]}")
        return
    seconds = time.monotonic() - started
    steps = f"{found.before['steps']}→{found.after['steps']}"
    print(
        f"{name:<28} {label:<8} {found.runs:>5} {seconds:>8.2f} {steps:>9} {found.repeats:>7}"
        f" {'yes' if found.locally_minimal else 'no'}",
        flush=True,
    )


def _incident(name: str) -> None:
    """From a real log to a minimized scenario, on the server that logged it (the incident's database is not used)."""
    from pgrace.drivers.fromlog import from_log
    from pgrace.formats.scenario_toml import parse_toml_scenario

    with real.logging_server("18") as logging, tempfile.TemporaryDirectory() as where:
        INCIDENTS[name](logging)
        log = Path(where) / "server.log"
        shutil.copy(logging.logfile(), log)
        found = from_log([str(log)], server=logging.server)
        if found.written is None or found.verified is None or not found.verified.reproduced:
            print(f"{name:<28} {'from-log':<8} not reproduced")
            return
        _row(name, "from-log", parse_toml_scenario(found.written.text, str(log)), logging.server)


def main() -> None:
    wanted = sys.argv[1:]
    names = (
        [n for n in wanted if n not in INCIDENTS]
        if wanted
        else [
            n
            for n in catalog.shipped_names()
            if "bug" in catalog.load(n).variants and catalog.load(n).variant_named("bug").checks
        ]
    )
    incidents = [n for n in wanted if n in INCIDENTS] if wanted else list(INCIDENTS)
    print(f"{'scenario':<28} {'input':<8} {'runs':>5} {'seconds':>8} {'steps':>9} {'repeats':>7} minimal")
    if names:
        with open_server(None) as server:
            for name in names:
                shipped = catalog.load(name).variant_named("bug")
                for label, scenario in (("shipped", shipped), ("padded", padded(shipped))):
                    _row(name, label, scenario, server)
    for name in incidents:
        _incident(name)


if __name__ == "__main__":
    main()
