"""The bounded searches (a sample, a preemption bound, PCT) over proxy runs: real commands and async sessions, real
server; each result line says what was covered, never every order."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from helpers import cli
from proxying import psycopg_withdrawal

from pgrace import proxy
from pgrace.drivers.searches import PreemptionBounded
from pgrace.servers import ServerInfo

WITHDRAW = f"{sys.executable} {Path(__file__).parents[1] / 'examples' / 'any-language' / 'withdraw.py'}"
EXEC = ("--exec", f"alice={WITHDRAW}", "--exec", f"bob={WITHDRAW}")


def _head(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("lost-update (bug): "))


def test_a_preemption_bound_of_1_finds_the_lost_update_and_0_does_not(pgrace_server: ServerInfo) -> None:
    """Each withdrawal alone (no preemption) keeps both; one preemption (Bob between Alice's read and write) loses one."""
    none = cli("explore", "lost-update", *EXEC, "--max-preemptions", "0", "--dsn", pgrace_server.dsn)
    one = cli("explore", "lost-update", *EXEC, "--max-preemptions", "1", "--dsn", pgrace_server.dsn)
    print(none.output, one.output)
    assert none.exit_code == 1 and "the bug happens in no class" in none.output
    assert one.exit_code == 0 and "shows the bug" in one.output
    assert re.fullmatch(
        r"lost-update \(bug\): every schedule with at most 1 preemption, \d+ runs \(of \d+ interleavings\): 2 outcome"
        r" classes",
        _head(one.output),
    )


def test_pct_finds_the_lost_update_with_a_stated_probability(pgrace_server: ServerInfo) -> None:
    found = cli("explore", "lost-update", *EXEC, "--pct", "2", "--max", "6", "--seed", "3", "--dsn", pgrace_server.dsn)
    print(found.output)
    assert found.exit_code == 0 and "shows the bug" in found.output
    assert re.fullmatch(
        r"lost-update \(bug\): pct depth 2, seed 3, 6 runs( \(\d distinct, each run once\))? of \d+ interleavings: a"
        r" depth-2 bug is missed with probability at most \d+\.\d% \(each run finds it with probability at least"
        r" \d+\.\d%\): 2 outcome classes",
        _head(found.output),
    )


def test_a_sample_says_how_many_of_how_many(pgrace_server: ServerInfo) -> None:
    """Three orders drawn among the interleavings of the statements the first run sent (one more run: that one)."""
    found = cli(
        "explore", "lost-update", *EXEC, "--max", "3", "--seed", "1", "--format", "json", "--dsn", pgrace_server.dsn
    )
    import json

    shown = json.loads(found.output)
    assert shown["guarantee"] == {"kind": "sample", "seed": 1} and not shown["complete"]
    assert (shown["explored"], shown["runs"]) == (3, 4) and shown["space"] > 3
    text = cli("explore", "lost-update", *EXEC, "--max", "3", "--seed", "1", "--dsn", pgrace_server.dsn)
    assert re.fullmatch(
        rf"lost-update \(bug\): 3 of {shown['space']} interleavings, 4 runs \(seed 1\): \d outcome class(es)?",
        _head(text.output),
    )


def test_async_sessions_under_a_preemption_bound(pgrace_server: ServerInfo) -> None:
    found = proxy.explore_async(
        {"alice": psycopg_withdrawal(), "bob": psycopg_withdrawal()},
        setup="CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL); INSERT INTO accounts VALUES (1, 500)",
        final="SELECT balance FROM accounts WHERE id = 1",
        expect=[[300]],
        server=pgrace_server,
        search=PreemptionBounded(1),
    )
    finals = {str(c.final) for c in found.classes}
    assert any("400" in f for f in finals) and any("300" in f for f in finals), finals
    assert found.bound is not None and found.bound.met and not found.covers_all and not found.ok


def test_bounded_options_over_commands_refused_before_any_server() -> None:
    for extra, said in (
        (["--pct", "2", "--max-preemptions", "1"], "--max-preemptions and --pct are two searches: choose one"),
        (["--pct", "2", "--no-reduce"], "--pct runs its own schedules: --no-reduce has no meaning with it"),
        (["--pct", "0"], "--pct 0: the depth D is 1 or more"),
    ):
        result = cli("explore", "lost-update", *EXEC, *extra)
        assert result.exit_code == 2, result.output
        [line] = result.stderr.splitlines()
        assert said in line, line


@pytest.mark.thorough  # the bound over commands is test_a_preemption_bound_of_1_...'s; this adds check's verdicts
def test_check_over_commands_under_a_preemption_bound(pgrace_server: ServerInfo) -> None:
    """check --explore --max-preemptions over commands: the withdrawals without a lock show the bug variant's lost
    update and fail the fix variant's claim of no bug; each case's line says the bound, not every order."""
    shipped = Path(__file__).parents[1] / "pgrace" / "scenarios" / "lost-update.toml"
    found = cli("check", "--explore", "--max-preemptions", "1", str(shipped), *EXEC, "--dsn", pgrace_server.dsn)
    print(found.output)
    assert found.exit_code == 1, found.output
    assert found.output.count("every schedule with at most 1 preemption") == 2, found.output
    assert "1 failed" in found.output and "1 passed" in found.output
