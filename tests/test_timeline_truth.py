"""A timeline that never lies, on a real server.

* errors no expectation allows fail the verdict (a spec keeps them as output);
* what ended a wait is its real cause, the same in text, JSON, pictures and presenter;
* locks are observed after a resolution, not only after launches;
* values are the server's text, converted only where an expectation compares.
"""

from __future__ import annotations

import functools
import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import by_name, text_of, toml_scenario

from pgrace.cli import main
from pgrace.cli.terminal.presenter import Presenter
from pgrace.engine.options import RunOptions
from pgrace.errors import ScenarioError
from pgrace.frontends import catalog
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.frontends.spec import parse_spec
from pgrace.model.timeline import LocksObserved, Release, StepLaunched
from pgrace.pytest_plugin import RunScenario
from pgrace.render.common import shorten_sql
from pgrace.render.isolation import render_isolation
from pgrace.render.json import run_to_dict
from pgrace.render.markdown import render_markdown
from pgrace.render.mermaid import render_mermaid
from pgrace.render.svg import render_svg
from pgrace.render.text import Style, render_text
from pgrace.servers import ServerInfo

scenario = functools.partial(toml_scenario, setup="CREATE TABLE t (id int PRIMARY KEY, v int);")

RACES = Path(__file__).resolve().parent / "races"


# -- 1. silent errors -----------------------------------------------------------------------


def test_an_error_no_expectation_allows_fails_the_verdict(pgrace_run: RunScenario) -> None:
    run = pgrace_run(scenario('[[step]]\nsession = "a"\nsql = "SELEC * FROM t"\n'))
    assert not run.ok
    [check] = run.checks
    assert check.description == 'step 1 failed unexpectedly: 42601 syntax error at or near "SELEC"'
    assert "verdict: ✘ 1 of 1 expectation did not hold" in text_of(run)


def test_both_begins_failing_is_red(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        scenario(
            """
            [[step]]
            session = "a"
            sql = "BEGIN ISOLATION LEVEL SERIALIZABL"
            [[step]]
            session = "b"
            sql = "BEGIN ISOLATION LEVEL SERIALIZABL"
            """
        )
    )
    assert not run.ok
    assert [c.description.split(":")[0] for c in run.checks] == [
        "step 1 failed unexpectedly",
        "step 2 failed unexpectedly",
    ]


def test_an_error_is_allowed_by_expecting_its_sqlstate_or_may_fail(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        scenario(
            """
            [[step]]
            session = "a"
            sql = "SELEC 1"
            expect = { error = "42601" }
            [[step]]
            session = "b"
            sql = "SELECT 1/0"
            expect = { may_fail = true }
            [[step]]
            session = "b"
            sql = "SELECT 1"
            """
        )
    )
    assert run.ok, [c for c in run.checks if not c.ok]
    assert [c.description for c in run.checks] == ["a-1: fails with 42601"]  # may_fail adds no check of its own


def test_expecting_another_sqlstate_does_not_allow_the_error(pgrace_run: RunScenario) -> None:
    run = pgrace_run(scenario('[[step]]\nsession = "a"\nsql = "SELECT 1/0"\nexpect = { error = "55P03" }\n'))
    assert [c.ok for c in run.checks] == [False, False]
    assert run.checks[1].description == "step 1 failed unexpectedly: 22012 division by zero"


def test_may_fail_with_an_error_key_is_rejected_with_its_line() -> None:
    with pytest.raises(ScenarioError) as caught:
        scenario('[[step]]\nsession = "a"\nsql = "SELECT 1"\nexpect = { may_fail = true, error = "42601" }\n')
    assert caught.value.line is not None and "may_fail" in str(caught.value)


def test_released_by_names_a_session_or_a_cause() -> None:
    with pytest.raises(ScenarioError) as caught:
        scenario('[[step]]\nsession = "a"\nsql = "SELECT 1"\nexpect = { released_by = "deadlok" }\n')
    assert "did you mean 'deadlock'" in str(caught.value)


