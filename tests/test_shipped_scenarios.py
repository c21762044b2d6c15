"""The shipped scenarios reproduce their facts on a real server, in both variants."""

from __future__ import annotations

import pytest

from pgrace import catalog
from pgrace.formats.scenario_toml import parse_toml_scenario
from pgrace.pytest_plugin import RunScenario
from pgrace.render.json import run_to_dict
from pgrace.timeline import Run, StepRun

SHIPPED = catalog.shipped_names()


def steps(run: Run) -> dict[str, StepRun]:
    return {s.step: s for s in run.step_runs()}


def final_rows(run: Run, index: int = 0) -> list[tuple[object, ...]]:
    last = run.check_outcomes()[index].last_rows
    assert last is not None
    return list(last.rows)


def test_the_five_seed_scenarios_are_shipped() -> None:
    assert {"lost-update", "head-of-line-blocking", "nowait", "offset-overlock", "skip-locked-fanout"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_variant_of_every_shipped_scenario_holds(pgrace_run: RunScenario, name: str) -> None:
    scenario = catalog.load(name)
    for variant in scenario.variants:
        run = pgrace_run(name, variant)
        failed = [f"{c.description}: expected {c.expected}, got {c.actual}" for c in run.checks if not c.ok]
        assert failed == [], f"{name} ({variant})"
        assert run.checks, f"{name} ({variant}) checks nothing"


def test_lost_update_loses_one_withdrawal(pgrace_run: RunScenario) -> None:
    run = pgrace_run("lost-update", "bug")
    assert final_rows(run) == [(400,)]
    assert not any(s.waited for s in run.step_runs())


def test_lost_update_fix_makes_bob_wait_for_alice_on_account_1(pgrace_run: RunScenario) -> None:
    run = pgrace_run("lost-update", "fix")
    assert final_rows(run) == [(300,)]
    bob_read = steps(run)["bob-read"]
    assert bob_read.waited and bob_read.blocked_by == ["alice"]
    [wait] = bob_read.waits
    assert wait.row is not None and wait.row.table == "accounts" and wait.row.key_dict() == {"id": 1}
    assert wait.mode == "FOR UPDATE" and wait.holder == "alice"
    assert bob_read.outcome is not None and bob_read.outcome.last_rows is not None
    assert bob_read.outcome.last_rows.rows == ((400,),)  # re-read after alice committed
    alice_commit = next(s for s in run.step_runs() if s.session == "alice" and s.sql == "COMMIT")
    assert bob_read.released_by == alice_commit.seq


def test_head_of_line_worker2_parks_on_job_1_held_by_worker1(pgrace_run: RunScenario) -> None:
    data = run_to_dict(pgrace_run("head-of-line-blocking"))
    [claim2] = [s for s in data["steps"] if s["name"] == "claim2"]
    assert claim2["waited"] and claim2["blocked_by"] == ["worker1"]
    assert claim2["waited_on"][0]["table"] == "jobs" and claim2["waited_on"][0]["key"] == {"id": 1}
    assert claim2["waited_on"][0]["holder"] == "worker1"
    # job 2 was queued and unlocked the whole time worker 2 waited
    assert {"table": "jobs", "key": {"id": 2}} not in [
        {"table": lk["table"], "key": lk["key"]} for lk in claim2["locks_after"]
    ]
    assert data["ok"] is True


def test_head_of_line_fix_claims_job_2_without_waiting(pgrace_run: RunScenario) -> None:
    claim2 = steps(pgrace_run("head-of-line-blocking", "fix"))["claim2"]
    assert not claim2.waited
    assert claim2.outcome is not None and claim2.outcome.last_rows is not None
    assert claim2.outcome.last_rows.rows == ((2,),)


def test_nowait_fails_at_once_with_55P03(pgrace_run: RunScenario) -> None:
    data = run_to_dict(pgrace_run("nowait"))
    errors = [s for s in data["steps"] if s["error"] and s["error"]["sqlstate"] == "55P03"]
    assert len(errors) == 1
    assert errors[0]["error"]["message"] == 'could not obtain lock on row in relation "jobs"'
    assert not any(s["waited"] for s in data["steps"])
    assert data["ok"] is True


def test_offset_locks_the_rows_it_skips(pgrace_run: RunScenario) -> None:
    data = run_to_dict(pgrace_run("offset-overlock"))
    by_name = {s["name"]: s for s in data["steps"]}
    page = by_name["page"]
    assert page["rows"] == [[2]]
    held = {(lk["session"], lk["table"], lk["key"]["id"]) for lk in page["locks_after"]}
    assert held == {("worker1", "jobs", 1), ("worker1", "jobs", 2)}
    assert by_name["claim"]["rows"] == [[3]]


def test_offset_fix_locks_only_the_row_returned(pgrace_run: RunScenario) -> None:
    by_name = {s.step: s for s in pgrace_run("offset-overlock", "fix").step_runs()}
    locks = by_name["page"].locks_after
    assert locks is not None
    assert [(lk.session, lk.row.key_dict() if lk.row else None) for lk in locks] == [("worker1", {"id": 2})]


@pytest.mark.parametrize("workers", ["3", "5"])
def test_skip_locked_fanout_claims_distinct_jobs_without_waits(pgrace_run: RunScenario, workers: str) -> None:
    data = run_to_dict(pgrace_run("skip-locked-fanout", params={"workers": workers}))
    claims = [s for s in data["steps"] if s["name"].startswith("claim.")]
    assert len(claims) == int(workers)
    claimed = [s["rows"][0][0] for s in claims]
    assert len(set(claimed)) == len(claimed) == int(workers)
    assert not any(s["waited"] for s in data["steps"])
    assert data["ok"] is True


def test_fanout_without_skip_locked_makes_the_workers_take_turns(pgrace_run: RunScenario) -> None:
    run = pgrace_run("skip-locked-fanout", "bug")
    claims = [s for s in run.step_runs() if s.step.startswith("claim.")]
    assert [c.waited for c in claims] == [False, True, True]
    # each worker waits for the one before it, on the job that one holds
    assert [(w.blocked_by, w.holder, w.row.key_dict() if w.row else None) for c in claims[1:] for w in c.waits] == [
        (("worker1",), "worker1", {"id": 1}),
        (("worker2",), "worker2", {"id": 2}),
    ]


def test_a_queue_of_waiters_shows_as_a_chain(pgrace_run: RunScenario) -> None:
    """worker3 queues for the tuple lock behind worker2, which waits for worker1's row."""
    run = pgrace_run(
        parse_toml_scenario(
            """
            setup = "CREATE TABLE jobs (id int PRIMARY KEY); INSERT INTO jobs VALUES (1), (2)"
            sessions = [{ name = "worker", count = 3 }]
            [[step]]
            name = "begin"
            session = "worker"
            sql = "BEGIN"
            [[step]]
            name = "claim"
            session = "worker"
            sql = "SELECT id FROM jobs ORDER BY id LIMIT 1 FOR UPDATE"
            [[step]]
            name = "end"
            session = "worker"
            sql = "ROLLBACK"
            """,
            "chain.toml",
        )
    )
    claims = [s for s in run.step_runs() if s.step.startswith("claim.")]
    [wait3] = claims[2].waits
    assert wait3.blocked_by == ("worker2",) and wait3.queued_behind == ("worker2",) and wait3.holder == "worker1"
    assert wait3.row is not None and wait3.row.key_dict() == {"id": 1}
