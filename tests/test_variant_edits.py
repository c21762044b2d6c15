"""A variant that adds or drops a step without copying the step list: ``[[fix.insert]]`` and ``fix.drop``.

``[fix.step.NAME]`` changes one step and ``[[fix.step]]`` replaces the list; a cure that needs
one more statement (a lock taken first) or one fewer would copy every step. Instead the fix
names what it adds, ``after`` or ``before`` a step of the base list, and what it drops;
``pgrace show`` says what the variant changed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from pgrace import api
from pgrace.cli import main
from pgrace.errors import ScenarioError
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.servers import ServerInfo

COUNTER = """name = "counter"
title = "two requests count a visit each"
setup = "CREATE TABLE counter (n int NOT NULL); INSERT INTO counter VALUES (0)"
sessions = ["r1", "r2"]

[[step]]
name = "r1-begin"
session = "r1"
sql = "BEGIN"
[[step]]
name = "r1-read"
session = "r1"
sql = "SELECT n FROM counter"
capture = { n = "n" }
[[step]]
name = "r2-read"
session = "r2"
sql = "SELECT n FROM counter"
capture = { n = "n" }
[[step]]
name = "r1-write"
session = "r1"
sql = "UPDATE counter SET n = :n + 1; COMMIT"
[[step]]
name = "r2-write"
session = "r2"
sql = "UPDATE counter SET n = :n + 1"

[[check]]
description = "a visit was lost"
sql = "SELECT n FROM counter"
rows = [[1]]

[fix]
title = "r2 locks the row first"
drop = ["r2-read"]

[[fix.insert]]
name = "r2-lock"
session = "r2"
after = "r1-read"
sql = "BEGIN; SELECT n FROM counter FOR UPDATE"
capture = { n = "n" }

[fix.step.r1-write]
sql = "UPDATE counter SET n = n + 1; COMMIT"

[fix.step.r2-write]
sql = "UPDATE counter SET n = n + 1; COMMIT"

[[fix.check]]
description = "both visits count"
sql = "SELECT n FROM counter"
rows = [[2]]
"""


def test_the_fix_inserts_and_drops_steps_of_the_base_list(pgrace_server: ServerInfo) -> None:
    fix = parse_toml_scenario(COUNTER, "counter.toml").variant_named("fix")
    assert [s.name for s in fix.steps] == ["r1-begin", "r1-read", "r2-lock", "r1-write", "r2-write"]
    assert fix.changes == (
        "step r1-write: sql changed",
        "step r2-write: sql changed",
        "step r2-read dropped",
        "step r2-lock inserted after r1-read",
    )
    assert api.run(fix, server=pgrace_server).ok


def test_show_says_what_the_variant_changed(tmp_path: Path) -> None:
    path = tmp_path / "counter.toml"
    path.write_text(COUNTER)
    shown = CliRunner().invoke(main, ["show", str(path), "--fix"]).stdout
    assert "what the fix changes in the bug:\n  step r1-write: sql changed\n" in shown
    assert "  step r2-read dropped\n  step r2-lock inserted after r1-read\n" in shown
    assert "what the" not in CliRunner().invoke(main, ["show", str(path)]).stdout


def test_before_puts_the_step_before_the_first_of_a_group() -> None:
    text = COUNTER.replace('after = "r1-read"', 'before = "r1-begin"').replace('drop = ["r2-read"]', "")
    fix = parse_toml_scenario(text, "counter.toml").variant_named("fix")
    assert [s.name for s in fix.steps][:2] == ["r2-lock", "r1-begin"]


@pytest.mark.parametrize(
    ("change", "line", "message"),
    [
        (('after = "r1-read"', ""), 38, 'an inserted step says where it goes: after = "NAME" or before = "NAME"'),
        (('after = "r1-read"', 'after = "r1-read"\nbefore = "r1-read"'), 38, "an inserted step says where it goes"),
        (
            ('after = "r1-read"', 'after = "r1-raed"'),
            41,
            "goes after 'r1-raed', which is no step (did you mean 'r1-read'?)",
        ),
        (('name = "r2-lock"', 'name = "r1-write"'), 39, "inserted step 'r1-write' has the name of a step the list has"),
        (('name = "r2-lock"\n', ""), 38, "an inserted step needs a name"),
        (
            ('drop = ["r2-read"]', 'drop = ["r2-raed"]'),
            36,
            "fix.drop names no step 'r2-raed' (did you mean 'r2-read'?)",
        ),
        (
            ('drop = ["r2-read"]', 'drop = ["r1-begin", "r1-read", "r2-read", "r1-write", "r2-write"]'),
            36,
            "fix.drop leaves no step to run",
        ),
    ],
)
def test_a_wrong_edit_is_refused_at_its_line(change: tuple[str, str], line: int, message: str) -> None:
    old, new = change
    assert old in COUNTER
    with pytest.raises(ScenarioError) as raised:
        parse_toml_scenario(COUNTER.replace(old, new, 1), "counter.toml")
    assert message in raised.value.message, raised.value.message
    assert raised.value.line == line, (raised.value.line, raised.value.message)


REPLACED = """
sessions = ["a"]
[[step]]
name = "one"
session = "a"
sql = "SELECT 1"
[fix]
drop = ["one"]
[[fix.step]]
session = "a"
sql = "SELECT 2"
"""


def test_a_replaced_list_cannot_also_be_edited() -> None:
    with pytest.raises(ScenarioError, match=r"\[\[fix.step\]\] replaces the whole step list; fix.insert and fix.drop"):
        parse_toml_scenario(REPLACED, "replaced.toml")
