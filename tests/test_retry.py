"""A step retries on an SQLSTATE, as the application's own loop would: ``retry = { on, from, max }``.

The loop's steps run again as attempts of their own, named ``NAME#2``, ``NAME#3`` (each after
a ROLLBACK step, sent only when a transaction is open), and only when the attempt before failed
with a listed code. Expectations belong to the last attempt; a retried error is not the run's;
explore counts the attempts as the session's steps, and an interleaving that differs from
another only where unsent attempts stood is that one again.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pgrace import api
from pgrace.cli import main
from pgrace.drivers.explore import explore, replay
from pgrace.drivers.searches import Exhaustive, Sample
from pgrace.drivers.shards import merge_explorations
from pgrace.errors import ScenarioError
from pgrace.frontends.scenario_toml import parse_toml_scenario, read_toml_scenario
from pgrace.model.timeline import Run
from pgrace.render.html import render_html
from pgrace.render.markdown import render_markdown
from pgrace.render.mermaid import render_mermaid
from pgrace.render.svg import render_svg
from pgrace.render.text import render_text
from pgrace.servers import ServerInfo

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "serializable-retry.toml"

# a-try fails with 40001 until b has set v: the loop runs it once more at most.
NOT_YET = """name = "not-yet"
setup = "CREATE TABLE t (v int); INSERT INTO t VALUES (0)"
sessions = ["a", "b"]

[[step]]
name = "a-begin"
session = "a"
sql = "BEGIN"

[[step]]
name = "a-try"
session = "a"
sql = "DO $$ BEGIN IF (SELECT v FROM t) = 0 THEN RAISE EXCEPTION 'not yet' USING ERRCODE = '40001'; END IF; END $$"
retry = { on = ["40001"], from = "a-begin", max = 1 }

[[step]]
name = "b-set"
session = "b"
sql = "UPDATE t SET v = 1"

[[step]]
name = "a-commit"
session = "a"
sql = "COMMIT"

