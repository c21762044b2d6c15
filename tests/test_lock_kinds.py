"""Every lock kind named on a real server: table-lock queues (hard and soft blocking), advisory
locks, unique-index waits, virtual transactions, SIRead locks."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import by_name, toml_scenario

from pgrace import api
from pgrace.engine.observe.locks import CONFLICTS, advisory_keys, advisory_level_in
from pgrace.engine.options import RunOptions
from pgrace.model.scenario import LOCK_MODES
from pgrace.model.timeline import AdvisoryKey, Run, WaitLink
from pgrace.pytest_plugin import RunScenario
from pgrace.render.json import run_to_dict
from pgrace.render.markdown import render_markdown
from pgrace.render.mermaid import render_mermaid
from pgrace.render.svg import render_svg
from pgrace.render.text import render_text
from pgrace.render.wording import describe_wait, serialization_text
from pgrace.servers import ServerInfo

scenario = functools.partial(toml_scenario, name="locks")


@pytest.fixture
def pgrace_run(each_server: ServerInfo) -> RunScenario:
    def run(scenario: Any, **options: Any) -> Run:
        return api.run(scenario, server=each_server, options=RunOptions(**options))

    return run


def test_the_conflict_table_is_postgresqls() -> None:
    """Spot checks against the documentation's table, and its symmetry."""
    assert CONFLICTS["AccessShareLock"] == {"AccessExclusiveLock"}
    assert "ShareLock" not in CONFLICTS["ShareLock"] and "RowExclusiveLock" in CONFLICTS["ShareLock"]
    assert "ShareUpdateExclusiveLock" in CONFLICTS["ShareUpdateExclusiveLock"]
    assert CONFLICTS["AccessExclusiveLock"] == set(LOCK_MODES)
    assert all((b in CONFLICTS[a]) == (a in CONFLICTS[b]) for a in LOCK_MODES for b in LOCK_MODES)


def test_advisory_keys_and_levels_from_what_the_server_says() -> None:
    assert advisory_keys(0, 42, 1) == (42,)
    assert advisory_keys(0xFFFFFFFF, 0xFFFFFFFB, 1) == (-5,)
    assert advisory_keys(1, 0xFFFFFFFF, 2) == (1, -1)
    assert advisory_level_in("SELECT pg_advisory_xact_lock(7)", (7,), False) == "transaction"
    assert advisory_level_in("SELECT pg_advisory_lock(7), pg_advisory_xact_lock(8)", (7,), False) == "session"
    assert advisory_level_in("SELECT pg_advisory_lock_shared(1, 2)", (1, 2), True) == "session"
    assert advisory_level_in("SELECT pg_advisory_lock(hashtext('x'))", (5,), False) == "session"
    assert advisory_level_in("SELECT 'pg_advisory_xact_lock(5)'", (5,), False) is None  # a literal, not a call
    assert advisory_level_in("SELECT pg_advisory_lock(1); SELECT pg_advisory_xact_lock(h())", (5,), False) == (
        "transaction"  # key 1 is not 5: the lock came from the other call
    )
    assert advisory_level_in("SELECT pg_advisory_lock(g()); SELECT pg_advisory_xact_lock(h())", (5,), False) is None


RELATION_QUEUE = """
[[step]]
name = "read-open"
session = "s1"
sql = "BEGIN; SELECT count(*) FROM jobs"
[[step]]
name = "alter"
session = "migration"
sql = "ALTER TABLE jobs ADD COLUMN note text"
[[step]]
name = "select"
session = "app"
sql = "SELECT count(*) FROM jobs"
[[step]]
name = "commit"
session = "s1"
sql = "COMMIT"
"""


