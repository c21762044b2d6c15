"""``explore --minimize`` and ``from-log --minimize``: what they found, shrunk, from the CLI and from Python."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import tools.incidents as real
from pgrace import api
from pgrace.cli import main
from pgrace.drivers.fromlog import from_log
from pgrace.drivers.minimize import failure_of
from pgrace.frontends import catalog
from pgrace.servers import ServerInfo

CYCLE = {
    "UPDATE accounts SET balance = balance - 100 WHERE id = 1",
    "UPDATE accounts SET balance = balance - 50 WHERE id = 2",
    "UPDATE accounts SET balance = balance + 100 WHERE id = 2",
    "UPDATE accounts SET balance = balance + 50 WHERE id = 1",
}


def _plain(sql: str) -> str:
    """A cycle's statement with its amount made plain by the shrink (any amount deadlocks alike)."""
    for amount in ("100", "50"):
        sql = sql.replace(f"- {amount} ", "- 0 ").replace(f"+ {amount} ", "+ 0 ")
    return sql


@pytest.mark.server
@pytest.mark.thorough  # a logging server and two minimizations: test_from_log and test_minimize, every day
def test_a_logged_deadlock_with_unrelated_statements_minimizes_to_its_cycle(tmp_path: Path) -> None:
    """Both transactions also read and write carol's account: only the cycle's statements and rows stay."""
    with real.logging_server("18") as logging:
        real.busy_deadlock(logging)
        log = tmp_path / "server.log"
        shutil.copy(logging.logfile(), log)

        found = from_log([str(log)], server=logging.server, minimize=True)

        assert found.verified is not None and found.verified.reproduced, found.verified
        assert found.written is not None and "WHERE id = 3" in found.written.text  # the incident, as logged
        minimized = found.minimized
        assert minimized is not None, found.not_minimized
        steps = minimized.scenario.steps
        assert [s.sql for s in steps if s.sql == "BEGIN"] == ["BEGIN", "BEGIN"]
        updates = [s.sql for s in steps if s.sql != "BEGIN"]
        assert sorted(updates) == sorted(_plain(s) for s in CYCLE), updates  # no read, no write of id 3, no end
        assert minimized.before["seed_rows"] == 3 and minimized.after["seed_rows"] == 2
        assert "(3, " not in "".join(minimized.scenario.setup)  # carol's row is not one the cycle touches
        assert ("bob-5", "40P01") in minimized.failure.errors
        assert minimized.timeline is not None and minimized.failure.kept_by(failure_of(minimized.timeline))

        # The CLI writes the minimized scenario (the log's header kept), which runs and deadlocks again.
        out = tmp_path / "incident.toml"
        result = CliRunner().invoke(
            main, ["from-log", str(log), "--minimize", "--server", logging.server.dsn, "-o", str(out)]
        )
        assert result.exit_code == 0, result.output
        text = out.read_text()
        assert text.startswith("# Written by pgrace from-log") and "WHERE id = 3" not in text
        assert "pgrace: from-log: minimized (the scenario written):" in result.stderr
        assert "removed  step" in result.stderr
        ran = CliRunner().invoke(main, ["run", str(out), "--dsn", logging.server.dsn])
        assert ran.exit_code == 0, ran.output
        assert "40P01" in ran.output


def test_explore_minimizes_the_first_failing_class(pgrace_server: ServerInfo) -> None:
    result = CliRunner().invoke(
        main, ["explore", "deadlock-transfer", "--minimize", "-f", "json", "--dsn", pgrace_server.dsn]
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    failing = next(n for n, c in enumerate(shown["classes"], 1) if c["reproduces"])
    assert shown["minimized_class"] == failing
    minimized = shown["minimized"]
    assert minimized["order"] != shown["classes"][failing - 1]["example"]  # shrunk: bob's COMMIT is not needed
    assert minimized["after"]["steps"] < len(shown["classes"][failing - 1]["example"])
    assert {"step": "bob-credit", "sqlstate": "40P01"} in minimized["failure"]["errors"]
    assert minimized["timeline"] is not None and minimized["trials"]

    text = CliRunner().invoke(main, ["explore", "deadlock-transfer", "--minimize", "--dsn", pgrace_server.dsn])
    assert text.exit_code == 0, text.output
    assert f"class {failing}'s example, minimized:" in text.stdout
    assert "the minimized run:" in text.stdout


def test_explore_says_when_no_class_fails_and_python_gets_the_same(pgrace_server: ServerInfo) -> None:
    fix = catalog.read_scenario("lost-update").variant_named("fix")
    found = api.explore(fix, server=pgrace_server, minimize=True)
    assert found.asked_to_minimize and found.minimized is None and found.minimized_class is None
    result = CliRunner().invoke(main, ["explore", "lost-update", "--fix", "--minimize", "--dsn", pgrace_server.dsn])
    assert result.exit_code == 0, result.output
    assert result.stdout.endswith("\nnothing to minimize: no class fails\n")

    bug = api.explore(catalog.read_scenario("lost-update").variant_named("bug"), server=pgrace_server, minimize=True)
    assert bug.minimized is not None and bug.minimized_class is not None
    assert bug.classes[bug.minimized_class - 1].reproduces
    assert bug.minimized.after["steps"] == 4


def test_explore_refuses_minimize_with_show_or_merge(tmp_path: Path) -> None:
    shown = CliRunner().invoke(main, ["explore", "lost-update", "--minimize", "--show", "1"])
    assert shown.exit_code == 2 and "--minimize prints the classes and the minimized run" in shown.stderr
    part = tmp_path / "part.json"
    part.write_text("{}")
    merged = CliRunner().invoke(main, ["explore", "lost-update", "--minimize", "--merge", str(part)])
    assert merged.exit_code == 2 and "merged shards have no server to minimize on" in merged.stderr
    assert len(merged.stderr.strip().splitlines()) == 1, merged.stderr
