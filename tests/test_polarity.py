"""No false proofs: an error no step declares fails every proof, and a check's polarity decides its words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pgrace.cli import main
from pgrace.drivers.explore import explore
from pgrace.errors import ScenarioError
from pgrace.frontends import catalog
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.render.json import run_to_dict
from pgrace.servers import ServerInfo
from tools.record_runs import load_run

HERE = Path(__file__).parent
UNIQUE_CURE = HERE / "explore" / "unique-cure.toml"  # checks hold in every order; b's insert fails with 23505 in one
LOST_INCREMENT = HERE / "explore" / "lost-increment.toml"  # no fix; its check is the invariant


def declared(tmp_path: Path) -> Path:
    """The same cure, saying that either insert may meet the other's key."""
    text = UNIQUE_CURE.read_text().replace(
        'WHERE key = :key)"\n', 'WHERE key = :key)"\nexpect = { may_fail = "23505" }\n'
    )
    path = tmp_path / "unique-cure-declared.toml"
    path.write_text(text)
    return path


# -- finding 5: errors no step declares fail the proof, in every driver --------------------------


def test_explore_verdict_and_exit_code_fail_a_cure_whose_other_orders_raise_an_undeclared_error(
    pgrace_server: ServerInfo, tmp_path: Path
) -> None:
    cure = catalog.read_scenario(str(UNIQUE_CURE))
    found = explore(cure, pgrace_server)
    assert [c.ok for c in found.classes] == [True, True]  # the final check holds everywhere ...
    assert [c.unexpected for c in found.classes] == [(), ("23505",)]  # ... but one order raises 23505
    assert not found.ok
    split = explore(cure, pgrace_server, jobs=2)  # read back from its workers' JSON: the same classes, the same verdict
    assert [c.unexpected for c in split.classes] == [(), ("23505",)] and not split.ok

    cli = CliRunner()
    dsn = ["--dsn", pgrace_server.dsn]
    text = cli.invoke(main, ["explore", str(UNIQUE_CURE), *dsn])
    assert text.exit_code == 1, text.output
    assert (
        "unexpected error         1  final (1) · checks hold · unexpected errors: 23505 (unique violation)"
        in text.output
    )
    assert "verdict: ✘ class 2 raises an error no step declares (23505)" in text.output
    data = json.loads(cli.invoke(main, ["explore", str(UNIQUE_CURE), "-f", "json", *dsn]).output)
    assert (data["claim"], data["passed"]) == ("no bug", False)
    assert [c["unexpected_errors"] for c in data["classes"]] == [[], ["23505"]]
    assert [c["reproduces"] for c in data["classes"]] == [False, False]
    markdown = cli.invoke(main, ["explore", str(UNIQUE_CURE), "-f", "markdown", *dsn])
    assert markdown.exit_code == 1 and "| **unexpected error** |" in markdown.output
    assert "**verdict:** ✘ class 2 raises an error no step declares (23505)" in markdown.output
    page = cli.invoke(main, ["explore", str(UNIQUE_CURE), "-f", "html", *dsn])
    assert page.exit_code == 1 and '<p class="verdict fail">verdict: class 2 raises' in page.output

    ok = cli.invoke(main, ["explore", str(declared(tmp_path)), *dsn])
    assert ok.exit_code == 0, ok.output  # declared, the same error is part of the story
    assert "verdict: ✔ no class shows the bug, none raises an error no step declares" in ok.output


