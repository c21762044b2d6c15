"""pgrace's scenario format: what it accepts, and the one-line errors for what it does not."""

from __future__ import annotations

import textwrap

import pytest

from pgrace.errors import ScenarioError
from pgrace.frontends.scenario_toml import parse_toml_scenario

MINIMAL = """
title = "two sessions"
setup = "CREATE TABLE t (id int PRIMARY KEY, v int)"
sessions = ["a", "b"]

[[step]]
session = "a"
sql = "BEGIN"

[[step]]
name = "read"
session = "b"
sql = "SELECT v FROM t WHERE id = 1"
capture = "v"
expect = { waits = false, rows = [[1]] }

[[step]]
session = "b"
sql = "UPDATE t SET v = :v + 1"
"""


def parse(text: str, params: dict[str, str] | None = None, name: str = "story.toml"):  # type: ignore[no-untyped-def]
    return parse_toml_scenario(textwrap.dedent(text), name, params)


def error_of(text: str, params: dict[str, str] | None = None) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        parse(text, params)
    return info.value


def test_a_minimal_scenario_becomes_one_permutation_in_file_order() -> None:
    scenario = parse(MINIMAL)
    assert scenario.name == "story"
    assert scenario.session_names == ["a", "b"]
    assert [s.name for s in scenario.steps] == ["a-1", "read", "b-2"]
    assert [p.step for p in scenario.permutations[0]] == ["a-1", "read", "b-2"]
    assert scenario.step("read").capture == (("v", "v"),)
    assert scenario.step("read").expect.rows == ((1,),)
    assert scenario.other is None


def test_fix_variant_overrides_named_steps_and_checks() -> None:
    scenario = parse(
        MINIMAL
        + """
[[check]]
sql = "SELECT v FROM t"
rows = [[2]]

[fix]
title = "cured"
[fix.step.read]
sql = "SELECT v FROM t WHERE id = 1 FOR UPDATE"
expect = { waits_for = "a" }
[[fix.check]]
description = "fixed"
sql = "SELECT 1"
rows = [[1]]
"""
    )
    fix = scenario.variant_named("fix")
    assert fix.variant == "fix" and fix.title == "cured"
    assert fix.step("read").sql.endswith("FOR UPDATE")
    assert fix.step("read").expect.waits_for == ("a",)
    assert fix.step("read").capture == (("v", "v"),)  # untouched fields carry over
    assert [c.description for c in fix.checks] == ["fixed"]
    assert scenario.checks[0].description == "SELECT v FROM t"
    with pytest.raises(KeyError):
        fix.variant_named("bug")  # the variant objects do not nest


def test_a_file_whose_main_story_is_the_cure_names_the_bug_variant() -> None:
    scenario = parse(
        MINIMAL.replace('title = "two sessions"', 'title = "x"\nvariant = "fix"') + "\n[bug]\ntitle = 'b'\n"
    )
    assert scenario.variants == ("fix", "bug")


def test_session_groups_expand_with_params_and_steps_fan_out() -> None:
    text = """
    sessions = [{ name = "worker", count = "workers" }]
    [params]
    workers = 2
    [[step]]
    name = "claim"
    session = "worker"
    sql = "SELECT :workers"
    [[step]]
    name = "others"
    session = "worker*"
    except = ["worker1"]
    sql = "SELECT 1"
    """
    scenario = parse(text)
    assert scenario.session_names == ["worker1", "worker2"]
    assert [s.name for s in scenario.steps] == ["claim.worker1", "claim.worker2", "others.worker2"]
    bigger = parse(text, {"workers": "4"})
    assert bigger.session_names == ["worker1", "worker2", "worker3", "worker4"]
    assert dict(bigger.params) == {"workers": 4}


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("title = \n", 1, "invalid TOML"),
        (
            'sessions = ["a"]\n[[step]]\nsesion = "a"\nsql = "x"\n',
            3,
            "unknown step key 'sesion' (did you mean 'session'?)",
        ),
        (
            'sessions = ["alice"]\n[[step]]\nsession = "alcie"\nsql = "x"\n',
            3,
            "unknown session 'alcie' (did you mean 'alice'?)",
        ),
        ('sessions = ["a"]\n\n[[step]]\nsession = "a"\n', 3, "missing step sql"),
        ('sessions = ["a"]\n[[step]]\nsession = "a"\nsql = "x"\nexpect = { error = "5P03" }\n', 5, "SQLSTATE"),
        (
            'sessions = ["a", "b"]\n[[step]]\nsession = "a"\nsql = "x"\n\n[[step]]\nsession = "b"\nsql = "SELECT :id"\n',
            8,
            ":id",
        ),
        ("sessions = []\n", 1, "sessions must be a non-empty list"),
        ('titel = "x"\nsessions = ["a"]\n[[step]]\nsession = "a"\nsql = "x"\n', 1, "did you mean 'title'?"),
        ('sessions = ["a"]\n[[step]]\nsession = "a"\nsql = "x"\n[fix.step.nope]\nsql = "y"\n', 5, "names no step"),
        ('sessions = ["a"]\n[[step]]\nsession = "a"\nsql = "x"\n[[check]]\nsql = "SELECT 1"\n', 5, "needs rows"),
    ],
)
def test_malformed_files_name_the_line_and_the_problem(text: str, line: int, message: str) -> None:
    error = error_of(text)
    assert error.file == "story.toml"
    assert error.line == line, str(error)
    assert message in error.message
    assert str(error).startswith(f"story.toml:{line}: ")
    assert "\n" not in str(error)


def test_unknown_param_on_the_command_line_is_named_with_a_hint() -> None:
    error = error_of('sessions = ["a"]\n[params]\nworkers = 3\n[[step]]\nsession = "a"\nsql = "x"\n', {"worker": "2"})
    assert "unknown param 'worker' (did you mean 'workers'?)" in error.message


def test_param_values_are_converted_to_the_type_of_their_default() -> None:
    error = error_of(
        'sessions = ["a"]\n[params]\nworkers = 3\n[[step]]\nsession = "a"\nsql = "x"\n', {"workers": "many"}
    )
    assert "param 'workers' must be a whole number, not 'many'" in error.message


def test_variables_are_scoped_to_their_session() -> None:
    text = """
    sessions = ["a", "b"]
    [[step]]
    session = "a"
    sql = "SELECT 1 AS x"
    capture = "x"
    [[step]]
    session = "b"
    sql = "SELECT :x"
    """
    assert "no earlier step of session 'b' captures" in error_of(text).message


def test_casts_and_quoted_colons_are_not_variables() -> None:
    scenario = parse(
        """
        sessions = ["a"]
        [[step]]
        session = "a"
        sql = "SELECT '1:2'::text, ':nope', \\"a:b\\""
        """
    )
    assert scenario.steps[0].sql.startswith("SELECT '1:2'::text")
