"""Does the written scenario reproduce the incident? Run it, and when its order does not, explore its steps.

The incident's signature is in the scenario's expectations: the victim's 40P01 in a
cycle of the same sessions, and each wait for the same holders on the same table. A run
in which every one held reproduced it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pgrace.drivers.fromlog.incidents import Incident
from pgrace.drivers.fromlog.writer import OTHERS_TIMEOUT, VICTIM_TIMEOUT, Written, write_scenario

if TYPE_CHECKING:
    from pgrace.model.timeline import Run
    from pgrace.servers import ServerInfo

__all__ = ["Verified", "verify"]

#: Interleavings tried at most when the file's order does not reproduce (a seeded sample beyond).
EXPLORE_LIMIT = 200
#: Seconds verification takes at most, all its runs together: a logged statement that sleeps
#: (pg_sleep(300)) would otherwise wait out the step timeout in each of 200 interleavings.
VERIFY_SECONDS = 60.0


class _OutOfTime(Exception):  # noqa: N818
    """Verification's budget ran out between two interleavings."""


@dataclass
class Verified:
    """Whether the incident came back, what did not, and the order that made it when the file's did not."""

    reproduced: bool
    failures: list[str] = field(default_factory=list)
    explored: int = 0
    order: list[str] | None = None
    run: Run | None = None
    out_of_time: bool = False


def _run(written: Written, source: str, server: ServerInfo) -> Run:
    from pgrace.drivers.one_run import run_in_scratch
    from pgrace.errors import ScenarioFailed
    from pgrace.formats.scenario_toml import parse_toml_scenario

    scenario = parse_toml_scenario(written.text, source)
    try:
        return run_in_scratch(scenario, server)
    except ScenarioFailed as failed:
        if failed.run is None:
            raise
        failed.run.checks = failed.run.checks or []
        return failed.run


def verify(
    incident: Incident, written: Written, source: str, server: ServerInfo, dsn: str | None
) -> tuple[Verified, Written]:
    """Run ``written`` on ``server`` (a scratch database); explore its steps when the file's order fails.

    All of it within :data:`VERIFY_SECONDS` (checked between runs): out of time is not reproduced, and says so.
    """
    deadline = time.monotonic() + VERIFY_SECONDS
    run = _run(written, source, server)
    failures = [f"{c.description}: expected {c.expected}, got {c.actual}" for c in run.checks if not c.ok]
    if run.ok:
        return Verified(True, run=run), written
    if incident.kind != "deadlock":
        return Verified(False, failures, run=run), written
    from pgrace.drivers.explore import explore
    from pgrace.drivers.space import prepared
    from pgrace.formats.scenario_toml import parse_toml_scenario

    # Which orders deadlock does not depend on who is chosen: every session checks soon, so
    # no interleaving waits out the others' long pins.
    quick = written.text.replace(
        f"SET deadlock_timeout = '{OTHERS_TIMEOUT}'", f"SET deadlock_timeout = '{VICTIM_TIMEOUT}'"
    )
    scenario = prepared(parse_toml_scenario(quick, source))
    explored = 0

    def in_time(done: int, total: int) -> None:
        nonlocal explored
        explored = done
        if time.monotonic() > deadline:
            raise _OutOfTime

    try:
        found = explore(scenario, server, limit=EXPLORE_LIMIT, seed=0, on_progress=in_time)
    except _OutOfTime:
        return Verified(False, failures, explored=explored, run=run, out_of_time=True), written
    for cls in found.classes:  # simplest first: the fewest session switches
        if "40P01" not in cls.errors:
            continue
        if time.monotonic() > deadline:
            return Verified(False, failures, explored=found.explored, run=run, out_of_time=True), written
        other = write_scenario(incident, dsn, order=list(cls.example))
        again = _run(other, source, server)
        if again.ok:
            return Verified(True, explored=found.explored, order=list(cls.example), run=again), other
    return Verified(False, failures, explored=found.explored, run=run), written
