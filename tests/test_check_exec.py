"""`pgrace check --exec`: the commands are each case's sessions; the case's final checks decide, as for its steps."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from pgrace.servers import ServerInfo

EXAMPLES = Path(__file__).parents[1] / "examples" / "any-language"
CLIENTS = Path(__file__).parent / "clients"
WITHDRAW = f"{sys.executable} {EXAMPLES / 'withdraw.py'}"
LOST_UPDATE = Path(__file__).parents[1] / "pgrace" / "scenarios" / "lost-update.toml"

# One variant, whose invariant is the cure's: both withdrawals count.
BOTH_COUNT = """
name = "withdrawals"
setup = \"\"\"
CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, balance int NOT NULL);
INSERT INTO accounts VALUES (1, 'shared', 500);
\"\"\"
sessions = ["alice", "bob"]

[[step]]
session = "alice"
sql = "UPDATE accounts SET balance = balance - 100 WHERE id = 1"

[[step]]
session = "bob"
sql = "UPDATE accounts SET balance = balance - 100 WHERE id = 1"

[[check]]
description = "both withdrawals count"
sql = "SELECT balance FROM accounts WHERE id = 1"
rows = [[300]]
"""


def _cli(*args: str) -> Any:
    from click.testing import CliRunner

    from pgrace.cli import main

    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _exec(*flags: str) -> list[str]:
    return ["--exec", f"alice={WITHDRAW}{''.join(flags)}", "--exec", f"bob={WITHDRAW}{''.join(flags)}"]


@pytest.fixture
def withdrawals(tmp_path: Path) -> Path:
    path = tmp_path / "withdrawals.toml"
    path.write_text(BOTH_COUNT, encoding="utf-8")
    return path


def _junit(path: Path) -> dict[str, str | None]:
    """Each case's name and its failure's message (None: it passed)."""
    cases = ET.parse(path).getroot().iter("testcase")
    return {c.get("name", ""): (f.get("message") if (f := c.find("failure")) is not None else None) for c in cases}


def test_one_run_per_case_judged_by_its_checks(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    """Each variant of the shipped lost update once, its sessions the two withdrawals: the first ready goes, so
    Alice's ends before Bob's starts; the fix's invariant (300) holds and the bug's signature (400) does not."""
    junit = tmp_path / "out.xml"
    result = _cli("check", str(LOST_UPDATE), *_exec(), "--junit", str(junit), "--dsn", pgrace_server.dsn)
    assert result.exit_code == 1, result.output
    cases = _junit(junit)
    assert cases["lost-update (fix)"] is None
    failure = cases["lost-update (bug)"]
    assert failure is not None and "expected (400), got (300)" in failure
    assert "1 failed" in result.output and "1 passed" in result.output


def test_explore_proves_the_cure_and_fails_the_bug(
    pgrace_server: ServerInfo, tmp_path: Path, withdrawals: Path
) -> None:
    """--explore: a claim of no bug holds when the commands lock the row (every order), fails when they do not
    (the class that loses a withdrawal, with its example); the JUnit file says which."""
    junit = tmp_path / "out.xml"
    dsn = ("--dsn", pgrace_server.dsn)
    cured = _cli("check", "--explore", str(withdrawals), *_exec(" --for-update"), "--junit", str(junit), *dsn)
    assert cured.exit_code == 0, cured.output
    assert _junit(junit) == {"withdrawals (bug)": None}
    lost = _cli("check", "--explore", str(withdrawals), *_exec(), "--junit", str(junit), *dsn)
    assert lost.exit_code == 1, lost.output
    failure = _junit(junit)["withdrawals (bug)"]
    assert failure is not None
    assert "interleavings" in failure and "final (400)" in failure and "alice#1.1" in failure


def test_a_command_around_the_proxy_is_reported_and_the_others_still_run(
    pgrace_server: ServerInfo, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No proof from a case whose statements pgrace did not order: exit 2 in one line, an error in the JUnit
    file, and the other case still judged."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(pgrace_server.dsn)
    monkeypatch.setenv("AROUND_HOST", str(params["host"]))
    monkeypatch.setenv("AROUND_PORT", str(params.get("port") or 5432))
    around = f"around={sys.executable} {CLIENTS / 'around.py'}"
    junit = tmp_path / "out.xml"
    shipped = LOST_UPDATE
    result = _cli(
        "check", str(shipped), "--exec", f"alice={WITHDRAW}", "--exec", around, "--junit", str(junit),
        "--dsn", pgrace_server.dsn,
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if "did not order" in line]
    assert len(errors) == 2 and all(line.startswith(f"INVALID  {shipped}: ") for line in errors), result.output
    root = ET.parse(junit).getroot()
    assert root.get("errors") == "2"


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--explore", "-j", "2"], "-j"),
        (["--database-name", "mine"], "--database-name"),
        (["--exec", "alice=true"], "--exec"),
        (["--exec", "not a name=true"], "--exec"),
    ],
)
def test_options_exec_cannot_take_are_refused_in_one_line(withdrawals: Path, extra: list[str], said: str) -> None:
    result = _cli("check", str(withdrawals), "--exec", f"alice={WITHDRAW}", *extra)
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()[-1:]
    assert said in line and "Traceback" not in result.output + result.stderr


def test_a_spec_with_exec_is_refused(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    spec = tmp_path / "s.spec"
    spec.write_text("session s1\nstep a { SELECT 1; }\n", encoding="utf-8")
    (tmp_path / "s.out").write_text("", encoding="utf-8")
    result = _cli("check", str(spec), "--exec", f"alice={WITHDRAW}", "--dsn", pgrace_server.dsn)
    assert result.exit_code == 2
    assert result.output.startswith(f"INVALID  {spec}: an isolation spec runs its own steps"), result.output


def test_a_search_that_cannot_cover_every_order_proves_nothing(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    """Commands that send another statement after the same ones leave the reduced search incomplete: the
    invariant held in every run made, yet the case fails, saying why, rather than pass as a proof."""
    always = tmp_path / "always.toml"
    always.write_text(
        'name = "always"\nsessions = ["a"]\n[[step]]\nsession = "a"\nsql = "SELECT 1"\n'
        '[[check]]\ndescription = "one is one"\nsql = "SELECT 1"\nrows = [[1]]\n',
        encoding="utf-8",
    )
    chance = f"{sys.executable} {CLIENTS / 'chance.py'}"
    junit = tmp_path / "out.xml"
    result = _cli(
        "check", "--explore", str(always), "--exec", f"alice={chance}", "--exec", f"bob={chance}",
        "--junit", str(junit), "--dsn", pgrace_server.dsn,
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    failure = _junit(junit)["always (bug)"]
    assert failure is not None
    assert failure.startswith("the search did not cover every order (run ") and "sent another statement" in failure
    assert "no proof it holds in all" in failure
