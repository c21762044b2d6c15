"""The production races of the library make their point on a real server: PostgreSQL 18 and 15.

Each test runs a shipped scenario and asserts the fact a speaker tells about it (who waits for
whom, on what, which SQLSTATE, what ended the wait, the final state), from the run's JSON record.
"""

from __future__ import annotations

from typing import Any

import pytest

from pgrace import api
from pgrace.drivers.explore import explore
from pgrace.frontends import catalog
from pgrace.render.json import run_to_dict
from pgrace.servers import ServerInfo

PRODUCTION = [
    "deadlock-transfer",
    "duplicate-enqueue",
    "ddl-lock-queue",
    "advisory-lock",
    "write-skew",
    "atomic-update",
    "upsert-race",
    "repeatable-read-lost-update",
    "phantom-count",
]


def run(server: ServerInfo, name: str, variant: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The run's JSON record, and its steps by name; every expectation of the file must hold."""
    data = run_to_dict(api.run(catalog.read_scenario(name).variant_named(variant), server=server))
    failed = [c["description"] for c in data["checks"] if not c["ok"]]
    assert failed == [], f"{name} ({variant})"
    return data, {s["name"]: s for s in data["steps"]}


def final(data: dict[str, Any], index: int = 0) -> list[list[Any]]:
    rows: list[list[Any]] = data["final"][index]["rows"]
    return rows


def sqlstates(steps: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {name: s["error"]["sqlstate"] for name, s in steps.items() if s["error"]}


def test_the_production_races_are_shipped() -> None:
    assert set(PRODUCTION) <= set(catalog.shipped_names())
    for name in PRODUCTION:
        assert set(catalog.read_scenario(name).variants) == {"bug", "fix"}


def test_deadlock_transfer_bob_is_the_one_victim_of_a_cycle_of_both(each_server: ServerInfo) -> None:
    data, steps = run(each_server, "deadlock-transfer", "bug")
    assert sqlstates(steps) == {"bob-credit": "40P01"}
    victim = steps["bob-credit"]
    assert victim["blocked_by"] == ["alice"] and victim["release"]["cause"] == "deadlock"
    cycle = victim["error"]["cycle"]
    assert len(cycle) == 2 and {c.split()[0] for c in cycle} == {"alice", "bob"}
    survivor = steps["alice-credit"]
    assert survivor["blocked_by"] == ["bob"] and survivor["release"]["cause"] == "deadlock"
    assert survivor["waited_on"][0]["key"] == {"id": 2}
    assert final(data) == [["alice", 400], ["bob", 600]]


def test_deadlock_transfer_fix_has_no_deadlock_and_both_payments(each_server: ServerInfo) -> None:
    data, steps = run(each_server, "deadlock-transfer", "fix")
    assert sqlstates(steps) == {}
    lock = steps["bob-lock"]
    assert lock["blocked_by"] == ["alice"] and lock["waited_on"][0]["key"] == {"id": 1}
    assert lock["released_by"] == steps["alice-commit"]["index"]
    assert final(data) == [["alice", 450], ["bob", 550]]


def test_duplicate_enqueue_queues_the_job_twice_without_a_wait(each_server: ServerInfo) -> None:
    data, steps = run(each_server, "duplicate-enqueue", "bug")
    assert not any(s["waited"] for s in steps.values()) and sqlstates(steps) == {}
    assert final(data) == [["invoice-42", 2]]


def test_duplicate_enqueue_fix_waits_on_the_unique_index_then_inserts_nothing(each_server: ServerInfo) -> None:
    data, steps = run(each_server, "duplicate-enqueue", "fix")
    second = steps["web2-enqueue"]
    [wait] = second["waited_on"]
    assert wait["kind"] == "transaction" and wait["holder"] == "web1"
    assert "jobs_job_key_key" in wait["unique_indexes"]
    assert second["release"]["session"] == "web1" and second["rows"] == [] and second["error"] is None
    assert final(data) == [["invoice-42", 1]]


def test_ddl_lock_queue_a_reader_queues_behind_the_alter_until_its_timeout(each_server: ServerInfo) -> None:
    data, steps = run(each_server, "ddl-lock-queue", "bug")
    alter, read = steps["alter"], steps["web-read"]
    assert alter["blocked_by"] == ["report"] and alter["waited_on"][0]["mode"] == "AccessExclusiveLock"
    assert alter["release"]["session"] == "report" and alter["error"] is None
    [wait] = read["waited_on"]
    assert wait["kind"] == "relation" and wait["mode"] == "AccessShareLock" and wait["queued_behind"] == ["migration"]
    assert read["error"]["sqlstate"] == "57014" and read["release"]["cause"] == "statement_timeout"
    assert final(data, 0) == [[1]] and final(data, 1) == [[None]]


def test_ddl_lock_queue_fix_gives_up_then_retries_and_the_reader_never_waits(each_server: ServerInfo) -> None:
    data, steps = run(each_server, "ddl-lock-queue", "fix")
    alter = steps["alter"]
    assert alter["error"]["sqlstate"] == "55P03" and alter["release"]["cause"] == "lock_timeout"
    assert not steps["web-read"]["waited"] and steps["web-read"]["rows"] == [["queued"]]
    assert steps["retry"]["error"] is None and not steps["retry"]["waited"]
    assert final(data) == [["queued"]]


def test_advisory_lock_session_lock_survives_the_rollback(each_server: ServerInfo) -> None:
    data, steps = run(each_server, "advisory-lock", "bug")
    waiter = steps["worker2-lock"]
    [wait] = waiter["waited_on"]
    assert wait["kind"] == "advisory" and wait["holder"] == "worker1"
    # worker1 rolled back while worker2 waited: the rollback did not release it, its lock_timeout did
    assert steps["worker1-rollback"]["index"] < steps["pooled"]["index"]
    assert waiter["error"]["sqlstate"] == "55P03" and waiter["release"]["cause"] == "lock_timeout"
    assert final(data, 0) == [[0]] and final(data, 1) == [[True, "idle"]]


def test_advisory_lock_fix_the_failed_transaction_releases_the_lock(each_server: ServerInfo) -> None:
    data, steps = run(each_server, "advisory-lock", "fix")
    waiter = steps["worker2-lock"]
    assert waiter["waited_on"][0]["kind"] == "advisory" and waiter["error"] is None
    assert waiter["released_by"] == steps["worker1-fails"]["index"]  # the error ended the transaction
    assert final(data, 0) == [["worker2"]] and final(data, 1) == [[0]]


def test_write_skew_leaves_nobody_on_call_without_any_wait(each_server: ServerInfo) -> None:
    data, steps = run(each_server, "write-skew", "bug")
    assert not any(s["waited"] for s in steps.values()) and sqlstates(steps) == {}
    assert final(data) == [[0]]


def test_write_skew_fix_fails_bobs_commit_with_40001_and_the_retry_keeps_him(each_server: ServerInfo) -> None:
    data, steps = run(each_server, "write-skew", "fix")
    assert sqlstates(steps) == {"bob-commit": "40001"}
    assert steps["bob-retry"]["commands"][-2:] == ["UPDATE 0", "COMMIT"]
    assert final(data) == [[True]]


def test_atomic_update_bob_waits_and_still_overwrites(each_server: ServerInfo) -> None:
    data, steps = run(each_server, "atomic-update", "bug")
    write = steps["bob-write"]
    assert write["blocked_by"] == ["alice"] and write["released_by"] == steps["alice-commit"]["index"]
    assert write["rows"] == [[400]] and final(data) == [[400]]


def test_atomic_update_fix_applies_bobs_change_to_alices_row(each_server: ServerInfo) -> None:
    data, steps = run(each_server, "atomic-update", "fix")
    write = steps["bob-write"]
    assert write["blocked_by"] == ["alice"] and write["rows"] == [[300]] and final(data) == [[300]]


def test_upsert_race_second_insert_waits_then_fails_23505(each_server: ServerInfo) -> None:
    data, steps = run(each_server, "upsert-race", "bug")
    second = steps["web2-count"]
    assert second["waited_on"][0]["unique_indexes"] == ["page_views_pkey"]
    assert second["release"]["session"] == "web1" and second["error"]["sqlstate"] == "23505"
    assert final(data) == [["/launch", 1]]


def test_upsert_race_fix_turns_the_conflict_into_an_update(each_server: ServerInfo) -> None:
    data, steps = run(each_server, "upsert-race", "fix")
    second = steps["web2-count"]
    assert second["waited"] and second["error"] is None and second["rows"] == [[2]]
    assert final(data) == [["/launch", 2]]


def test_repeatable_read_bug_read_committed_loses_a_withdrawal(each_server: ServerInfo) -> None:
    data, steps = run(each_server, "repeatable-read-lost-update", "bug")
    assert steps["bob-write"]["waited"] and sqlstates(steps) == {}
    assert final(data) == [[400, 2]]


def test_repeatable_read_turns_the_lost_update_into_40001(each_server: ServerInfo) -> None:
    data, steps = run(each_server, "repeatable-read-lost-update", "fix")
    write = steps["bob-write"]
    assert write["blocked_by"] == ["alice"] and write["released_by"] == steps["alice-commit"]["index"]
    assert sqlstates(steps) == {"bob-write": "40001"}
    assert write["error"]["message"] == "could not serialize access due to concurrent update"
    assert final(data) == [[True]]


def test_phantom_count_books_three_of_two_seats(each_server: ServerInfo) -> None:
    data, steps = run(each_server, "phantom-count", "bug")
    assert not any(s["waited"] for s in steps.values())
    assert final(data) == [[3]]


def test_phantom_count_fix_serialises_on_the_workshop_row(each_server: ServerInfo) -> None:
    data, steps = run(each_server, "phantom-count", "fix")
    count = steps["bob-count"]
    assert count["waited_on"][0]["table"] == "workshops" and count["blocked_by"] == ["alice"]
    assert count["rows"] == [[2]] and steps["bob-book"]["commands"] == ["INSERT 0 0"]
    assert final(data) == [[2]]


@pytest.mark.parametrize("name", ["write-skew", "atomic-update", "upsert-race", "phantom-count", "duplicate-enqueue"])
def test_every_interleaving_bug_reproduces_somewhere_and_the_cure_everywhere(
    pgrace_server: ServerInfo, name: str
) -> None:
    scenario = catalog.read_scenario(name)
    bug = explore(scenario.variant_named("bug"), pgrace_server)
    assert bug.ok, f"{name}: no interleaving reproduces the bug"
    assert not all(c.reproduces for c in bug.classes), (
        f"{name}: the bug shows in every order, so the story oversells it"
    )
    fix = explore(scenario.variant_named("fix"), pgrace_server)
    assert fix.explored == fix.space and fix.ok, f"{name}: the cure fails in some interleaving"