def test_a_table_lock_queue_tells_queued_behind_from_waiting_for(pgrace_run: RunScenario) -> None:
    """app is queued behind migration's ACCESS EXCLUSIVE request; migration waits for s1's read."""
    run = pgrace_run(
        scenario(
            RELATION_QUEUE,
            sessions='["s1", "migration", "app"]',
            setup="CREATE TABLE jobs (id int PRIMARY KEY); INSERT INTO jobs VALUES (1)",
        ),
        lock_kinds="all",
    )
    steps = by_name(run)
    [alter] = steps["alter"].waits
    assert (alter.kind, alter.table, alter.mode) == ("relation", "jobs", "AccessExclusiveLock")
    assert alter.blocked_by == ("s1",) and alter.holder == "s1" and alter.holder_mode == "AccessShareLock"
    assert alter.queued_behind == ()
    assert alter.chain == (WaitLink("migration", "s1", "holds", "AccessShareLock", "AccessExclusiveLock"),)

    [select] = steps["select"].waits
    assert (select.kind, select.table, select.mode) == ("relation", "jobs", "AccessShareLock")
    assert select.blocked_by == ("migration",) and select.queued_behind == ("migration",)
    assert select.holder == "s1"  # the end of the chain, not migration: migration holds nothing on jobs
    assert select.chain == (
        WaitLink("app", "migration", "queued", "AccessExclusiveLock", "AccessShareLock"),
        WaitLink("migration", "s1", "holds", "AccessShareLock", "AccessExclusiveLock"),
    )
    [waited_on] = run_to_dict(run)["steps"][2]["waited_on"]
    assert waited_on["holder"] == "s1" and waited_on["queued_behind"] == ["migration"]
    assert [(link["waiter"], link["how"], link["session"]) for link in waited_on["chain"]] == [
        ("app", "queued", "migration"),
        ("migration", "holds", "s1"),
    ]
    text = render_text(run)
    assert "migration holds" not in text
    assert "queued for table jobs (wants AccessShareLock) behind migration (wants" in " ".join(text.split())
    assert "migration waits for s1 (s1 holds AccessShareLock)" in " ".join(text.split())
    # every format says the same: the pictures' short form, Markdown's long one
    assert "queued behind migration for table jobs (migration waits for s1)" in render_mermaid(run)
    assert "migration waits for s1 (s1 holds AccessShareLock)" in render_markdown(run)
    svg = render_svg(run)
    assert "queued behind migration for table jobs (migration waits for s1)" in svg
    assert "migration is ahead" in svg and "s1 holds table jobs" in svg  # the arrows' heads: migration's, s1's
    assert "app--)migration: ⏳ queued behind migration" in render_mermaid(run).replace("s3", "app").replace(
        "s2", "migration"
    )
    # the locks column (--locks all) shows the table lock s1 holds
    read_open = steps["read-open"]
    assert [lock.label() for lock in read_open.other_locks_after] == ["s1: table jobs AccessShareLock"]
    assert "s1: table jobs" in text and "locks held" in text


ADVISORY = """
[[step]]
name = "a-session"
session = "a"
sql = "SELECT pg_advisory_lock(42)"
[[step]]
name = "b-session"
session = "b"
sql = "SELECT pg_advisory_lock(42)"
[[step]]
session = "a"
sql = "SELECT pg_advisory_unlock(42)"
[[step]]
session = "b"
sql = "SELECT pg_advisory_unlock(42)"
[[step]]
name = "a-xact-shared"
session = "a"
sql = "BEGIN; SELECT pg_advisory_xact_lock_shared(1, -2)"
[[step]]
name = "b-xact"
session = "b"
sql = "BEGIN; SELECT pg_advisory_xact_lock(1, -2)"
[[step]]
name = "c-shared"
session = "c"
sql = "SELECT pg_advisory_lock_shared(1, -2)"
[[step]]
session = "a"
sql = "COMMIT"
[[step]]
session = "b"
sql = "COMMIT"
[[step]]
session = "c"
sql = "SELECT pg_advisory_unlock_all()"
"""


