"""Small facts a new user met that the output got wrong, each pinned where it is decided.

A setup that fails never reaches a step: the verdict says the scenario did not run, and
the JSON's ``ok`` is false, instead of "no expectations to check" and ``ok: true``.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from documentation import page

import pgrace
from pgrace.cli import main
from pgrace.render.text import Style, render_text
from pgrace.servers import ServerInfo

FAILING_SETUP = (
    'setup = "CREATE TABLE t (id int); SELECT 1/0"\nsessions = ["a", "b"]\n[[step]]\nsession = "a"\nsql = "SELECT 1"\n'
)


@pytest.fixture
def failing(tmp_path: Path) -> str:
    path = tmp_path / "failing.toml"
    path.write_text(FAILING_SETUP)
    return str(path)


@pytest.mark.parametrize(
    ("fmt", "verdict"),
    [
        ("text", "\nverdict: not run: the setup failed (22012: division by zero)\n"),
        ("markdown", "**not run: the setup failed (22012: division by zero)**"),
        ("mermaid", "not run: the setup failed (22012: division by zero)"),
    ],
)
def test_a_failed_setup_is_not_called_a_run_without_expectations(
    failing: str, pgrace_server: ServerInfo, fmt: str, verdict: str
) -> None:
    result = CliRunner().invoke(main, ["run", failing, "-f", fmt, "--dsn", pgrace_server.dsn])
    assert result.exit_code == 1
    assert verdict in result.stdout
    assert "no expectations to check" not in result.stdout
    assert result.stderr == f"pgrace: {failing}:1: setup failed: ERROR:  division by zero\n"


def test_a_failed_setups_json_is_not_ok(failing: str, pgrace_server: ServerInfo) -> None:
    result = CliRunner().invoke(main, ["run", failing, "-f", "json", "--dsn", pgrace_server.dsn])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["ok"] is False


TYPO_TABLE = 'sessions = ["a"]\n[[step]]\nname = "s"\nsession = "a"\nsql = "SELECT 1"\n[fx.step.s]\nsql = "SELECT 2"\n'
UNKNOWN_VARIABLE = 'sessions = ["a"]\n[[step]]\nname = "s"\nsession = "a"\n\nsql = "SELECT :nope"\n'


FIX_OVERRIDE_VARIABLE = (
    'sessions = ["a", "b"]\n[[step]]\nname = "one"\nsession = "a"\nsql = "SELECT 1"\n'
    '[[step]]\nname = "two"\nsession = "b"\nsql = "SELECT 2"\n[fix]\n[fix.step.two]\nnote = "changed"\n'
    'sql = "SELECT :nope"\n'
)
FIX_TYPO_TABLE = (
    'sessions = ["a"]\n[[step]]\nsession = "a"\nsql = "SELECT 1"\n[fix]\ntitle = "f"\n[fix.stp.one]\nsql = "x"\n'
)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (TYPO_TABLE, "6: unknown top-level key 'fx' (did you mean 'fix'?)"),
        (UNKNOWN_VARIABLE, "6: step 's' uses :nope, which no earlier step of session 'a' captures"),
        (FIX_OVERRIDE_VARIABLE, "13: step 'two' uses :nope"),
        (FIX_TYPO_TABLE, "7: unknown [fix] key 'stp' (did you mean 'step'?)"),
    ],
)
def test_an_error_names_the_line_the_mistake_is_on(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "typo.toml"
    path.write_text(text)
    result = CliRunner().invoke(main, ["show", str(path)])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"pgrace: {path}:{where}"), result.stderr


def withdraw(conn: Any, amount: int) -> None:
    conn.execute("SELECT %s::int", (amount,))


class Teller:
    def __call__(self, conn: Any) -> None:
        conn.execute("SELECT 1")


@pytest.mark.parametrize(
    "sessions",
    [
        {"alice": functools.partial(withdraw, amount=100), "bob": functools.partial(withdraw, amount=200)},
        {"alice": Teller(), "bob": Teller().__call__},
    ],
    ids=["partial", "callable object"],
)
def test_a_code_runs_header_names_the_code_not_a_memory_address(
    pgrace_server: ServerInfo, sessions: dict[str, Any]
) -> None:
    run = pgrace.run_code(sessions, server=pgrace_server)
    header = render_text(run, Style(colour=False)).splitlines()[0]
    assert "0x" not in header and "functools" not in header, header
    assert header.startswith(("withdraw (code): ", "Teller (code): ")), header
    assert header.endswith("alice, bob interleaved (tests/test_small_truths.py)"), header


def test_check_of_a_directory_reports_an_invalid_file_and_runs_the_rest(
    tmp_path: Path, pgrace_server: ServerInfo
) -> None:
    """One bad file among a team's scenarios is named, the others still run, and the exit is 2 (invalid input)."""
    shutil.copy(Path(__file__).resolve().parents[1] / "scenarios" / "nowait.toml", tmp_path / "nowait.toml")
    (tmp_path / "bad.toml").write_text('sessions = ["a"]\n[[step]]\nsession = "a"\nsql = "SELECT :x"\n')
    junit = tmp_path / "junit.xml"
    result = CliRunner().invoke(main, ["check", str(tmp_path), "--dsn", pgrace_server.dsn, "--junit", str(junit)])
    assert result.exit_code == 2, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == (
        f"INVALID  {tmp_path / 'bad.toml'}:4: step 'a-1' uses :x, which no earlier step of session 'a' captures"
        " and no param defines"
    )
    assert [line.split()[0] for line in lines[1:3]] == ["PASS", "PASS"]
    assert lines[-1] == "2 checks: 2 passed, 0 failed; 1 invalid file not run"
    xml = junit.read_text()
    assert 'tests="3" failures="0" errors="1"' in xml and '<error message="' in xml


