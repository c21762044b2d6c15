"""A shipped scenario works for every value its params allow, in both variants.

A param the file bounds (``workers = { default = 3, min = 3, max = 32 }``) is refused
outside its range, at once and by name; inside it, both variants run with every
expectation holding, at the bounds and at the default. A group member a variant names
but the group lacks this time (``worker3`` of two workers) is reported as such, not
with a "did you mean 'worker'?".
"""

from __future__ import annotations

import re
import tomllib

import pytest
from click.testing import CliRunner

from pgrace import api
from pgrace.cli import main
from pgrace.errors import ScenarioError
from pgrace.frontends import catalog
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.servers import ServerInfo


def bounded_params() -> list[tuple[str, str, int]]:
    """(scenario, param, value) at each bound and the default of every bounded param of a shipped scenario."""
    cases = []
    for name in catalog.shipped_names():
        text = (catalog.shipped_dir() / f"{name}.toml").read_text()
        for param, declared in tomllib.loads(text).get("params", {}).items():
            if isinstance(declared, dict) and "min" in declared:
                for value in sorted({declared["min"], declared["default"], declared["max"]}):
                    cases.append((name, param, value))
    return cases


def test_every_whole_number_param_that_sizes_a_group_is_bounded() -> None:
    """Otherwise nothing stops a value for which a variant names a session the group does not have."""
    for name in catalog.shipped_names():
        data = tomllib.loads((catalog.shipped_dir() / f"{name}.toml").read_text())
        for session in data.get("sessions", []):
            if isinstance(session, dict) and isinstance(session.get("count"), str):
                declared = data["params"][session["count"]]
                assert isinstance(declared, dict) and {"min", "max"} <= set(declared), (name, session)


@pytest.mark.parametrize(("scenario", "param", "value"), bounded_params())
@pytest.mark.parametrize("variant", ["bug", "fix"])
def test_both_variants_hold_across_the_range(
    pgrace_server: ServerInfo, scenario: str, param: str, value: int, variant: str
) -> None:
    chosen = catalog.variant(catalog.read_scenario(scenario, {param: str(value)}), variant)
    result = api.run(chosen, server=pgrace_server)
    assert result.ok


@pytest.mark.server
@pytest.mark.parametrize("value", ["1", "33", "-1", "0"])
def test_a_value_outside_the_range_is_refused_by_name(value: str) -> None:
    result = CliRunner().invoke(main, ["run", "skip-locked-fanout", "-p", f"workers={value}"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().endswith(
        f"skip-locked-fanout.toml: param 'workers' is a whole number from 2 to 32 in this scenario, not '{value}'"
    )


@pytest.mark.parametrize("variant", ["--fix", "--bug"])
def test_two_workers_the_smallest_queue_a_story_tells_run(pgrace_server: ServerInfo, variant: str) -> None:
    """ "I replayed it on a table with two workers": both variants take two workers, each expectation holding."""
    args = ["run", "skip-locked-fanout", variant, "-p", "workers=2", "--dsn", pgrace_server.dsn]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "verdict: ✔ all" in result.stdout


def test_every_param_value_a_shipped_scenario_suggests_is_accepted() -> None:
    """A scenario's own prose ("run it with -p workers=6") names a value its range allows, in both variants."""
    suggested = 0
    for name in catalog.shipped_names():
        text = (catalog.shipped_dir() / f"{name}.toml").read_text()
        for param, value in re.findall(r"-p (\w+)=(\w+)", text):
            suggested += 1
            loaded = catalog.read_scenario(
                name, {param: value}
            )  # builds every variant: one naming a missing session fails
            assert all(dict(catalog.variant(loaded, v).params)[param] == int(value) for v in loaded.variants)
    assert suggested


GROUP_OF_TWO = """
sessions = [{ name = "worker", count = "workers" }]
[params]
workers = 2
[[step]]
session = "worker3"
sql = "SELECT 1"
"""


def test_a_group_member_beyond_the_count_is_named_as_such() -> None:
    with pytest.raises(ScenarioError) as raised:
        parse_toml_scenario(GROUP_OF_TWO, "two.toml")
    assert raised.value.line == 6
    assert raised.value.message == (
        "session 'worker3' is not one of the 2 sessions of group 'worker' (worker1, worker2); give the group"
        " at least 3, or bound its count param with { default = ..., min = ... }"
    )


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ("{ default = 3, min = 4, max = 8 }", "param 'workers': min <= default <= max does not hold"),
        ('{ default = "3", min = 1, max = 8 }', "param 'workers': default, min and max are whole numbers"),
        ("{ default = 3, min = 1 }", "param 'workers': default, min and max are whole numbers"),
        ("{ default = 3, min = 1, max = 8, step = 2 }", "unknown key of param 'workers' 'step'"),
    ],
)
def test_a_malformed_bound_is_refused_at_its_line(declared: str, message: str) -> None:
    text = GROUP_OF_TWO.replace("workers = 2", f"workers = {declared}").replace("worker3", "worker1")
    with pytest.raises(ScenarioError) as raised:
        parse_toml_scenario(text, "bounds.toml")
    assert raised.value.line == 4
    assert raised.value.message.startswith(message), raised.value.message