def test_advisory_waits_name_key_sharing_and_level(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        scenario(ADVISORY, sessions='["a", "b", "c"]', setup="CREATE TABLE t (id int PRIMARY KEY)"),
        lock_kinds="all",
    )
    steps = by_name(run)
    [session_wait] = steps["b-session"].waits
    assert session_wait.kind == "advisory" and session_wait.advisory == AdvisoryKey((42,), False, "session")
    assert session_wait.holder == "a" and session_wait.holder_mode == "ExclusiveLock"
    assert session_wait.detail == "42"  # the old field stays
    held = [lock for lock in steps["a-session"].other_locks_after if lock.kind == "advisory"]
    assert [(lock.session, lock.advisory) for lock in held] == [("a", AdvisoryKey((42,), False, "session"))]

    [xact_wait] = steps["b-xact"].waits
    assert xact_wait.advisory == AdvisoryKey((1, -2), False, "transaction")
    assert xact_wait.chain == (WaitLink("b", "a", "holds", "ShareLock", "ExclusiveLock"),)
    held = [lock for lock in steps["a-xact-shared"].other_locks_after if lock.kind == "advisory"]
    assert [(lock.session, lock.advisory) for lock in held] == [("a", AdvisoryKey((1, -2), True, "transaction"))]

    # c's shared request does not conflict with a's shared lock: it queues behind b's exclusive one
    [queued] = steps["c-shared"].waits
    assert queued.advisory == AdvisoryKey((1, -2), True, "session")
    assert queued.queued_behind == ("b",) and queued.holder == "a"
    assert queued.chain == (
        WaitLink("c", "b", "queued", "ExclusiveLock", "ShareLock"),
        WaitLink("b", "a", "holds", "ShareLock", "ExclusiveLock"),
    )
    text = " ".join(render_text(run).split())
    assert "waits for a on advisory lock 42 (wants exclusive, session level; a holds exclusive)" in text
    assert "queued for advisory lock (1, -2) (wants shared, session level) behind b (wants exclusive)" in text
    assert [lock.label() for lock in held] == ["a: advisory (1, -2) shared, transaction"]
    assert "a: advisory (1, -2) shared," in render_text(run)  # in the locks column (--locks all)


@pytest.mark.parametrize(
    ("setup", "indexes"),
    [
        ("CREATE TABLE jobs (job_key text PRIMARY KEY, payload text)", ("jobs_pkey",)),
        (
            "CREATE TABLE jobs (id serial PRIMARY KEY, job_key text NOT NULL UNIQUE, payload text)",
            ("jobs_job_key_key", "jobs_pkey"),
        ),
    ],
)
def test_a_duplicate_enqueue_waits_for_the_other_transaction_on_its_unique_index(
    pgrace_run: RunScenario, setup: str, indexes: tuple[str, ...]
) -> None:
    run = pgrace_run(
        scenario(
            """
            [[step]]
            session = "web1"
            sql = "BEGIN; INSERT INTO jobs (job_key, payload) VALUES ('send-mail-7', 'a')"
            [[step]]
            name = "dup"
            session = "web2"
            sql = "INSERT INTO jobs (job_key, payload) VALUES ('send-mail-7', 'b')"
            [[step]]
            session = "web1"
            sql = "COMMIT"
            """,
            sessions='["web1", "web2"]',
            setup="CREATE TABLE audit (id serial PRIMARY KEY); " + setup,
        )
    )
    dup = by_name(run)["dup"]
    [wait] = dup.waits
    assert wait.kind == "transaction" and wait.holder == "web1" and wait.blocked_by == ("web1",)
    assert wait.unique_indexes == indexes  # one: named; several: every candidate, never a guess
    named = " or ".join(indexes)
    which = f"unique index {named}" if len(indexes) == 1 else f"one of the unique indexes {named}"
    assert describe_wait(wait) == f"⏳ waits for web1's transaction to end (a key conflict in {which})"
    assert describe_wait(wait) in " ".join(render_text(run).split())  # the key: only in the server's 23505
    assert dup.outcome is not None and dup.outcome.error is not None and dup.outcome.error.sqlstate == "23505"


