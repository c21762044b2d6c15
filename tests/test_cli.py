"""The command line: exit codes, stdout and stderr apart, help for every command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pgrace.cli import main
from pgrace.frontends import catalog
from pgrace.servers import ServerInfo


@pytest.fixture
def cli() -> CliRunner:
    return CliRunner()


def test_every_command_has_help(cli: CliRunner) -> None:
    result = cli.invoke(main, ["--help"])
    assert result.exit_code == 0
    listed = result.output.split("Commands:")[1].strip().split("\n\n")[0]  # the exit codes follow
    commands = [line.split()[0] for line in listed.splitlines()]
    assert {"list", "show", "run"} <= set(commands)
    for command in commands:
        help_result = cli.invoke(main, [command, "--help"])
        assert help_result.exit_code == 0, command
        assert "Usage: " in help_result.output


def test_list_names_every_shipped_scenario_on_one_line(cli: CliRunner) -> None:
    result = cli.invoke(main, ["list"])
    assert result.exit_code == 0
    scenarios = result.output.split("\ntags (")[0]  # then the tags to filter by
    lines = [line for line in scenarios.splitlines() if line.startswith("  ")]  # topics are not indented
    assert sorted(line.split()[0] for line in lines) == catalog.shipped_names()


def test_show_prints_story_and_steps_without_a_server(cli: CliRunner) -> None:
    result = cli.invoke(main, ["show", "head-of-line-blocking"], env={"PGRACE_DSN": "host=/nonexistent"})
    assert result.exit_code == 0
    assert "worker 2" in result.output.lower()
    assert "FOR UPDATE LIMIT 1" in result.output
    assert "--fix" in result.output


def test_run_json_follows_the_contract(cli: CliRunner, pgrace_server: ServerInfo) -> None:
    result = cli.invoke(main, ["run", "head-of-line-blocking", "--format", "json", "--dsn", pgrace_server.dsn])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"scenario", "variant", "server_version", "sessions", "steps", "checks", "ok"} <= data.keys()
    assert data["variant"] == "bug" and data["ok"] is True
    step = data["steps"][0]
    for key in [
        "index",
        "session",
        "sql",
        "status",
        "waited",
        "blocked_by",
        "waited_on",
        "columns",
        "rows",
        "error",
        "locks_after",
        "started_ms",
        "wait_detected_ms",
        "finished_ms",
    ]:
        assert key in step, key
    assert all(set(c) >= {"description", "ok"} for c in data["checks"])


def test_run_text_is_deterministic_and_ends_with_a_verdict(cli: CliRunner, pgrace_server: ServerInfo) -> None:
    args = ["run", "lost-update", "--fix", "--dsn", pgrace_server.dsn]
    first = cli.invoke(main, args)
    second = cli.invoke(main, args)
    assert first.exit_code == 0
    assert first.output == second.output
    assert "⏳ waits for alice on row accounts id=1" in first.output
    assert "final state:\n  SELECT balance FROM accounts WHERE id = 1  → balance=300\n" in first.output
    assert "verdict: ✔ all" in first.output
    assert "\x1b[" not in first.output  # no colour when not on a terminal


@pytest.mark.server
def test_unknown_scenario_is_invalid_input_with_a_hint(cli: CliRunner) -> None:
    result = cli.invoke(main, ["run", "lost-updat"])
    assert result.exit_code == 2
    assert result.stderr.startswith("pgrace: no shipped scenario 'lost-updat' (did you mean 'lost-update'?)")
    assert result.stdout == ""


@pytest.mark.server
def test_malformed_file_gives_one_line_with_file_and_line_and_exit_2(cli: CliRunner, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('sessions = ["alice", "bob"]\n[[step]]\nsession = "alcie"\nsql = "SELECT 1"\n')
    result = cli.invoke(main, ["run", str(bad)])
    assert result.exit_code == 2
    assert result.stderr == f"pgrace: {bad}:3: unknown session 'alcie' (did you mean 'alice'?)\n"
    assert "Traceback" not in result.output


def test_failed_expectation_exits_1_and_says_what_differed(
    cli: CliRunner, tmp_path: Path, pgrace_server: ServerInfo
) -> None:
    story = tmp_path / "wrong.toml"
    story.write_text(
        'setup = "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)"\n'
        'sessions = ["a", "b"]\n'
        '[[step]]\nsession = "a"\nsql = "BEGIN"\n'
        '[[step]]\nsession = "a"\nsql = "SELECT id FROM t FOR UPDATE"\n'
        '[[step]]\nname = "nowait"\nsession = "b"\nsql = "SELECT id FROM t FOR UPDATE NOWAIT"\n'
        "expect = { error = false }\n"
    )
    result = cli.invoke(main, ["run", str(story), "--dsn", pgrace_server.dsn])
    assert result.exit_code == 1
    assert "✘ nowait: succeeds: expected no error, got 55P03" in result.output


def test_unreachable_server_exits_3_naming_the_address_but_not_the_password(cli: CliRunner) -> None:
    result = cli.invoke(main, ["run", "nowait", "--dsn", "postgresql://me:s3cret@127.0.0.1:1/db"])
    assert result.exit_code == 3
    assert "127.0.0.1" in result.stderr and "s3cret" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.server
def test_invalid_options_are_click_usage_errors(cli: CliRunner) -> None:
    assert cli.invoke(main, ["run", "nowait", "--format", "yaml"]).exit_code == 2
    assert cli.invoke(main, ["run", "nowait", "--pace", "-1"]).exit_code == 2
    result = cli.invoke(main, ["run", "nowait", "--fix", "--bug"])
    assert result.exit_code == 2


@pytest.mark.server
def test_missing_variant_is_invalid_input(cli: CliRunner, tmp_path: Path) -> None:
    story = tmp_path / "plain.toml"
    story.write_text('sessions = ["a"]\n[[step]]\nsession = "a"\nsql = "SELECT 1"\n')
    result = cli.invoke(main, ["run", str(story), "--fix"])
    assert result.exit_code == 2
    assert "has no fix variant" in result.stderr


def test_pace_plays_the_scenario_live(cli: CliRunner, pgrace_server: ServerInfo) -> None:
    result = cli.invoke(main, ["run", "nowait", "--pace", "0.01", "--dsn", pgrace_server.dsn])
    assert result.exit_code == 0
    assert "could not obtain lock on row" in result.output
    assert "verdict: ✔" in result.output


def test_step_mode_waits_for_enter_before_each_step(cli: CliRunner, pgrace_server: ServerInfo) -> None:
    steps = len(catalog.read_scenario("nowait").steps)
    result = cli.invoke(main, ["run", "nowait", "--step", "--dsn", pgrace_server.dsn], input="\n" * steps)
    assert result.exit_code == 0, result.output
    assert result.output.count("▶ next:") == steps


def test_params_reach_the_scenario(cli: CliRunner, pgrace_server: ServerInfo) -> None:
    result = cli.invoke(
        main, ["run", "skip-locked-fanout", "-p", "workers=4", "--format", "json", "--dsn", pgrace_server.dsn]
    )
    assert result.exit_code == 0
    assert json.loads(result.stdout)["sessions"] == ["worker1", "worker2", "worker3", "worker4"]
    bad = cli.invoke(main, ["run", "skip-locked-fanout", "-p", "workers"])
    assert bad.exit_code == 2