def test_check_explore_fails_a_cure_whose_other_orders_raise_an_undeclared_error(
    pgrace_server: ServerInfo, tmp_path: Path
) -> None:
    cli = CliRunner()
    dsn = ["--dsn", pgrace_server.dsn]
    plain = cli.invoke(main, ["check", str(UNIQUE_CURE), *dsn])
    assert plain.exit_code == 0, plain.output  # the file's order hides it
    junit = tmp_path / "junit.xml"
    result = cli.invoke(main, ["check", "--explore", str(UNIQUE_CURE), "--junit", str(junit), *dsn])
    assert result.exit_code == 1, result.output
    assert (
        "class 2 of 2 (1 of 3 runs over all 20 interleavings): final (1) · checks hold · unexpected errors: 23505"
        in (result.output)
    )
    assert "example: a: BEGIN → a-enqueue → b: BEGIN → b-enqueue → a: COMMIT → b: COMMIT" in result.output
    assert 'failures="1"' in junit.read_text() and "unexpected errors: 23505" in junit.read_text()
    passed = cli.invoke(main, ["check", "--explore", str(declared(tmp_path)), *dsn])
    assert passed.exit_code == 0, passed.output


def test_sweep_explore_fails_the_cells_of_a_cure_whose_other_orders_raise_an_undeclared_error(
    pgrace_server: ServerInfo,
) -> None:
    args = ["sweep", str(UNIQUE_CURE), "-p", "key=a,b", "--explore", "--dsn", pgrace_server.dsn]
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0, text.output  # a grid measures: its cells say what failed
    assert "fails in 1/3" in text.output and "unexpected errors: 23505" in text.output
    data = json.loads(CliRunner().invoke(main, [*args, "-f", "json"]).output)
    assert [cell["verdict"] for cell in data["cells"]] == ["fails in 1/3", "fails in 1/3"]
    markdown = CliRunner().invoke(main, [*args, "-f", "markdown"]).output
    assert "| unique-cure (fix) | fails in 1/3 | fails in 1/3 |" in markdown