def test_on_conflict_waits_for_a_speculative_insertion(pgrace_run: RunScenario) -> None:
    """s2's speculative insertion waits on s1 in the other unique index, holding its token; s3's
    ON CONFLICT check finds s2's tuple and waits for the token (a ``spectoken`` lock), not the xid."""
    run = pgrace_run(
        scenario(
            """
            [[step]]
            session = "s1"
            sql = "BEGIN; INSERT INTO t VALUES (1, 1)"
            [[step]]
            name = "s2"
            session = "s2"
            sql = "INSERT INTO t VALUES (2, 1) ON CONFLICT (a) DO NOTHING"
            [[step]]
            name = "s3"
            session = "s3"
            sql = "INSERT INTO t VALUES (2, 2) ON CONFLICT (a) DO NOTHING"
            expect = { waits_on = { transaction_of = "s2" } }
            [[step]]
            session = "s1"
            sql = "ROLLBACK"
            """,
            sessions='["s1", "s2", "s3"]',
            setup="CREATE TABLE t (a int UNIQUE, b int UNIQUE)",
        )
    )
    steps = by_name(run)
    [s2] = steps["s2"].waits
    assert (s2.kind, s2.holder, s2.unique_indexes) == ("transaction", "s1", ("t_a_key", "t_b_key"))
    [s3] = steps["s3"].waits
    assert (s3.kind, s3.lock_type, s3.holder, s3.blocked_by) == ("speculative", "spectoken", "s2", ("s2",))
    assert describe_wait(s3).startswith("⏳ waits for s2's speculative insertion to finish (a key conflict in one of")
    assert all(c.ok for c in run.checks if c.step == "s3"), run.checks  # its insertion is s2's transaction's work


def test_create_index_concurrently_waits_for_an_open_transactions_snapshot(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        scenario(
            """
            [[step]]
            session = "report"
            sql = "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM jobs"
            [[step]]
            name = "cic"
            session = "ddl"
            sql = "CREATE INDEX CONCURRENTLY jobs_v ON jobs (v)"
            expect = { waits_on = { transaction_of = "report" }, released_by = "report" }
            [[step]]
            session = "report"
            sql = "COMMIT"
            """,
            sessions='["report", "ddl"]',
            setup="CREATE TABLE jobs (id int PRIMARY KEY, v int); INSERT INTO jobs VALUES (1, 1)",
        )
    )
    cic = by_name(run)["cic"]
    [wait] = cic.waits
    assert wait.kind == "virtualxid" and wait.holder == "report" and wait.blocked_by == ("report",)
    assert wait.reason == "CREATE INDEX CONCURRENTLY: waiting for old snapshots"
    assert "waits for report's transaction to end (CREATE INDEX CONCURRENTLY: waiting for old snapshots)" in (
        " ".join(render_text(run).split())
    )
    assert cic.status == "ok"
    assert run.ok, [c for c in run.checks if not c.ok]  # its virtual transaction is its transaction, to a reader


WRITE_SKEW = """
[[step]]
name = "a-read"
session = "a"
sql = "BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT count(*) FROM doctors WHERE on_call"
[[step]]
name = "b-read"
session = "b"
sql = "BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT count(*) FROM doctors WHERE on_call"
[[step]]
session = "a"
sql = "UPDATE doctors SET on_call = false WHERE id = 1"
[[step]]
session = "b"
sql = "UPDATE doctors SET on_call = false WHERE id = 2"
[[step]]
session = "a"
sql = "COMMIT"
[[step]]
name = "b-commit"
session = "b"
sql = "COMMIT"
"""


