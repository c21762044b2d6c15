"""Output files: ``-o`` (and ``--junit``) never write over a file the command reads; any other file is replaced.

A team runs ``pgrace run my.toml -o my.toml`` once by mistake and loses the scenario: the
write is refused before anything runs (exit 2, one line naming both files), whether the
output names the scenario itself, a symlink to it or a hard link. An unrelated existing
file is overwritten, as a shell's ``>`` would, and the help says so.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from pgrace.cli import main
from pgrace.frontends.catalog import shipped_dir
from pgrace.servers import ServerInfo


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(main, args, env={"PGRACE_DSN": ""})


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "my.toml"
    shutil.copy(shipped_dir() / "lost-update.toml", path)
    return path


def refused(result: Result, output: Path, source: Path) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    command = result.stderr.split(":")[1].strip()  # the command's name, as click's errors say it
    assert lines[0] == (
        f"pgrace: {command}: Invalid value for --output: {output} would write over {source}, which this command reads"
        f" (see pgrace {command} --help)"
    )


@pytest.mark.server
@pytest.mark.parametrize(
    ("shipped", "command"),
    [
        ("lost-update", ["run"]),
        ("lost-update", ["run", "--compare"]),
        ("lost-update", ["explore", "--max", "1"]),
        ("skip-locked-fanout", ["sweep", "-p", "workers=3,4"]),
        ("lost-update", ["load", "-t", "1", "-c", "1"]),
    ],
)
def test_an_output_naming_the_scenario_is_refused_and_the_scenario_kept(
    tmp_path: Path, shipped: str, command: list[str]
) -> None:
    scenario = tmp_path / "my.toml"
    shutil.copy(shipped_dir() / f"{shipped}.toml", scenario)
    before = scenario.read_bytes()
    result = invoke([*command, str(scenario), "-o", str(scenario)])
    refused(result, scenario, scenario)
    assert scenario.read_bytes() == before


@pytest.mark.server
@pytest.mark.parametrize("link", ["symlink", "hard link"])
def test_an_output_linked_to_the_scenario_is_refused(scenario: Path, tmp_path: Path, link: str) -> None:
    before = scenario.read_bytes()
    alias = tmp_path / "timeline.txt"
    if link == "symlink":
        alias.symlink_to(scenario)
    else:
        os.link(scenario, alias)
    refused(invoke(["run", str(scenario), "-o", str(alias)]), alias, scenario)
    assert scenario.read_bytes() == before


@pytest.mark.server
def test_junit_naming_a_checked_file_is_refused(scenario: Path) -> None:
    before = scenario.read_bytes()
    result = invoke(["check", str(scenario.parent), "--junit", str(scenario)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (
        f"pgrace: check: Invalid value for --junit: {scenario} would write over {scenario}, which this command reads"
        " (see pgrace check --help)"
    )
    assert scenario.read_bytes() == before


def test_explore_output_naming_a_shard_being_merged_is_refused(tmp_path: Path) -> None:
    shard = tmp_path / "shard.json"
    shard.write_text(json.dumps({"scenario": "lost-update", "variant": "bug", "space": 70, "explored": 0}))
    before = shard.read_bytes()
    result = invoke(["explore", "lost-update", "--merge", str(shard), "-o", str(shard)])
    refused(result, shard, shard)
    assert shard.read_bytes() == before


def test_another_existing_file_is_overwritten(scenario: Path, tmp_path: Path, pgrace_server: ServerInfo) -> None:
    out = tmp_path / "timeline.txt"
    out.write_text("an old timeline that is much longer than the new one will be " * 1000)
    result = invoke(["run", str(scenario), "-o", str(out), "--dsn", pgrace_server.dsn])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.startswith("lost-update (bug)")
    assert "an old timeline" not in text


@pytest.mark.parametrize("command", ["run", "explore", "sweep", "matrix", "load"])
def test_the_help_says_an_existing_file_is_overwritten(command: str) -> None:
    result = invoke([command, "--help"])
    assert "An existing FILE is overwritten, as a shell's > would; a file the command reads never is." in " ".join(
        result.output.split()
    )
