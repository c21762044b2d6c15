"""When from-log's check cannot run, the scenario is still written, and what was not checked is said.

A setup that fails, a cycle of more processes than pgrace runs at once, one too big for a
scenario file: each gets a written file (or one line saying why not), never a traceback,
"a bug in pgrace" or "no server".
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import tools.incidents as real
from pgrace.cli import main
from pgrace.drivers.fromlog import MOST_CHECKED_SESSIONS

EXAMPLE = Path(__file__).parent.parent / "examples" / "from-log" / "deadlock.log"


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real deadlock of three processes, logged with log_statement none."""
    log = tmp_path_factory.mktemp("cycle") / "three.log"
    with real.logging_server("18", statements="none") as logging:
        real.cycle(logging)
        shutil.copy(logging.logfile(), log)
    return log


def _cycle_of(three: Path, n: int, out: Path) -> Path:
    """The real report of three, as the server writes one of ``n`` processes: each waits for the next."""
    text = three.read_text()
    head = re.search(r"^(.*)ERROR:  deadlock detected\n", text, re.M)
    assert head is not None
    prefix = head.group(1)
    victim = int(re.search(r"\[(\d+)\]", prefix).group(1))  # type: ignore[union-attr]
    pids = [victim, *range(victim + 1000, victim + 1000 + n - 1)]
    edges = [
        f"Process {p} waits for ShareLock on transaction {900 + i}; blocked by process {pids[(i + 1) % n]}."
        for i, p in enumerate(pids)
    ]
    statements = [
        f"Process {p}: UPDATE accounts SET balance = balance + 1 WHERE id = {i + 1}" for i, p in enumerate(pids)
    ]
    report = prefix + "ERROR:  deadlock detected\n" + prefix + "DETAIL:  " + "\n\t".join(edges + statements) + "\n"
    start = text.index(head.group(0))
    end = text.index(prefix + "HINT:", start)
    out.write_text(text[:start] + report + text[end:])
    return out


@pytest.mark.server
def test_a_setup_that_fails_still_writes_the_scenario(tmp_path: Path) -> None:
    """The setup guessed from a log whose key is 1 in one statement and 'two' in another cannot run: said, written."""
    log = tmp_path / "mixed.log"
    log.write_text(EXAMPLE.read_text().replace("balance + 100 WHERE id = 2", "balance + 100 WHERE id = 'two'"))
    out = tmp_path / "out.toml"
    result = CliRunner().invoke(main, ["from-log", str(log), "-o", str(out)], env={"PGRACE_DSN": ""})
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "pgrace: from-log: not checked (the scenario is written):" in result.stderr
    assert 'invalid input syntax for type integer: "two"' in result.stderr
    assert "WHERE id = 'two'" in out.read_text()


@pytest.mark.server
def test_from_log_takes_a_step_timeout(tmp_path: Path) -> None:
    out = tmp_path / "out.toml"
    args = ["from-log", str(EXAMPLE), "--step-timeout", "30", "-o", str(out)]
    result = CliRunner().invoke(main, args, env={"PGRACE_DSN": ""})
    assert result.exit_code == 0, result.output
    assert "reproduced" in result.stderr and out.exists()


@pytest.mark.server
def test_a_cycle_of_more_sessions_than_pgrace_checks_is_written_and_said(three: Path, tmp_path: Path) -> None:
    """150 processes: more connections than pgrace's server has, and longer than a check may take."""
    log = _cycle_of(three, 150, tmp_path / "cycle150.log")
    out = tmp_path / "out.toml"
    result = CliRunner().invoke(main, ["from-log", str(log), "-o", str(out)], env={"PGRACE_DSN": ""})
    assert result.exit_code == 1, result.output
    assert (
        f"pgrace: from-log: not checked (the scenario is written): a deadlock of 150 processes: pgrace checks at most "
        f"{MOST_CHECKED_SESSIONS} sessions at once" in result.stderr
    )
    assert out.read_text().count("[[sessions]]") == 150


@pytest.mark.server
def test_a_cycle_too_big_for_a_scenario_file_is_refused_in_one_line(three: Path, tmp_path: Path) -> None:
    log = _cycle_of(three, 2000, tmp_path / "cycle2000.log")
    out = tmp_path / "out.toml"
    result = CliRunner().invoke(main, ["from-log", str(log), "-o", str(out)], env={"PGRACE_DSN": ""})
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert "a deadlock of 2,000 processes: its scenario would be" in line and "nothing is written" in line, line
    assert "bug in pgrace" not in line and not out.exists()