def test_a_bug_shown_only_with_an_undeclared_error_proves_nothing(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    """A scenario of bug signatures claims the bug happens: only a reproduction without an undeclared error counts."""
    text = (
        UNIQUE_CURE.read_text()
        .replace('variant = "fix"\n', "")
        .replace(
            'setup = "CREATE TABLE jobs (key text PRIMARY KEY)"',
            'setup = "CREATE TABLE jobs (key text PRIMARY KEY); CREATE TABLE log (who text)"',
        )
        .replace('WHERE key = :key)"\n', "WHERE key = :key); INSERT INTO log VALUES ('x')\"\n")
        .replace(
            'description = "the job is queued once"\nsql = "SELECT count(*) FROM jobs"',
            'description = "one enqueue left no trace"\nkind = "bug"\nsql = "SELECT count(*) FROM log"',
        )
    )
    path = tmp_path / "unique-bug.toml"
    path.write_text(text)
    cli = CliRunner()
    dsn = ["--dsn", pgrace_server.dsn]
    result = cli.invoke(main, ["check", "--explore", str(path), *dsn])
    assert result.exit_code == 1, result.output  # b's log row is missing only where its insert failed with 23505
    assert "the bug happens only with an error no step declares" in result.output
    shown = cli.invoke(main, ["explore", str(path), *dsn])
    assert shown.exit_code == 1, shown.output
    assert "verdict: ✘ the bug happens with an error no step declares (class 2)" in shown.output
    path.write_text(text.replace("('x')\"\n", '(\'x\')"\nexpect = { may_fail = "23505" }\n'))
    assert cli.invoke(main, ["check", "--explore", str(path), *dsn]).exit_code == 0


# -- finding 6: a check's polarity, and the words that follow from it -----------------------------


def test_an_invariant_on_a_scenario_without_a_fix_reads_as_an_invariant(pgrace_server: ServerInfo) -> None:
    cli = CliRunner()
    text = cli.invoke(main, ["explore", str(LOST_INCREMENT), "--dsn", pgrace_server.dsn])
    assert text.exit_code == 1, text.output  # the invariant fails in some order: that is the bug, shown
    lines = text.output.splitlines()
    lost = next(line for line in lines if "final (1, 1), (2, 2)" in line)
    kept = next(line for line in lines if "final (1, 2), (2, 2)" in line)
    assert "FAILS" in lost and lost.endswith("fails: no increment is lost")
    assert "holds" in kept and kept.endswith("checks hold")
    assert "reproduces the bug" not in text.output and "no bug" not in text.output
    assert "verdict: ✘ class 1 shows the bug" in text.output
    data = json.loads(
        cli.invoke(main, ["explore", str(LOST_INCREMENT), "-f", "json", "--dsn", pgrace_server.dsn]).output
    )
    assert [(c["final"][0], c["reproduces"]) for c in data["classes"]] == [
        ([[1, 1], [2, 2]], True),
        ([[1, 2], [2, 2]], False),
    ]


def test_a_bug_signature_on_a_scenario_without_a_fix_reads_as_the_bug(
    pgrace_server: ServerInfo, tmp_path: Path
) -> None:
    path = tmp_path / "signature.toml"
    path.write_text(
        LOST_INCREMENT.read_text().replace(
            'description = "no increment is lost"\nsql = "SELECT id, n FROM counters ORDER BY id"\nrows = [[1, 2], [2, 2]]',
            'description = "an increment is lost"\nkind = "bug"\nsql = "SELECT id, n FROM counters ORDER BY id"\n'
            "rows = [[1, 1], [2, 2]]",
        )
    )
    text = CliRunner().invoke(main, ["explore", str(path), "--dsn", pgrace_server.dsn])
    assert text.exit_code == 0, text.output  # a scenario of signatures claims the bug happens: it does
    lost = next(line for line in text.output.splitlines() if "final (1, 1), (2, 2)" in line)
    assert "reproduces the bug" in lost and lost.endswith("the bug: an increment is lost")
    assert "verdict: ✔ class 1 shows the bug" in text.output


def test_check_kind_is_read_and_validated_with_its_line() -> None:
    base = 'sessions = ["a"]\n[[step]]\nsession = "a"\nsql = "SELECT 1"\n[[check]]\nsql = "SELECT 1"\nrows = [[1]]\n'
    assert parse_toml_scenario(base, "s.toml").checks[0].kind == "invariant"  # the default
    assert parse_toml_scenario(base + 'kind = "bug"\n', "s.toml").checks[0].kind == "bug"
    with pytest.raises(ScenarioError) as info:
        parse_toml_scenario(base + 'kind = "bugs"\n', "s.toml")
    assert str(info.value).startswith('s.toml:8: check kind is "invariant"') and "did you mean 'bug'?" in str(
        info.value
    )
    with pytest.raises(ScenarioError) as info:
        parse_toml_scenario(base + "kind = true\n", "s.toml")
    assert str(info.value).startswith("s.toml:8: ")
    step = 'sessions = ["a"]\n[[step]]\nsession = "a"\nsql = "SELECT 1"\nexpect = { may_fail = %s }\n'
    assert parse_toml_scenario(step % '["40001", "40P01"]', "s.toml").steps[0].expect.allowed == ("40001", "40P01")
    with pytest.raises(ScenarioError) as info:
        parse_toml_scenario(step % '"4001"', "s.toml")
    assert str(info.value).startswith("s.toml:5: expect.may_fail is true (any error), an SQLSTATE")


def test_shipped_bug_variants_say_what_their_checks_are() -> None:
    """Every shipped check's polarity is written down: a bug variant's own checks are the bug's signature
    or an invariant it breaks, and a cure's checks are invariants."""
    for name in catalog.shipped_names():
        scenario = catalog.read_scenario(name)
        for variant in scenario.variants:
            one = scenario.variant_named(variant)
            if variant == "fix":
                assert all(not c.is_signature for c in one.checks), name
            elif one.checks:
                assert any(c.is_signature for c in one.checks), name


def test_show_and_the_run_json_say_each_checks_polarity() -> None:
    shown = CliRunner().invoke(main, ["show", "nowait"])
    assert shown.exit_code == 0, shown.output
    assert "check (must hold): no job was lost or claimed twice: all three still queued" in shown.output
    assert "check (the bug): a worker got no job: its claim failed while jobs 2 and 3 were free" in shown.output
    final = run_to_dict(load_run("nowait.bug"))["final"]
    assert [f["kind"] for f in final] == ["invariant", "bug"]
