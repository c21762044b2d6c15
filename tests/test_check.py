"""`pgrace check`: a folder of scenarios as regression checks, golden timelines, JUnit, server matrix."""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from fix_servers import PG15, needs_pg15

from pgrace.cli import main
from pgrace.frontends import catalog
from pgrace.servers import ServerInfo

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def check(server: ServerInfo, *args: str) -> Result:
    return CliRunner().invoke(main, ["check", "--dsn", server.dsn, *args])


@pytest.fixture
def scenarios(tmp_path: Path) -> Path:
    """A copy of the shipped scenarios (with their golden timelines) that a test may edit."""
    return Path(shutil.copytree(SCENARIOS, tmp_path / "scenarios"))


def test_the_shipped_scenarios_pass_with_their_golden_timelines(pgrace_server: ServerInfo) -> None:
    result = check(pgrace_server, "--golden", str(SCENARIOS))
    assert result.exit_code == 0, result.output
    cases = sum(len(catalog.read_scenario(n).variants) for n in catalog.shipped_names())
    assert result.output.count("PASS  ") == cases
    assert result.output.endswith(f"{cases} checks: {cases} passed, 0 failed\n")


def test_a_broken_expectation_fails_and_says_which_step_and_what_differed(
    pgrace_server: ServerInfo, scenarios: Path
) -> None:
    story = scenarios / "lost-update.toml"
    story.write_text(
        story.read_text().replace(
            "expect = { waits = false, rows = [[500]] }", "expect = { waits = true, rows = [[500]] }"
        )
    )
    result = check(pgrace_server, str(scenarios))
    assert result.exit_code == 1
    assert "FAIL  lost-update (bug)" in result.output
    line = next(i + 1 for i, text in enumerate(story.read_text().splitlines()) if text == 'name = "bob-read"') - 1
    assert f"✘ line {line}: bob-read: waits: expected a wait, got no wait" in result.output
    assert "PASS  lost-update (fix)" in result.output  # the other variant still holds


def test_golden_timelines_catch_a_changed_timeline_and_update_rewrites_them(
    pgrace_server: ServerInfo, scenarios: Path
) -> None:
    golden = scenarios / "nowait.bug.out"
    golden.write_text(golden.read_text().replace("55P03", "55000"))
    result = check(pgrace_server, "--golden", str(scenarios / "nowait.toml"))
    assert result.exit_code == 1
    assert "timeline differs from" in result.output
    assert re.search(r"^\+ +✗ ERROR 55P03", result.output, re.MULTILINE)  # the unified diff
    updated = check(pgrace_server, "--update", str(scenarios / "nowait.toml"))
    assert updated.exit_code == 0 and "1 golden timeline written" in updated.output
    assert check(pgrace_server, "--golden", str(scenarios / "nowait.toml")).exit_code == 0


def test_a_missing_golden_timeline_is_a_failure_that_says_how_to_write_it(
    pgrace_server: ServerInfo, scenarios: Path
) -> None:
    (scenarios / "nowait.fix.out").unlink()
    result = check(pgrace_server, "--golden", str(scenarios / "nowait.toml"))
    assert result.exit_code == 1
    assert "run with --update to write it" in result.output


def test_junit_has_one_case_per_scenario_variant(pgrace_server: ServerInfo, tmp_path: Path, scenarios: Path) -> None:
    (scenarios / "offset-overlock.toml").write_text(
        (scenarios / "offset-overlock.toml").read_text().replace("rows = [[3]]", "rows = [[4]]")
    )
    report = tmp_path / "out.xml"
    result = check(pgrace_server, "--junit", str(report), str(scenarios))
    assert result.exit_code == 1
    root = ET.parse(report).getroot()
    cases = root.findall("./testsuite/testcase")
    names = sorted(c.get("name") or "" for c in cases)
    expected = sorted(f"{n} ({v})" for n in catalog.shipped_names() for v in catalog.read_scenario(n).variants)
    assert names == expected
    failures = [c for c in cases if c.find("failure") is not None]
    assert [c.get("name") for c in failures] == ["offset-overlock (bug)"]
    assert "claim: returns (4)" in (failures[0].find("failure").text or "")  # type: ignore[union-attr]
    assert root.get("tests") == str(len(expected)) and root.get("failures") == "1"


def test_isolation_specs_are_checked_against_their_expected_output(pgrace_server: ServerInfo) -> None:
    specs = Path(__file__).parent / "specs"
    result = check(pgrace_server, str(specs))
    assert result.exit_code == 0, result.output
    assert result.output.count("PASS  ") == len(list(specs.glob("*.spec")))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no/such/dir"], "no/such/dir: no such file or directory"),
        (
            ["--expected", "x.out", "scenarios", "tests/specs"],
            "check: Invalid value for --expected: needs exactly one spec file",
        ),
    ],
)
def test_invalid_input_exits_2_before_any_server_starts(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["check", "--dsn", "host=/nonexistent", *args])
    assert result.exit_code == 2
    assert message in result.stderr


def test_a_folder_of_malformed_files_is_invalid_input_without_a_server(tmp_path: Path) -> None:
    (tmp_path / "broken.toml").write_text('sessions = ["a"]\n[[step]]\nsession = "a"\n')
    result = CliRunner().invoke(main, ["check", "--dsn", "host=/nonexistent", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stdout == f"INVALID  {tmp_path / 'broken.toml'}:2: missing step sql\n"
    assert result.stderr == f"pgrace: no valid scenario files under {tmp_path}\n"


@needs_pg15
def test_several_servers_give_a_side_by_side_table_with_their_versions(pgrace_server: ServerInfo) -> None:
    result = CliRunner().invoke(
        main, ["check", "-q", "--server", pgrace_server.dsn, "--server", str(PG15), str(SCENARIOS / "nowait.toml")]
    )
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if line.startswith("scenario"))
    assert pgrace_server.version in header and "PostgreSQL 15." in header
    assert "nowait (bug)" in result.output and "4 checks: 4 passed, 0 failed" in result.output
