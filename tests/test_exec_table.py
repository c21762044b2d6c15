"""A scenario file's ``[exec]`` table: its commands are the sessions of run, explore and check, without flags."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from pgrace.errors import ExecError, ScenarioError
from pgrace.frontends.scenario_toml import parse_toml_scenario, read_toml_scenario
from pgrace.model.scenario import Command
from pgrace.servers import ServerInfo

EXAMPLES = Path(__file__).parents[1] / "examples" / "any-language"

STORY = """\
name = "withdrawals"
setup = \"\"\"
CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, balance int NOT NULL);
INSERT INTO accounts VALUES (1, 'shared', 500);
\"\"\"
sessions = ["alice", "bob"]

[[step]]
session = "alice"
sql = "SELECT 1"

[[step]]
session = "bob"
sql = "SELECT 1"

[[check]]
description = "the balance is 400, not 300: a withdrawal was lost"
kind = "bug"
sql = "SELECT balance FROM accounts WHERE id = 1"
rows = [[400]]
"""


def _cli(*args: str) -> Any:
    from click.testing import CliRunner

    from pgrace.cli import main

    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture
def app(tmp_path: Path) -> Path:
    """A folder with the application (withdraw.py) beside the scenario file that runs it."""
    folder = tmp_path / "app"
    folder.mkdir()
    shutil.copy(EXAMPLES / "withdraw.py", folder / "withdraw.py")
    return folder


def _write(folder: Path, tail: str) -> Path:
    path = folder / "withdrawals.toml"
    path.write_text(STORY + tail, encoding="utf-8")
    return path


PYTHON = sys.executable


def test_the_table_in_both_forms_and_the_variant_over_it(app: Path) -> None:
    path = _write(
        app,
        f"""
[exec]
alice = "{PYTHON} withdraw.py"
bob = {{ command = "{PYTHON} withdraw.py", cwd = ".", env = {{ APP_MODE = "test" }} }}

[fix]
[[fix.check]]
sql = "SELECT balance FROM accounts WHERE id = 1"
rows = [[300]]

