"""When from-log's check cannot run, the scenario is still written, and what was not checked is said.

A setup that fails gets its file written and the reason said; a cycle of more processes
than a scenario holds, one line saying so: never a traceback, "a bug in pgrace" or "no server".
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import tools.incidents as real
from pgrace.cli import main
from pgrace.drivers.fromlog.incidents import MAX_PROCESSES

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
@pytest.mark.parametrize("processes", [150, 2000])
def test_a_cycle_of_more_processes_than_a_scenario_holds_is_said_in_one_line(
    three: Path, processes: int, tmp_path: Path
) -> None:
    """150 processes needed more connections than pgrace's server has (exit 3); 2,000 made "a bug in pgrace"."""
    log = _cycle_of(three, processes, tmp_path / "cycle.log")
    out = tmp_path / "out.toml"
    result = CliRunner().invoke(main, ["from-log", str(log), "-o", str(out)], env={"PGRACE_DSN": ""})
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert f"a deadlock of {processes:,} processes: a scenario has at most {MAX_PROCESSES} sessions" in line, line
    assert "bug in pgrace" not in line and not out.exists()
