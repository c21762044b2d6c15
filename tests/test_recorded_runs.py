"""The recorded runs the renderer tests draw are real and current.

Each recording reads back as a run of the scenario file as it is now, and a run made now
tells the same story (the same steps, outcomes, waits and releases; only timings differ).
After a change to a scenario or to what a run records: ``python -m tools.record_runs``.
"""

from __future__ import annotations

import pytest
from fix_recorded import RECORDED

from pgrace import api
from pgrace.model.scenario import Scenario
from pgrace.model.timeline import Run
from pgrace.servers import ServerInfo
from tools.record_runs import dump_run, load_run, load_run_text, scenarios

RECORDINGS = scenarios()
AGAIN = "record again: python -m tools.record_runs"


def story(run: Run) -> list[tuple[object, ...]]:
    """What a run says happened, without its timings."""
    steps = [
        (s.step, s.session, s.status, s.outcome.error.sqlstate if s.outcome and s.outcome.error else None)
        for s in run.step_runs()
    ]
    waits = [(s.step, tuple(s.blocked_by), s.released_by) for s in run.step_runs() if s.waits]
    return [*steps, *waits, *((c.description, c.ok) for c in run.checks)]


def test_every_recording_is_there_and_nothing_else() -> None:
    assert sorted(p.name for p in RECORDED.glob("*.json")) == sorted(f"{name}.json" for name, _ in RECORDINGS), AGAIN


@pytest.mark.parametrize(("name", "scenario"), RECORDINGS, ids=[name for name, _ in RECORDINGS])
def test_a_recording_is_a_run_of_the_scenario_as_it_is_now(name: str, scenario: Scenario) -> None:
    run = load_run(name)
    assert run.scenario == scenario, f"tests/recorded/{name}.json is of an older {scenario.source}: {AGAIN} {name}"
    assert run.events and run.server_label.startswith("embedded PostgreSQL")


@pytest.mark.parametrize(("name", "scenario"), RECORDINGS, ids=[name for name, _ in RECORDINGS])
def test_a_run_now_tells_the_recorded_story_and_reads_back_whole(
    pgrace_server: ServerInfo, name: str, scenario: Scenario
) -> None:
    now = api.run(scenario, server=pgrace_server)
    assert load_run_text(dump_run(now)) == now
    assert story(now) == story(load_run(name)), f"tests/recorded/{name}.json tells another story: {AGAIN} {name}"