def test_a_write_skew_40001_is_shown_with_the_sIRead_locks_held(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        scenario(
            WRITE_SKEW,
            sessions='["a", "b"]',
            setup="CREATE TABLE doctors (id int PRIMARY KEY, on_call bool); INSERT INTO doctors VALUES (1, true), (2, true)",
        )
    )
    steps = by_name(run)
    assert [lock.label() for lock in steps["a-read"].other_locks_after if lock.kind == "predicate"] == [
        "a: SIRead doctors"
    ]
    commit = steps["b-commit"]
    assert commit.outcome is not None and commit.outcome.error is not None
    assert commit.outcome.error.sqlstate == "40001"
    sireads = {(lock.session, lock.describe_row()) for lock in commit.predicate_locks_at_error}
    assert {("a", "doctors"), ("b", "doctors")} <= sireads  # a's outlive its commit: b overlapped it
    text = render_text(run)  # rows only by default, yet the failure is explained
    assert serialization_text(commit.predicate_locks_at_error).startswith("⚑ SIRead locks held before it: a: doctors")
    assert "⚑ SIRead locks held before it: a:" in text
    [b_commit] = [s for s in run_to_dict(run)["steps"] if s["name"] == "b-commit"]
    assert {(lock["session"], lock["table"], lock["kind"]) for lock in b_commit["error"]["predicate_locks"]} >= {
        ("a", "doctors", "predicate"),
        ("b", "doctors", "predicate"),
    }


def test_the_locks_option_picks_what_the_locks_column_shows(tmp_path: Path, pgrace_server: ServerInfo) -> None:
    """``--locks rows`` (the default) keeps the column as it was; ``all`` adds tables and advisory locks."""
    from click.testing import CliRunner

    from pgrace.cli import main

    path = tmp_path / "held.toml"
    path.write_text(
        'name = "held"\nsetup = "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)"\nsessions = ["a"]\n'
        '[[step]]\nsession = "a"\nsql = "BEGIN; SELECT pg_advisory_xact_lock(9); SELECT id FROM t FOR UPDATE"\n'
    )
    cli = CliRunner()
    rows = cli.invoke(main, ["run", str(path), "--dsn", pgrace_server.dsn])
    every = cli.invoke(main, ["run", str(path), "--dsn", pgrace_server.dsn, "--locks", "all", "--width", "160"])
    assert rows.exit_code == every.exit_code == 0, rows.output + every.output
    assert "row locks held" in rows.output and "a: t id=1 FOR UPDATE" in rows.output
    assert "a: table t" not in rows.output and "a: advisory" not in rows.output
    assert "locks held" in every.output and "row locks held" not in every.output
    for label in ("a: t id=1 FOR UPDATE", "a: table t RowShareLock", "a: advisory 9 exclusive, transaction"):
        assert label in every.output, label
    data = json.loads(cli.invoke(main, ["run", str(path), "--dsn", pgrace_server.dsn, "-f", "json"]).stdout)
    [step] = data["steps"]
    assert [lock["kind"] for lock in step["locks_after"]] == ["row"]  # JSON: every kind, whatever --locks says
    assert {(lock["kind"], lock["mode"]) for lock in step["other_locks_after"]} == {
        ("relation", "RowShareLock"),
        ("advisory", "ExclusiveLock"),
    }
    bad = cli.invoke(main, ["run", str(path), "--locks", "some"])
    assert bad.exit_code == 2 and "--locks" in bad.output


def test_a_locked_row_is_named_by_its_key_after_the_key_changes_type(pgrace_run: RunScenario) -> None:
    """The observer asks the same catalog questions after every step, prepared once; the question about a
    table's own rows is not: a prepared plan would fail once the scenario changes the key's type."""
    body = """
        [[step]]
        name = "a-lock-int"
        session = "a"
        sql = "BEGIN; SELECT * FROM t WHERE id = 1 FOR UPDATE"
        [[step]]
        name = "a-commit"
        session = "a"
        sql = "COMMIT"
        [[step]]
        name = "b-retype"
        session = "b"
        sql = "ALTER TABLE t ALTER COLUMN id TYPE text"
        [[step]]
        name = "a-lock-text"
        session = "a"
        sql = "BEGIN; SELECT * FROM t WHERE id = '1' FOR UPDATE"
    """
    run = pgrace_run(
        scenario(body, sessions='["a", "b"]', setup="CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)")
    )
    steps = by_name(run)
    assert [lock.label() for lock in steps["a-lock-int"].locks_after or ()] == ["a: t id=1 FOR UPDATE"]
    assert [lock.label() for lock in steps["a-lock-text"].locks_after or ()] == ["a: t id='1' FOR UPDATE"]