[fix.exec]
alice = "{PYTHON} withdraw.py --for-update"
carol = "true"
""",
    )
    scenario = read_toml_scenario(path)
    folder = str(app.resolve())
    source = str(path)
    assert scenario.commands == (
        Command("alice", f"{PYTHON} withdraw.py", folder, (), source, 23),
        Command("bob", f"{PYTHON} withdraw.py", folder, (("APP_MODE", "test"),), source, 24),
    )
    assert scenario.other is not None
    assert [(c.name, c.line) for c in scenario.other.commands] == [
        ("alice", f"{PYTHON} withdraw.py --for-update"),
        ("bob", f"{PYTHON} withdraw.py"),
        ("carol", "true"),
    ]


@pytest.mark.parametrize(
    ("tail", "line", "said"),
    [
        ("[exec]\n", 22, "[exec] holds NAME = "),
        ('[exec]\n"not a word" = "true"\n', 23, "command name 'not a word' must be a word"),
        ('[exec]\nalice = "  "\n', 23, "the command of 'alice' is empty"),
        ("[exec]\nalice = 3\n", 23, "[exec] holds NAME = "),
        ('[exec]\nalice = { comand = "true" }\n', 23, "unknown [exec] key 'comand' (did you mean 'command'?)"),
        ('[exec]\nalice = { cwd = "." }\n', 23, "missing command of 'alice'"),
        ('[exec]\nalice = { command = "true", cwd = "nowhere" }\n', 23, "cwd 'nowhere' of 'alice' is not a folder"),
        ('[exec]\nalice = { command = "true", env = { PGHOST = "x" } }\n', 23, "env cannot set PGHOST"),
        ('[exec]\nalice = { command = "true", env = { DATABASE_URL = "x" } }\n', 23, "env cannot set DATABASE_URL"),
        ('[exec]\nalice = { command = "true", env = { "A B" = "x" } }\n', 23, "'A B' is not a variable name"),
        ('[exec]\nalice = { command = "true", env = { A = 1 } }\n', 23, "env is a table of variables"),
        ('[fix]\n[fix.exec]\nalice = ""\n', 24, "the command of 'alice' is empty"),
    ],
)
def test_a_bad_entry_is_one_line_at_its_file_and_line(tmp_path: Path, tail: str, line: int, said: str) -> None:
    path = _write(tmp_path, "\n" + tail)
    with pytest.raises(ScenarioError) as raised:
        read_toml_scenario(path)
    assert str(raised.value).startswith(f"{path}:{line}: "), str(raised.value)
    assert said in str(raised.value)
    result = _cli("explore", str(path))  # the CLI: the same line, exit 2, before any server
    assert result.exit_code == 2
    assert result.stderr == f"pgrace: {raised.value}\n"


def test_no_commands_at_all_is_refused_where_commands_are_needed() -> None:
    from pgrace.drivers.exec import commands_for

    with pytest.raises(ScenarioError, match=r"at least one NAME=COMMAND, or an \[exec\] table"):
        commands_for(parse_toml_scenario(STORY, "s.toml"), [])


def test_run_and_check_use_the_table_with_no_flag_from_another_folder(
    pgrace_server: ServerInfo, app: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relative ``withdraw.py`` is found beside the file though pgrace runs elsewhere; check --explore finds
    the bug with the [exec] commands and proves the cure with [fix.exec]'s, in every order."""
    path = _write(
        app,
        f"""
[exec]
alice = "{PYTHON} withdraw.py"
bob = "{PYTHON} withdraw.py"

[fix]
[[fix.check]]
description = "both withdrawals count"
sql = "SELECT balance FROM accounts WHERE id = 1"
rows = [[300]]

[fix.exec]
alice = "{PYTHON} withdraw.py --for-update"
bob = "{PYTHON} withdraw.py --for-update"
""",
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    dsn = ("--dsn", pgrace_server.dsn)
    ran = _cli("run", str(path), "--fix", "--format", "json", *dsn)
    assert ran.exit_code == 0, ran.output
    assert '"alice#1"' in ran.output and '"bob#1"' in ran.output
    checked = _cli("check", "--explore", str(path), *dsn)
    assert checked.exit_code == 0, checked.output
    assert "2 checks: 2 passed, 0 failed" in checked.output


def test_exec_on_the_command_line_replaces_a_name_and_adds_others(pgrace_server: ServerInfo, app: Path) -> None:
    """The file's alice fails at once; --exec alice=... replaces her, --exec bob=... adds him: a clean run whose
    sessions are the two withdrawals (the first ready goes: Alice's ends before Bob's, 300 left)."""
    path = _write(app, '\n[exec]\nalice = "exit 3"\n')
    withdraw = f"{PYTHON} {EXAMPLES / 'withdraw.py'}"
    alone = _cli("run", str(path), "--format", "json", "--dsn", pgrace_server.dsn)
    assert '"exit 3"' in alone.output
    both = _cli(
        "run", str(path), "--exec", f"alice={withdraw}", "--exec", f"bob={withdraw}", "--format", "json",
        "--dsn", pgrace_server.dsn,
    )  # fmt: skip
    assert both.exit_code == 1, both.output  # the bug's signature (400) does not hold: 300
    assert '"exit 3"' not in both.output
    assert '"alice#1"' in both.output and '"bob#1"' in both.output and "300" in both.output


def test_a_command_that_cannot_start_names_its_file_and_line(pgrace_server: ServerInfo, app: Path) -> None:
    from pgrace.drivers.exec import run_commands

    path = _write(app, '\n[exec]\nalice = "true"\n')
    scenario = read_toml_scenario(path)
    shutil.rmtree(app)  # its folder went away after the file was read
    with pytest.raises(ExecError) as raised:
        run_commands(scenario, [], pgrace_server)
    assert str(raised.value).startswith(f"{path}:23: cannot start command 'alice' in {app.resolve()}: ")


@pytest.mark.parametrize(
    ("option", "why"),
    [
        (["--shard", "1/2"], "not yet split into shards"),
        (["-j", "2"], "not yet split across processes"),
        (["--minimize"], "a command's statements are its code"),
    ],
)
def test_exploring_commands_refuses_what_it_cannot_do_and_says_why(app: Path, option: list[str], why: str) -> None:
    """Refused in one line before any server starts, whether the commands come from [exec] or --exec."""
    path = _write(app, '\n[exec]\nalice = "true"\n')
    for extra in ([], ["--exec", "bob=true"]):
        result = _cli("explore", str(path), *option, *extra)
        assert result.exit_code == 2
        [line] = result.stderr.splitlines()
        assert line.startswith(f"pgrace: explore: {option[0]} with commands (--exec, [exec]): ") and why in line


def test_golden_timelines_of_a_file_of_commands(pgrace_server: ServerInfo, app: Path) -> None:
    """check --golden compares a run of commands' timeline as a run of steps', NAME.VARIANT.out beside the file."""
    path = _write(app, f'\n[exec]\nalice = "{PYTHON} withdraw.py"\nbob = "{PYTHON} withdraw.py"\n')
    dsn = ("--dsn", pgrace_server.dsn)
    written = _cli("check", "--golden", "--update", str(path), *dsn)
    golden = app / "withdrawals.bug.out"
    assert golden.is_file(), written.output
    text = golden.read_text(encoding="utf-8")
    assert "alice#1" in text and "bob#1" in text and "got (300)" in text
    again = _cli("check", "--golden", str(path), *dsn)
    assert "timeline differs" not in again.output, again.output
    golden.write_text(text.replace("got (300)", "got (200)"), encoding="utf-8")
    changed = _cli("check", "--golden", str(path), *dsn)
    assert changed.exit_code == 1 and "timeline differs" in changed.output


def test_show_lists_the_commands_with_their_folder_and_hostile_text_made_visible(app: Path) -> None:
    path = _write(app, '\n[exec]\nalice = "python withdraw.py \\u001b[2J"\n')
    shown = _cli("show", str(path))
    assert shown.exit_code == 0
    assert f"  alice      python withdraw.py ␛[2J  (in {app.resolve()})\n" in shown.output
    assert "\x1b" not in shown.output


def test_the_python_api_runs_a_files_commands_with_none_given(pgrace_server: ServerInfo, app: Path) -> None:
    from pgrace import proxy

    path = _write(app, f'\n[exec]\nalice = "{PYTHON} withdraw.py"\n')
    run = proxy.run_exec(read_toml_scenario(path), server=pgrace_server)
    assert [s.session for s in run.scenario.steps] == ["alice#1"] * 4
