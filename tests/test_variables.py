"""``:variables``: found where PostgreSQL's lexer puts them, filled in safely; ``-p`` can never inject.

The injection cases are issue 9 finding 6, as reported: they run against a real server.
"""

from __future__ import annotations

import textwrap

import pytest

from pgrace.errors import ScenarioError
from pgrace.formats.scenario_toml import parse_toml_scenario
from pgrace.model import Scenario
from pgrace.pytest_plugin import RunScenario
from pgrace.timeline import Run, StepRun
from pgrace.variables import Value, find, substitute


def scenario(body: str, params: dict[str, str] | None = None, sessions: str = '["a", "b"]') -> Scenario:
    text = f"name = 'vars'\nsessions = {sessions}\n" + textwrap.dedent(body)
    return parse_toml_scenario(text, "vars.toml", params)


def by_name(run: Run) -> dict[str, StepRun]:
    return {s.step: s for s in run.step_runs()}


def rows_of(step: StepRun) -> list[tuple[object, ...]]:
    assert step.outcome is not None and step.outcome.error is None, step.outcome
    return [tuple(r) for r in (step.outcome.last_rows.rows if step.outcome.last_rows else ())]


def columns_of(step: StepRun) -> tuple[str, ...]:
    assert step.outcome is not None and step.outcome.last_rows is not None, step.outcome
    return step.outcome.last_rows.columns


# -- issue 9 finding 6: injection through -p -----------------------------------------------

HOSTILE = """
[params]
v = "harmless"

[[step]]
name = "dollar"
session = "a"
sql = "SELECT $$in dollar :v$$ AS d"

[[step]]
name = "comment"
session = "a"
sql = "SELECT 1 AS one -- comment :v"

[[step]]
name = "block-comment"
session = "a"
sql = "SELECT 2 AS two /* :v */"

[[step]]
name = "escape-string"
session = "a"
sql = "SELECT E'it\\\\'s :v' AS e"

[[step]]
name = "quoted-identifier"
session = "a"
sql = 'SELECT 3 AS ":v"'

[[step]]
name = "plain"
session = "a"
sql = "SELECT :v AS p"
"""


def test_a_param_inside_dollar_quotes_is_not_substituted(pgrace_run: RunScenario) -> None:
    run = pgrace_run(scenario(HOSTILE, {"v": "$$ AS d, current_user AS injected --"}))
    step = by_name(run)["dollar"]
    assert columns_of(step) == ("d",)
    assert rows_of(step) == [("in dollar :v",)]


def test_a_param_with_a_newline_in_a_comment_runs_no_second_statement(pgrace_run: RunScenario) -> None:
    run = pgrace_run(scenario(HOSTILE, {"v": "x\nSELECT current_user AS injected"}))
    steps = by_name(run)
    for name, column in [("comment", "one"), ("block-comment", "two"), ("quoted-identifier", ":v")]:
        step = steps[name]
        assert step.outcome is not None and len(step.outcome.results) == 1, (name, step.outcome)
        assert columns_of(step) == (column,), name
    assert rows_of(steps["escape-string"]) == [("it's :v",)]
    assert rows_of(steps["plain"]) == [("x\nSELECT current_user AS injected",)], "a value is one literal"
    sent = {s.step: s.sql for s in steps.values()}
    assert sent["dollar"] == "SELECT $$in dollar :v$$ AS d" and sent["comment"] == "SELECT 1 AS one -- comment :v"


@pytest.mark.parametrize(
    "value",
    ["'; SELECT 1 AS injected; --", "\\'; SELECT 1 AS injected; --", '"; SELECT 1 AS injected; --', "$$", "x\\"],
)
def test_every_form_of_a_hostile_value_stays_one_token(pgrace_run: RunScenario, value: str) -> None:
    run = pgrace_run(
        scenario(
            """
            [params]
            v = "harmless"
            [[step]]
            name = "forms"
            session = "a"
            sql = "SELECT :v AS a, :'v' AS b, x.:\\"v\\" AS c FROM (SELECT 1 AS :\\"v\\") AS x"
            """,
            {"v": value},
        )
    )
    step = by_name(run)["forms"]
    assert step.outcome is not None and len(step.outcome.results) == 1
    assert columns_of(step) == ("a", "b", "c")
    assert rows_of(step) == [(value, value, 1)]


# -- the lexer ---------------------------------------------------------------------------------


def written(text: str) -> list[str]:
    return [text[u.start : u.end] for u in find(text)]


def test_find_sees_variables_where_postgresql_sees_tokens() -> None:
    text = "SELECT :v, :'v', :\"v\", :w1.pid, :'w1.x', a::int, a[1:2], a[lo:hi], $$:v$$, E'\\':v', U&':v', /* :v */ x -- :v"
    assert written(text) == [":v", ":'v'", ':"v"', ":w1.pid", ":'w1.x'"]
    forms = [(u.form, u.session, u.name) for u in find(text)]
    assert forms == [
        ("value", None, "v"),
        ("literal", None, "v"),
        ("identifier", None, "v"),
        ("value", "w1", "pid"),
        ("literal", "w1", "x"),
    ]


def test_keywords_casts_and_plpgsql_assignments() -> None:
    assert written("BEGIN ISOLATION LEVEL :level") == [":level"]
    assert written("SELECT :n::int + 1") == [":n"]
    assert written("DO $$ BEGIN x := :v; END $$") == []
    assert written("SELECT 'unterminated :v") == [], "the server reports the syntax error"
    assert written("SELECT :'not a name', :\"\"") == []


def test_substitute_composes_with_psycopg_sql() -> None:
    values = {
        "level": Value("SERIALIZABLE", words=True),
        "v": Value("o'k"),
        "n": Value(-3),
        "w.pid": Value(1234),
        "t": Value(None),
    }
    text = "BEGIN ISOLATION LEVEL :level; SELECT :v, :'v', :\"v\", 1 - :n, :'n', :w.pid, :t, :'t' -- :v"
    assert substitute(text, values) == (
        "BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT 'o''k', 'o''k', \"o'k\", 1 -  -3, '-3', 1234, NULL, NULL -- :v"
    )
    assert substitute("SELECT :unknown", values) == "SELECT :unknown"


def test_a_param_value_with_a_nul_byte_is_refused_up_front() -> None:
    with pytest.raises(ScenarioError, match="NUL"):
        scenario(HOSTILE, {"v": "a\x00b"})
