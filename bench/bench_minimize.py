"""``pgrace minimize`` on every shipped race's bug variant, as shipped and padded, and on from-log's incidents.

Padded: an unrelated session of four steps, a table and two seed rows added, as an
incident brings them along. Incidents: real sessions deadlock or wait on a server that
logs (tools/incidents.py), from-log writes the scenario from that server's own log, and
it is minimized in the order that reproduced it. For each: runs, seconds, steps before
and after, whether the result is locally minimal, and how often a chancy failure was run
per candidate. For a padded race, the spec export: verified by the real isolationtester of
PostgreSQL 18 and of Debian's 15 where it is installed ("18 15"), or what a spec cannot say.

    python bench/bench_minimize.py [NAME ...]     # NAME: a shipped scenario, or an incident: deadlock,
                                                  # busy-deadlock, cycle, lock-wait
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pgrace.drivers.minimize import minimize
from pgrace.drivers.minimize.export import ExportError, verified_spec
from pgrace.frontends import catalog
from pgrace.model.minimized import Minimized
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


PG15 = "/usr/lib/postgresql/15/bin"


def _spec(found: Minimized, servers: list[tuple[str, ServerInfo]]) -> str:
    """Which servers' isolationtester reproduced the exported spec, or why a spec cannot say it."""
    verified = []
    with tempfile.TemporaryDirectory() as where:
        for version, server in servers:
            try:
                verified_spec(found, server, found.original.name, Path(where))
            except ExportError as exc:
                return str(exc).rsplit(": ", 1)[-1][:40]
            verified.append(version)
    return " ".join(verified)


def _row(name: str, label: str, scenario: Scenario, server: ServerInfo, specs: list[tuple[str, ServerInfo]]) -> None:
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
        f" {'yes' if found.locally_minimal else 'no':<7} {_spec(found, specs) if specs else ''}",
        flush=True,
    )


def _incident(name: str) -> None:
    """From a real log to a minimized scenario, on the server that logged it (the incident's database is not used)."""
    from pgrace.drivers.fromlog import from_log
    from pgrace.frontends.scenario_toml import parse_toml_scenario

    with real.logging_server("18") as logging, tempfile.TemporaryDirectory() as where:
        INCIDENTS[name](logging)
        log = Path(where) / "server.log"
        shutil.copy(logging.logfile(), log)
        found = from_log([str(log)], server=logging.server)
        if found.written is None or found.verified is None or not found.verified.reproduced:
            print(f"{name:<28} {'from-log':<8} not reproduced")
            return
        _row(name, "from-log", parse_toml_scenario(found.written.text, str(log)), logging.server, [])


def main() -> None:
    wanted = sys.argv[1:]
    names = (
        [n for n in wanted if n not in INCIDENTS]
        if wanted
        else [
            n
            for n in catalog.shipped_names()
            if "bug" in catalog.read_scenario(n).variants and catalog.read_scenario(n).variant_named("bug").checks
        ]
    )
    incidents = [n for n in wanted if n in INCIDENTS] if wanted else list(INCIDENTS)
    print(f"{'scenario':<28} {'input':<8} {'runs':>5} {'seconds':>8} {'steps':>9} {'repeats':>7} minimal spec")
    if names:
        with contextlib.ExitStack() as stack:
            server = stack.enter_context(open_server(None))
            specs = [("18", server)]
            if os.path.exists(os.path.join(PG15, "postgres")):
                specs.append(("15", stack.enter_context(open_server(PG15))))
            for name in names:
                shipped = catalog.read_scenario(name).variant_named("bug")
                for label, scenario in (("shipped", shipped), ("padded", padded(shipped))):
                    _row(name, label, scenario, server, specs if label == "padded" else [])
    for name in incidents:
        _incident(name)


if __name__ == "__main__":
    main()
