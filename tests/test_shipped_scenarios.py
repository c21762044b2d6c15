"""The shipped scenarios reproduce their facts on a real server, in both variants."""

from __future__ import annotations

import pytest

from pgrace.drivers.check import GOLDEN_STYLE
from pgrace.frontends import catalog
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.model.timeline import Run, StepRun
from pgrace.pytest_plugin import RunScenario
from pgrace.render.json import run_to_dict
from pgrace.render.text import render_text

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
    scenario = catalog.read_scenario(name)
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
    # job 2 was queued and unlocked while worker 2 waited (after worker 1's run1, worker 2 still waiting) ...
    [run1] = [s for s in data["steps"] if s["name"] == "run1"]
    assert [(lk["session"], lk["key"]) for lk in run1["locks_after"]] == [("worker1", {"id": 1})]
    # ... and claim2's own locks-after are those after it went on: the job it took, and the one it re-checked
    assert sorted((lk["session"], lk["key"]["id"]) for lk in claim2["locks_after"]) == [("worker2", 1), ("worker2", 2)]
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
    assert [c.waited for c in claims] == [False, True]
    # the second worker waits for the first, on the job the first holds
    assert [(w.blocked_by, w.holder, w.row.key_dict() if w.row else None) for c in claims[1:] for w in c.waits] == [
        (("worker1",), "worker1", {"id": 1}),
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


# -- the job-queue library --------------------------------------------------------------


def rows_of(step: StepRun) -> list[tuple[object, ...]]:
    assert step.outcome is not None and step.outcome.last_rows is not None, step.step
    return list(step.outcome.last_rows.rows)


def sqlstate_of(step: StepRun) -> str | None:
    return step.outcome.error.sqlstate if step.outcome and step.outcome.error else None


def test_lock_strengths_fk_check_passes_no_key_update_but_waits_for_for_update(pgrace_run: RunScenario) -> None:
    run = pgrace_run("lock-strengths", "bug")
    by = steps(run)
    assert not by["enqueue-email"].waited  # FOR KEY SHARE vs the UPDATE's FOR NO KEY UPDATE
    billing = by["enqueue-billing"]
    [wait] = billing.waits
    assert (wait.mode, wait.holder_mode, wait.holder) == ("FOR KEY SHARE", "FOR UPDATE", "worker")
    assert wait.row is not None and (wait.row.table, wait.row.key_dict()) == ("queues", {"id": 2})
    # a finished transaction's lock is not held: the producer's FK check lock is not listed after it committed
    assert all(lk.session == "worker" for s in run.step_runs() for lk in (s.locks_after or ()))
    assert "pid " not in render_text(run, GOLDEN_STYLE)


def test_lock_strengths_fix_takes_for_no_key_update_and_no_one_waits(pgrace_run: RunScenario) -> None:
    run = pgrace_run("lock-strengths", "fix")
    assert not any(s.waited for s in run.step_runs())
    held = steps(run)["lock-billing"].locks_after
    assert held is not None
    assert ("queues", 2, "FOR NO KEY UPDATE") in [
        (lk.table, lk.row.key_dict()["id"] if lk.row else None, lk.mode) for lk in held
    ]


def test_crashed_worker_leaves_a_committed_claim_running_for_a_dead_backend(pgrace_run: RunScenario) -> None:
    run = pgrace_run("crashed-worker", "bug")
    assert [lost.session for lost in run.sessions_lost()] == ["worker1"]
    assert rows_of(steps(run)["poll"]) == []  # SKIP LOCKED has nothing to skip and nothing to take
    assert final_rows(run) == [(1, "running", True, False)]


def test_crashed_worker_fix_reclaims_the_stale_job_for_worker2(pgrace_run: RunScenario) -> None:
    run = pgrace_run("crashed-worker", "fix")
    by = steps(run)
    assert rows_of(by["reclaim"]) == [(1,)] and rows_of(by["poll"]) == [(1,)]
    assert final_rows(run) == [(0,)]


def test_crash_mid_transaction_releases_the_claim_and_its_lock(pgrace_run: RunScenario) -> None:
    run = pgrace_run("crash-mid-transaction")
    by = steps(run)
    assert [(lk.session, lk.row.key_dict() if lk.row else None) for lk in by["claim1"].locks_after or ()] == [
        ("worker1", {"id": 1})
    ]
    assert rows_of(by["poll1"]) == [] and rows_of(by["poll2"]) == [(1,)]
    assert by["dies"].locks_after == ()
    assert final_rows(run) == [(0,)]


def test_slow_work_under_lock_parks_worker2_across_the_http_call(pgrace_run: RunScenario) -> None:
    run = pgrace_run("slow-work-under-lock", "bug")
    by = steps(run)
    claim2, call, commit1 = by["claim2"], by["http-call"], by["commit1"]
    assert claim2.waited and claim2.blocked_by == ["worker1"]
    assert claim2.seq < call.seq < commit1.seq and claim2.released_by == commit1.seq
    assert final_rows(run) == [(1, "done", "worker1", False), (2, "done", "worker2", True), (3, "queued", None, None)]


def test_slow_work_fix_commits_the_claim_so_no_one_waits(pgrace_run: RunScenario) -> None:
    run = pgrace_run("slow-work-under-lock", "fix")
    assert not any(s.waited for s in run.step_runs())
    assert steps(run)["claim1"].locks_after == ()
    assert final_rows(run) == [(2, False)]


def test_nowait_retry_fails_on_the_same_row_every_time(pgrace_run: RunScenario) -> None:
    run = pgrace_run("nowait-retry", "bug")
    by = steps(run)
    tries = [by[f"try{n}"] for n in (1, 2, 3)]
    assert [sqlstate_of(t) for t in tries] == ["55P03"] * 3
    assert not any(s.waited for s in run.step_runs())
    assert final_rows(run) == [(1, "running", "worker1"), (2, "queued", None), (3, "queued", None)]


def test_nowait_retry_fix_skips_to_the_free_jobs(pgrace_run: RunScenario) -> None:
    by = steps(pgrace_run("nowait-retry", "fix"))
    assert [rows_of(by[f"try{n}"]) for n in (1, 2, 3)] == [[(2,)], [(3,)], []]


def test_batch_claim_without_a_lock_runs_the_same_batch_twice(pgrace_run: RunScenario) -> None:
    run = pgrace_run("batch-claim", "bug")
    by = steps(run)
    assert rows_of(by["batch1"]) == rows_of(by["batch2"]) == [(1,), (2,), (3,)]
    assert by["batch2"].waited and by["batch2"].blocked_by == ["worker1"]
    assert final_rows(run) == [(0, "4,5,6"), (2, "1,2,3")]


def test_batch_claim_with_skip_locked_takes_disjoint_batches_without_waiting(pgrace_run: RunScenario) -> None:
    run = pgrace_run("batch-claim", "fix")
    by = steps(run)
    assert rows_of(by["batch1"]) == [(1,), (2,), (3,)] and rows_of(by["batch2"]) == [(4,), (5,), (6,)]
    assert not any(s.waited for s in run.step_runs())


def test_status_vs_lock_without_a_status_filter_runs_job_1_twice(pgrace_run: RunScenario) -> None:
    run = pgrace_run("status-vs-lock", "bug")
    by = steps(run)
    assert rows_of(by["claim1"]) == rows_of(by["claim2"]) == [(1,)]
    assert by["start1"].locks_after == ()  # committed: no lock left for SKIP LOCKED to skip
    assert final_rows(run)[0] == (1, "running", 2)


def test_status_vs_lock_fix_takes_job_2(pgrace_run: RunScenario) -> None:
    run = pgrace_run("status-vs-lock", "fix")
    assert rows_of(steps(run)["claim2"]) == [(2,)]
    assert final_rows(run) == [(1, "running", 1), (2, "running", 1)]
