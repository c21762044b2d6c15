"""The engine on a real server: waits seen and attributed, completions ordered, errors as data."""

from __future__ import annotations

import dataclasses
import functools

from helpers import by_name, toml_scenario

from pgrace import api
from pgrace.model.timeline import NoticeReceived, StepCancelled, StepFinished
from pgrace.pytest_plugin import RunScenario
from pgrace.servers import ServerInfo

scenario = functools.partial(
    toml_scenario, setup="CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 10), (2, 20);"
)


def test_two_waiters_released_by_one_commit_complete_oldest_first(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        scenario(
            """
            [[step]]
            session = "a"
            sql = "BEGIN; SELECT v FROM t WHERE id = 1 FOR UPDATE"
            [[step]]
            name = "b"
            session = "b"
            sql = "SELECT v FROM t WHERE id = 1 FOR SHARE"
            [[step]]
            name = "c"
            session = "c"
            sql = "SELECT v FROM t WHERE id = 1 FOR SHARE"
            [[step]]
            name = "commit"
            session = "a"
            sql = "COMMIT"
            """,
            sessions='["a", "b", "c"]',
        )
    )
    steps = by_name(run)
    assert steps["b"].waited and steps["c"].waited
    finished = [e.seq for e in run.events if isinstance(e, StepFinished) and e.after_wait]
    assert finished == [steps["b"].seq, steps["c"].seq]
    assert steps["b"].released_by == steps["c"].released_by == steps["commit"].seq


def test_unique_key_conflict_waits_on_the_other_transaction(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        scenario(
            """
            [[step]]
            session = "a"
            sql = "BEGIN; INSERT INTO t VALUES (3, 30)"
            [[step]]
            name = "dup"
            session = "b"
            sql = "INSERT INTO t VALUES (3, 31)"
            [[step]]
            session = "a"
            sql = "COMMIT"
            """
        )
    )
    dup = by_name(run)["dup"]
    assert dup.waited
    [wait] = dup.waits
    assert wait.kind == "transaction" and wait.blocked_by == ("a",) and wait.holder == "a"
    assert dup.outcome is not None and dup.outcome.error is not None
    assert dup.outcome.error.sqlstate == "23505"  # an SQL error is data, not a crash


def test_table_and_advisory_lock_waits_are_named(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        scenario(
            """
            [[step]]
            session = "a"
            sql = "BEGIN; LOCK TABLE t IN ACCESS EXCLUSIVE MODE; SELECT pg_advisory_lock(42)"
            [[step]]
            name = "read"
            session = "b"
            sql = "SELECT count(*) FROM t"
            [[step]]
            session = "a"
            sql = "COMMIT"
            [[step]]
            name = "advisory"
            session = "b"
            sql = "SELECT pg_advisory_lock(42)"
            [[step]]
            session = "a"
            sql = "SELECT pg_advisory_unlock(42)"
            """
        )
    )
    steps = by_name(run)
    [table_wait] = steps["read"].waits
    assert (table_wait.kind, table_wait.table, table_wait.mode) == ("relation", "t", "AccessShareLock")
    [advisory] = steps["advisory"].waits
    assert (advisory.kind, advisory.detail, advisory.blocked_by) == ("advisory", "42", ("a",))


def test_a_step_that_can_never_finish_is_cancelled_with_the_wait_graph(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        scenario(
            """
            [[step]]
            session = "a"
            sql = "BEGIN; UPDATE t SET v = 11 WHERE id = 1"
            [[step]]
            name = "stuck"
            session = "b"
            sql = "UPDATE t SET v = 12 WHERE id = 1"
            [[step]]
            name = "next"
            session = "b"
            sql = "SELECT 1"
            [[step]]
            session = "a"
            sql = "COMMIT"
            """
        ),
        step_timeout=0.3,
    )
    [cancelled] = [e for e in run.events if isinstance(e, StepCancelled)]
    stuck = by_name(run)["stuck"]
    assert cancelled.seq == stuck.seq and cancelled.graph == (("b", ("a",)),)
    assert stuck.status == "cancelled"
    assert stuck.outcome is not None and stuck.outcome.error is not None
    assert stuck.outcome.error.sqlstate == "57014"
    assert by_name(run)["next"].status == "ok"


def test_notices_are_recorded_for_their_session(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        scenario(
            """
            [[step]]
            session = "b"
            sql = "DO $$ BEGIN RAISE NOTICE 'hello from b'; END $$"
            """
        )
    )
    notices = [e for e in run.events if isinstance(e, NoticeReceived)]
    assert [(n.session, n.severity, n.message) for n in notices] == [("b", "NOTICE", "hello from b")]


def test_a_failed_capture_leaves_the_variable_null(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        scenario(
            """
            [[step]]
            session = "a"
            sql = "SELECT id FROM t WHERE id = 1 / 0"
            capture = "id"
            [[step]]
            name = "use"
            session = "a"
            sql = "SELECT :id IS NULL AS missing"
            """
        )
    )
    use = by_name(run)["use"]
    assert use.sql == "SELECT NULL IS NULL AS missing"
    assert use.outcome is not None and use.outcome.last_rows is not None
    assert use.outcome.last_rows.rows == ((True,),)


def test_row_locks_are_unknown_rather_than_guessed_without_pgrowlocks(pgrace_server: ServerInfo) -> None:
    # Only the superuser may drop the extension pgrace installed (the run's own role may not).
    as_superuser = dataclasses.replace(pgrace_server, scenario_role=False)
    run = api.run(
        scenario(
            """
            [[step]]
            name = "lock"
            session = "a"
            sql = "BEGIN; SELECT id FROM t WHERE id = 1 FOR UPDATE"
            expect = { locks = [{ table = "t", key = { id = 1 }, session = "a" }] }
            """,
            setup="DROP EXTENSION IF EXISTS pgrowlocks; CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)",
        ),
        server=as_superuser,
    )
    lock = by_name(run)["lock"]
    assert lock.locks_after is None
    [check] = run.checks
    assert not check.ok and "unknown" in check.actual