def test_a_step_outside_begin_commits_by_itself_as_the_docs_say(tmp_path: Path, pgrace_server: ServerInfo) -> None:
    """The documented rule: outside BEGIN each step is its own transaction, its locks gone when it is done."""
    path = tmp_path / "autocommit.toml"
    path.write_text(
        'setup = "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0)"\n'
        'sessions = ["a", "b"]\n[[step]]\nsession = "a"\nsql = "UPDATE t SET v = 1 WHERE id = 1"\n'
        '[[step]]\nsession = "b"\nsql = "UPDATE t SET v = 2 WHERE id = 1"\nexpect = { waits = false }\n'
    )
    result = CliRunner().invoke(main, ["run", str(path), "--dsn", pgrace_server.dsn])
    assert result.exit_code == 0, result.output
    assert "**A step outside `BEGIN` runs in autocommit**" in page("guide/writing-a-scenario.md")


def test_a_wait_on_a_shared_catalogs_row_is_named_by_its_table(tmp_path: Path, pgrace_server: ServerInfo) -> None:
    """PostgreSQL's intra-grant-inplace-db: VACUUM (FREEZE) waits on GRANT's pg_database row (a shared catalog,
    database 0 in pg_locks). The wait was seen, but its row read "None ctid (0,4)"."""
    spec = tmp_path / "intra-grant-inplace-db.spec"
    spec.write_text(
        "setup { CREATE ROLE regress_temp_grantee; }\n"
        "teardown { REVOKE ALL ON DATABASE isolation_regression FROM regress_temp_grantee;"
        " DROP ROLE regress_temp_grantee; }\n"
        "session s1\nsetup { SET deadlock_timeout = '10s'; }\nstep b1 { BEGIN; }\n"
        "step grant1 { GRANT TEMP ON DATABASE isolation_regression TO regress_temp_grantee; }\nstep c1 { COMMIT; }\n"
        "session s2\nstep vac2 { VACUUM (FREEZE); }\n"
        "permutation b1 grant1 vac2(c1) c1\n"
    )
    common = [str(spec), "--superuser", "--database-name", "isolation_regression"]
    isolation = CliRunner().invoke(main, ["run", *common, "-f", "isolation"])
    assert "step vac2: VACUUM (FREEZE); <waiting ...>" in isolation.stdout, isolation.output
    text = CliRunner().invoke(main, ["run", *common, "--width", "300"])
    assert "⏳ waits for s1 on row pg_database ctid (" in text.stdout, text.output
    assert "None" not in text.stdout