[[check]]
description = "v is 1"
sql = "SELECT v FROM t"
rows = [[1]]
"""


def names(run: Run) -> list[str]:
    return [s.step for s in run.step_runs()]


def test_the_loop_is_unrolled_into_named_attempts_after_the_step() -> None:
    scenario = parse_toml_scenario(NOT_YET, "not-yet.toml")
    assert [s.name for s in scenario.steps] == [
        "a-begin",
        "a-try",
        "a-try#2-rollback",
        "a-begin#2",
        "a-try#2",
        "b-set",
        "a-commit",
    ]
    rollback = scenario.step("a-try#2-rollback")
    assert (rollback.sql, rollback.rollback, rollback.attempt, rollback.line) == ("ROLLBACK", True, 2, 14)
    assert scenario.step("a-begin#2").note == "attempt 2 (a-begin#2)"


def test_attempt_2_runs_after_a_rollback_and_succeeds(pgrace_server: ServerInfo) -> None:
    # a sequence is not rolled back: the first attempt draws 1 and fails, the second draws 2
    text = NOT_YET.replace("CREATE TABLE t (v int); INSERT INTO t VALUES (0)", "CREATE SEQUENCE s").replace(
        "IF (SELECT v FROM t) = 0", "IF nextval('s') = 1"
    )
    text = text.replace("UPDATE t SET v = 1", "SELECT 1").replace("SELECT v FROM t", "SELECT last_value FROM s")
    text = text.replace("rows = [[1]]", "rows = [[2]]")
    run = api.run(parse_toml_scenario(text, "once.toml"), server=pgrace_server)
    assert run.ok, [c for c in run.checks if not c.ok]
    assert names(run) == ["a-begin", "a-try", "a-try#2-rollback", "a-begin#2", "a-try#2", "b-set", "a-commit"]
    by_name = {s.step: s for s in run.step_runs()}
    assert by_name["a-try"].outcome is not None and by_name["a-try"].outcome.error is not None
    assert by_name["a-try"].outcome.retry == 2
    assert by_name["a-try"].retried and not by_name["a-try#2"].retried
    assert by_name["a-try#2-rollback"].outcome is not None and by_name["a-try#2-rollback"].outcome.commands == (
        "ROLLBACK",
    )


def test_the_shipped_example_retries_bobs_commit_and_attempt_2_answers_him(pgrace_server: ServerInfo) -> None:
    fix = read_toml_scenario(EXAMPLE).variant_named("fix")
    run = api.run(fix, server=pgrace_server)
    assert run.ok, [c for c in run.checks if not c.ok]
    # COMMIT's 40001 ended the transaction: no ROLLBACK is sent; alice never retried: no attempt of hers ran
    assert names(run) == [
        "alice-begin",
        "bob-begin",
        "alice-off",
        "bob-off",
        "alice-commit",
        "bob-commit",
        "bob-begin#2",
        "bob-off#2",
        "bob-commit#2",
    ]
    assert [c.description for c in run.checks][:2] == ["alice-commit: succeeds", "bob-commit#2: succeeds"]
    data = json.loads(CliRunner().invoke(main, ["run", str(EXAMPLE), "--fix", "-f", "json"]).stdout)
    steps = {s["name"]: s for s in data["steps"]}
    assert steps["bob-commit"]["error"]["sqlstate"] == "40001"
    assert (steps["bob-commit"]["retried"], steps["bob-commit"]["attempt"]) == (True, 1)
    assert (steps["bob-commit#2"]["retried"], steps["bob-commit#2"]["attempt"]) == (False, 2)
    assert steps["bob-commit#2"]["retry_loop"] == "bob-commit"


def test_every_format_tells_the_attempts_apart(pgrace_server: ServerInfo) -> None:
    run = api.run(read_toml_scenario(EXAMPLE).variant_named("fix"), server=pgrace_server)
    for render in (render_text, render_markdown, render_html, render_svg, render_mermaid):
        shown = render(run).replace("\\#", "#").replace("#35;", "#")  # Markdown's and Mermaid's '#'
        assert "attempt 2 (bob-commit#2)" in shown, render.__name__
        assert "retried: attempt 2 follows" in shown, render.__name__


def test_max_exhausted_the_last_error_stands_unless_the_last_attempt_expects_it(pgrace_server: ServerInfo) -> None:
    failing = parse_toml_scenario(NOT_YET, "not-yet.toml")
    run = api.run(failing, server=pgrace_server)
    assert not run.ok
    assert [c.step for c in run.checks if not c.ok] == ["a-try#2"]  # attempt 1's 40001 was handled by the loop
    expected = NOT_YET.replace("max = 1 }", 'max = 1 }\nexpect = { error = "40001" }')
    run = api.run(parse_toml_scenario(expected, "not-yet.toml"), server=pgrace_server)
    assert run.ok, [c for c in run.checks if not c.ok]
    assert [c.description for c in run.checks] == ["a-try#2: fails with 40001", "v is 1"]


def test_an_expectation_on_the_loop_is_checked_on_the_last_attempt_only(pgrace_server: ServerInfo) -> None:
    fix = read_toml_scenario(EXAMPLE).variant_named("fix")
    # bob-commit expects no error: attempt 1 failed with 40001 and does not count, attempt 2 holds
    assert fix.step("bob-commit").expect.sqlstate == ""
    assert fix.step("bob-commit#2").expect.sqlstate == ""
    run = api.run(fix, server=pgrace_server)
    assert "bob-commit: succeeds" not in [c.description for c in run.checks]


RETRY_ONCE = Path(__file__).resolve().parent / "explore" / "retry-once.toml"


def test_explore_counts_the_attempts_and_a_repeat_once(pgrace_server: ServerInfo) -> None:
    found = explore(read_toml_scenario(RETRY_ONCE), pgrace_server, search=Exhaustive())
    # the worker's chain is claim, claim#2-rollback, claim#2: 4 places for the producer's step. With
    # ready first nothing is retried, and the orders that put it before or after claim's unsent
    # attempt are one run: counted once.
    assert (found.space, found.explored, found.repeats) == (4, 4, 1)
    assert [(c.count, c.errors) for c in found.classes] == [(2, ()), (1, ("40001",))]
    assert found.classes[0].example == ("ready", "claim")  # no unsent step is shown as run
    assert found.classes[1].example == ("claim", "claim#2", "ready")  # retried, failed again: max 1
    assert found.to_dict()["repeats"] == 1
    shards = [explore(read_toml_scenario(RETRY_ONCE), pgrace_server, shard=(k, 2)) for k in (1, 2)]
    merged = merge_explorations(shards)
    assert (merged.explored, merged.repeats, [c.count for c in merged.classes]) == (4, 1, [2, 1])


SERIALIZABLE_RETRY = Path(__file__).resolve().parents[1] / "examples" / "serializable-retry.toml"


def test_a_class_says_how_many_of_its_runs_went_through_a_retry(pgrace_server: ServerInfo) -> None:
    """Every order of the doctors' fix holds, but some only because a 40001 was retried: the class says so."""
    fix = read_toml_scenario(SERIALIZABLE_RETRY).variant_named("fix")
    found = explore(fix, pgrace_server)
    [only] = found.classes
    assert only.ok and only.errors == ()  # the loop handled every 40001: it does not classify
    assert 0 < only.retries < only.count and only.retried_on == ("40001",)
    assert any("#2" in name for name in only.retry_example)  # the example retried: a second attempt ran
    assert not any("#2" in name for name in only.example)  # the class's own example needed none
    replayed = replay(fix, pgrace_server, dataclasses.replace(only, example=only.retry_example))
    assert [s.outcome.error.sqlstate for s in replayed.step_runs() if s.retried and s.outcome and s.outcome.error] == [
        "40001"
    ]
    said = only.to_dict("fix")
    assert (said["retries"], said["retried_on"], said["retry_example"]) == (
        only.retries,
        ["40001"],
        list(only.retry_example),
    )


