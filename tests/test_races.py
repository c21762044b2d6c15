"""Six races a new user writes from the README, each with expectations on what it
waits for and what ended the wait: they hold on a real server, and say so in the timeline.

The scenarios are in ``tests/races/``: a transfer deadlock, a duplicate enqueue on a unique
key, a DDL lock queue with ``lock_timeout``, advisory locks, write skew under SERIALIZABLE,
and a crashed worker (its backend terminated from another session).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pgrace.frontends import catalog
from pgrace.pytest_plugin import RunScenario

RACES = sorted((Path(__file__).resolve().parent / "races").glob("*.toml"))


def test_the_six_races_are_here() -> None:
    assert [p.stem for p in RACES] == [
        "advisory-locks",
        "crashed-worker",
        "ddl-lock-queue",
        "duplicate-enqueue",
        "transfer-deadlock",
        "write-skew",
    ]


@pytest.mark.parametrize("path", RACES, ids=lambda p: p.stem)
def test_every_race_holds_its_expectations(pgrace_run: RunScenario, path: Path) -> None:
    scenario = catalog.read_scenario(str(path))
    run = pgrace_run(scenario)
    failed = [f"{c.description}: expected {c.expected}, got {c.actual}" for c in run.checks if not c.ok]
    assert failed == []
    waited = [s for s in run.step_runs() if s.waited]
    for step in waited:  # every wait is pinned: what it waited for and what ended it
        expect = scenario.step(step.step).expect
        assert expect.released_by is not None, f"{step.step} waits without saying what ends the wait"
        assert expect.waits_for is not None or expect.waits is True, step.step
    if not waited:  # write skew: nobody waits, and the verdict says so
        assert any(scenario.step(s.step).expect.waits is False for s in run.step_runs())