def test_pgrace_check_reports_fail_for_an_unexpected_error(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    (tmp_path / "typo.toml").write_text('sessions = ["a"]\n[[step]]\nsession = "a"\nsql = "SELEC * FROM pg_class"\n')
    result = CliRunner().invoke(main, ["check", "--dsn", pgrace_server.dsn, str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert "FAIL  typo" in result.output
    assert 'step 1 failed unexpectedly: 42601 syntax error at or near "SELEC"' in result.output
    result = CliRunner().invoke(main, ["run", "--dsn", pgrace_server.dsn, str(tmp_path / "typo.toml")])
    assert result.exit_code == 1


def test_a_spec_keeps_errors_as_output_to_compare(pgrace_run: RunScenario) -> None:
    spec = parse_spec("session s1\nstep bad { SELEC 1; }\n", "bad.spec")
    run = pgrace_run(spec)
    assert run.checks == [] and run.ok
    assert 'ERROR:  syntax error at or near "SELEC"' in render_isolation(run)


# -- 2. what ended a wait -------------------------------------------------------------------


def test_lock_timeout_is_named_not_the_step_that_ran_last(pgrace_run: RunScenario) -> None:
    run = pgrace_run(RACES / "ddl-lock-queue.toml")
    steps = by_name(run)
    assert steps["alter"].release == Release("lock_timeout")
    assert steps["read"].release == Release("step", steps["alter"].seq, "migration", failed=True)
    text = text_of(run)
    assert "report's" not in text
    assert f"↳ step {steps['alter'].seq} ends: its lock_timeout expired; waited 2 steps" in text
    assert f"↳ step {steps['read'].seq} resumes after migration's ALTER TABLE jobs ADD … (step 4) failed" in text
    assert "waited 0 steps" not in text  # read waited while report's step ran
    assert run.ok, [c for c in run.checks if not c.ok]


def test_a_deadlock_names_the_detector_and_its_victim_in_every_format(pgrace_run: RunScenario) -> None:
    run = pgrace_run(RACES / "transfer-deadlock.toml")
    steps = by_name(run)
    victim, survivor, idle = steps["b-credit"], steps["a-credit"], steps["c-idle"]
    assert victim.release == Release("deadlock", victim.seq)
    assert survivor.release == Release("deadlock", victim.seq)
    assert survivor.released_by is None  # no step released it, whatever ran last
    said = f"step {survivor.seq} resumes: released by the deadlock detector (victim: step {victim.seq})"
    ended = f"step {victim.seq} ends: the deadlock detector chose it as the victim"
    text = " ".join(text_of(run).split())
    assert said in text and ended in text and f"step {idle.seq})" not in text
    data = run_to_dict(run)
    releases = {s["name"]: s["release"] for s in data["steps"]}
    assert releases["a-credit"] == {
        "cause": "deadlock",
        "step": victim.seq,
        "session": None,
        "failed": False,
        "reason": None,
    }
    assert releases["b-credit"]["cause"] == "deadlock" and releases["c-idle"] is None
    for picture in (render_markdown(run), render_mermaid(run)):
        flat = " ".join(picture.replace("\\", "").split())
        assert said in flat and ended in flat, picture
        assert f"step {victim.seq} resumes" not in flat
    svg = render_svg(run)
    assert f"step {victim.seq} resumes" not in svg and "waiting, 0 steps" not in svg
    assert "deadlock detector" in svg
    assert run.ok, [c for c in run.checks if not c.ok]


def test_the_presenter_tells_the_same_release(pgrace_run: RunScenario) -> None:
    loaded = catalog.read_scenario(str(RACES / "transfer-deadlock.toml"))
    out = io.StringIO()
    presenter = Presenter(loaded, Style(width=140), pace=0.0001, out=out, tty=False)
    with presenter:
        run = pgrace_run(loaded, options=RunOptions(before_step=presenter.before_step, on_event=presenter.on_event))
        presenter.finish(run)
    victim = by_name(run)["b-credit"].seq
    flat = " ".join(out.getvalue().split())
    assert f"resumes: released by the deadlock detector (victim: step {victim})" in flat


def test_a_terminated_holder_releases_the_waiter(pgrace_run: RunScenario) -> None:
    run = pgrace_run(RACES / "crashed-worker.toml")
    steps = by_name(run)
    # admin's pg_terminate_backend is no step pgrace knows as a release: the server's own word says what happened
    reason = "57P01: terminating connection due to administrator command"
    assert steps["claim2"].release == Release("terminated", session="worker1", reason=reason)
    assert f"resumes: the server ended worker1's connection ({reason})" in " ".join(text_of(run).split())
    assert run.ok, [c for c in run.checks if not c.ok]


def test_step_timeout_and_statement_timeout_are_told_apart(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        scenario(
            """
            [[step]]
            session = "a"
            sql = "BEGIN; UPDATE t SET v = 1 WHERE id = 1"
            [[step]]
            name = "server-gives-up"
            session = "b"
            sql = "SET statement_timeout = '200ms'; UPDATE t SET v = 2 WHERE id = 1"
            expect = { error = "57014", released_by = "statement_timeout" }
            [[step]]
            name = "pgrace-gives-up"
            session = "b"
            sql = "SET statement_timeout = 0; UPDATE t SET v = 3 WHERE id = 1"
            expect = { error = "57014", released_by = "step_timeout" }
            [[step]]
            session = "b"
            sql = "SELECT 1"
            [[step]]
            session = "a"
            sql = "COMMIT"
            """,
            setup="CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0);",
        ),
        step_timeout=0.5,
    )
    steps = by_name(run)
    assert steps["server-gives-up"].release == Release("statement_timeout")
    assert steps["pgrace-gives-up"].release == Release("step_timeout")
    assert run.ok, [c for c in run.checks if not c.ok]
    text = " ".join(text_of(run).split())
    assert "ends: its statement_timeout expired" in text and "ends: pgrace cancelled it (--step-timeout)" in text


def test_released_by_a_wrong_session_fails(pgrace_run: RunScenario) -> None:
    text = (RACES / "duplicate-enqueue.toml").read_text().replace('released_by = "web1"', 'released_by = "web2"')
    run = pgrace_run(parse_toml_scenario(text, "duplicate-enqueue.toml"))
    [failed] = [c for c in run.checks if not c.ok]
    assert failed.description == "enqueue2: released by web2"
    assert failed.actual.startswith("released by web1 (step")


# -- 3. locks after a resolution ---------------------------------------------------------------


def test_locks_are_observed_after_the_deadlock_is_resolved(pgrace_run: RunScenario) -> None:
    run = pgrace_run(RACES / "transfer-deadlock.toml")
    commit = next(e for e in run.events if isinstance(e, StepLaunched) and e.session == "a" and e.sql == "COMMIT")
    before_commit = run.events[: run.events.index(commit)]
    last = [e for e in before_commit if isinstance(e, LocksObserved)][-1]
    assert last.locks is not None
    assert {lock.session for lock in last.locks} == {"a"}  # b was aborted: it holds nothing any more
    rows = {str(lock.row) for lock in last.locks}
    assert rows == {"accounts id=1", "accounts id=2"}


# -- 6. values and wording ---------------------------------------------------------------------


def test_a_date_in_postgres_mdy_style_is_shown_as_the_server_wrote_it(pgrace_run: RunScenario) -> None:
    spec = parse_spec(
        "setup { CREATE TABLE d (day date); INSERT INTO d VALUES ('2008-12-23'); }\n"
        "teardown { DROP TABLE d; }\nsession s1\nstep r { SELECT day FROM d; }\n",
        "dates.spec",
    )
    run = pgrace_run(spec)  # specs run with DateStyle = Postgres, MDY, as pg_regress sets it
    assert "12-23-2008" in render_isolation(run)
    assert "day=12-23-2008" in text_of(run)
    assert json.loads(json.dumps(run_to_dict(run)))["steps"][0]["rows"] == [["12-23-2008"]]


def test_expectations_compare_values_the_server_wrote_in_any_style(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        scenario(
            """
            [[step]]
            session = "a"
            sql = "SET DateStyle = 'Postgres, MDY'; SELECT '2008-12-23'::date AS day, 1.50::numeric AS n, true AS b"
            expect = { rows = [["12-23-2008", 1.5, true]] }
            [[step]]
            session = "b"
            sql = "SELECT '2008-12-23'::date AS day"
            expect = { rows = [["2008-12-23"]] }
            """
        )
    )
    assert run.ok, [c for c in run.checks if not c.ok]
    assert "day=12-23-2008, n=1.50, b=true" in text_of(run)


def test_a_void_result_is_not_an_empty_string(pgrace_run: RunScenario) -> None:
    run = pgrace_run(scenario('[[step]]\nsession = "a"\nsql = "SELECT pg_sleep(0)"\n'))
    text = text_of(run)
    assert "pg_sleep=''" not in text and "→ pg_sleep=(void)" in text, text


def test_sql_is_shortened_at_clause_or_word_boundaries() -> None:
    assert shorten_sql("UPDATE accounts SET balance = balance + 10 WHERE id = 2", 24) == "UPDATE accounts …"
    assert shorten_sql("SELECT balance FROM accounts WHERE id = 1 FOR UPDATE", 30) == "SELECT balance FROM accounts …"
    assert shorten_sql("SELECT pg_advisory_unlock(7) AS released", 24) == "SELECT …"
    assert shorten_sql("COMMIT", 24) == "COMMIT"
    assert shorten_sql("SELECT a_very_long_function_name_indeed(1)", 10) == "SELECT …"


def test_the_text_timeline_never_wraps_inside_a_token(pgrace_run: RunScenario) -> None:
    run = pgrace_run(RACES / "advisory-locks.toml")
    text = text_of(run, width=100)
    assert "pg_advisory_xact_lock(42)" in text
    assert not re.search(r"pg_advisory_xact_lock\(42\s*\n", text)
    fanout = pgrace_run("skip-locked-fanout", "bug")
    skipped = render_text(fanout, Style(width=100, show_server=False))  # a long function call stays whole
    assert "current_setting(" in skipped and "'application_name')" in skipped  # cut between tokens only
    assert "statu..." not in skipped  # the SQL of a releasing step is cut at a clause boundary, not mid-word
    assert "resumes after worker1's UPDATE jobs … (step 6)" in text_of(fanout)


def test_one_expectation_is_singular(pgrace_run: RunScenario) -> None:
    run = pgrace_run(scenario('[[step]]\nsession = "a"\nsql = "SELECT 1 AS one"\nexpect = { rows = [[1]] }\n'))
    assert "verdict: ✔ 1 expectation held" in text_of(run)


def test_a_lock_released_inside_a_transaction_credits_that_step_and_not_a_bystander(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        scenario(
            """
            [[step]]
            session = "a"
            sql = "BEGIN; SAVEPOINT s; UPDATE t SET v = 1 WHERE id = 1"
            [[step]]
            name = "waits"
            session = "b"
            sql = "UPDATE t SET v = 2 WHERE id = 1"
            expect = { waits_for = "a", released_by = "a" }
            [[step]]
            name = "bystander"
            session = "c"
            sql = "SELECT 1"
            [[step]]
            name = "still-holds"
            session = "a"
            sql = "SELECT 2"
            [[step]]
            name = "undo"
            session = "a"
            sql = "ROLLBACK TO SAVEPOINT s"
            [[step]]
            session = "a"
            sql = "COMMIT"
            """,
            sessions='["a", "b", "c"]',
            setup="CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0);",
        )
    )
    steps = by_name(run)
    assert steps["waits"].release == Release("step", steps["undo"].seq, "a")
    assert run.ok, [c for c in run.checks if not c.ok]


def test_a_victim_ended_before_any_other_step_ran_tells_no_step_count(pgrace_run: RunScenario) -> None:
    """The shipped transfer deadlock: Bob's step closes the cycle and is the last launched; the
    detector ends it. 'waited 0 steps' said nothing true; the line names the detector only."""
    run = pgrace_run("deadlock-transfer")
    text = text_of(run)
    assert "waited 0 steps" not in text
    assert re.search(r"↳ step \d+ ends: the deadlock detector\s+chose it as the victim\s", text), text