def test_every_exploration_format_shows_the_retries(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    cli = CliRunner()
    args = ["explore", str(SERIALIZABLE_RETRY), "--fix", "--dsn", pgrace_server.dsn]
    out = tmp_path / "fix.json"
    assert cli.invoke(main, [*args, "-f", "json", "-o", str(out)]).exit_code == 0
    [data] = json.loads(out.read_text())["classes"]
    retried = f"{data['retries']} (40001)"
    assert data["retries"] > 0 and data["retried_on"] == ["40001"] and "#2" in str(data["retry_example"])
    text = cli.invoke(main, args).stdout
    assert "retried" in text.splitlines()[2] and f"  {retried}  " in text
    assert "class 1 retried, e.g.: alice-begin → " in text and "#2" in text
    markdown = cli.invoke(main, [*args, "-f", "markdown"]).stdout
    assert "| retried |" in markdown and f"| {retried} |" in markdown and "| retried, e.g. |" in markdown
    page = cli.invoke(main, [*args, "-f", "html", "-o", str(tmp_path / "fix.html")])
    assert page.exit_code == 0, page.output
    html = (tmp_path / "fix.html").read_text()
    assert "<th>retried</th>" in html and f"<td>{retried}</td>" in html


def test_a_sweep_says_which_cells_classes_retried(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    swept = tmp_path / "retry-once.toml"
    swept.write_text(RETRY_ONCE.read_text() + "\n[params]\nx = 1\n")
    args = ["sweep", str(swept), "-p", "x=1", "--explore", "--dsn", pgrace_server.dsn]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "retry-once [x=1] ×2: final (true) · checks hold · retried: 1 (40001)\n" in result.stdout


def test_shards_add_their_retries_up(pgrace_server: ServerInfo) -> None:
    one = explore(read_toml_scenario(RETRY_ONCE), pgrace_server, search=Exhaustive())
    shards = [explore(read_toml_scenario(RETRY_ONCE), pgrace_server, search=Exhaustive(), shard=(k, 2)) for k in (1, 2)]
    merged = merge_explorations(shards)
    assert [(c.retries, c.retried_on) for c in merged.classes] == [(c.retries, c.retried_on) for c in one.classes]
    assert [c.retries for c in one.classes] == [1, 1]  # ready after the first claim failed; claim failed twice


def test_a_sample_counts_a_repeat_only_when_what_it_repeats_is_in_the_sample(pgrace_server: ServerInfo) -> None:
    # interleaving 2 (claim, ready, claim#2-rollback, claim#2) runs as 1 does: the ROLLBACK is not sent
    alone = explore(read_toml_scenario(RETRY_ONCE), pgrace_server, search=Sample(2, 5))  # picks 2 and 3
    assert (alone.explored, alone.repeats, sum(c.count for c in alone.classes)) == (2, 0, 2)
    both = explore(read_toml_scenario(RETRY_ONCE), pgrace_server, search=Sample(2, 1))  # picks 1 and 2
    assert (both.explored, both.repeats, sum(c.count for c in both.classes)) == (2, 1, 1)


@pytest.mark.parametrize(
    ("retry", "message"),
    [
        ('{ on = ["40001"], from = "a-bgein", max = 1 }', "from 'a-bgein' is no step of session 'a' (did you mean"),
        ('{ on = ["40001"], from = "b-set", max = 1 }', "from 'b-set' is a step of session 'b'"),
        ('{ on = ["40001"], from = "a-commit", max = 1 }', "from 'a-commit' comes after 'a-try'"),
        ('{ on = ["40001"], from = "a-begin", max = 0 }', "max is how many times to run the loop again"),
        ('{ on = ["40001"], from = "a-begin", max = 11 }', "a whole number from 1 to 10"),
        ('{ on = ["40001"], from = "a-begin", max = true }', "a whole number from 1 to 10"),
        ('{ on = ["4000"], from = "a-begin", max = 1 }', "'4000' is not an SQLSTATE"),
        ('{ on = ["40p01"], from = "a-begin", max = 1 }', "'40p01' is not an SQLSTATE"),
        ('{ on = [], from = "a-begin", max = 1 }', "on lists the SQLSTATEs to retry on"),
        ('{ on = ["40001"], max = 1 }', "from names the loop's first step"),
        ('{ on = ["40001"], from = "a-begin", max = 1, until = 3 }', "unknown key 'until'"),
        ("3", "retry: a table"),
    ],
)
def test_a_bad_retry_is_refused_at_its_line(tmp_path: Path, retry: str, message: str) -> None:
    text = NOT_YET.replace('retry = { on = ["40001"], from = "a-begin", max = 1 }', f"retry = {retry}")
    with pytest.raises(ScenarioError) as raised:
        parse_toml_scenario(text, "not-yet.toml")
    assert message in raised.value.message, raised.value.message
    assert raised.value.line == 14
    path = tmp_path / "not-yet.toml"
    path.write_text(text)
    result = CliRunner().invoke(main, ["show", str(path)])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"pgrace: {path}:14: retry: ") and result.stderr.count("\n") == 1


def test_loops_of_a_session_must_not_overlap() -> None:
    text = NOT_YET.replace('sql = "COMMIT"', 'sql = "COMMIT"\nretry = { on = ["40001"], from = "a-try", max = 1 }')
    with pytest.raises(ScenarioError, match="shares step 'a-try' with the loop that ends at 'a-try'") as raised:
        parse_toml_scenario(text, "not-yet.toml")
    assert raised.value.line == 25


def test_a_sleep_step_cannot_retry() -> None:
    text = NOT_YET.replace(
        'sql = "UPDATE t SET v = 1"', 'sleep = "1ms"\nretry = { on = ["40001"], from = "b-set", max = 1 }'
    )
    with pytest.raises(ScenarioError, match="a sleep step sends no SQL: it has no retry"):
        parse_toml_scenario(text, "not-yet.toml")
