"""`pgrace from-log`: real incidents, logged by the server itself, become scenarios that reproduce them.

Each case starts a server that logs as a team should (log_lock_waits, a short
deadlock_timeout, log_statement all or none, in stderr with one of three common prefixes,
csvlog or jsonlog), makes a deadlock and a long lock wait with real concurrent sessions,
and reads the server's own log file.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import tools.incidents as real
from pgrace.cli import main
from pgrace.drivers.fromlog import from_log
from pgrace.servers import open_server

CASES = [
    ("18", "stderr", "all", "%m [%p] %a %v %x "),
    ("18", "stderr", "none", "%m [%p] %q%u@%d "),
    ("18", "jsonlog", "none", real.PREFIX),
    ("15", "csvlog", "all", real.PREFIX),
    ("15", "stderr", "all", "%t [%p]: user=%u,db=%d,app=%a,client=%h "),
    ("15", "stderr", "none", real.PREFIX),
]


def _needs(version: str) -> None:
    if version == "15" and not (real.PG15 / "postgres").exists():
        pytest.skip(f"no PostgreSQL 15 at {real.PG15}")


@pytest.mark.server
@pytest.mark.parametrize(("version", "destination", "statements", "prefix"), CASES)
def test_a_real_deadlock_and_lock_wait_come_back(
    version: str, destination: str, statements: str, prefix: str, tmp_path: Path
) -> None:
    _needs(version)
    with real.logging_server(version, destination, statements, prefix) as logging:
        real.deadlock(logging)
        real.lock_wait(logging)
        log = tmp_path / f"server.{destination}"
        shutil.copy(logging.logfile(), log)
        rows, databases = logging.shop_rows(), logging.databases()

        listed = from_log([str(log)], list_only=True)
        assert [i.kind for i in listed.incidents] == ["deadlock", "lock wait"]

        # The deadlock, with --dsn (read only) for the table and its rows, verified on another server
        # of the same version: never on the incident's own.
        with open_server("embedded" if version == "18" else str(real.PG15)) as elsewhere:
            dead = from_log([str(log)], dsn=logging.shop, server=elsewhere)
        assert dead.written is not None and dead.verified is not None
        assert dead.verified.reproduced, dead.verified.failures
        text = dead.written.text
        assert 'error = "40P01"' in text and 'waits_on = { table = "accounts", key = { id = 1 } }' in text
        assert "SET deadlock_timeout = '100ms'" in text  # the victim, pinned
        assert ("# inferred: not in the log" in text) == (statements == "none")
        scenario = tmp_path / "deadlock.toml"
        scenario.write_text(text)
        ran = CliRunner().invoke(main, ["run", str(scenario), "--dsn", logging.server.dsn])
        assert ran.exit_code == 0, ran.output
        assert "40P01" in ran.output and "waits for" in ran.output

        # The lock wait, without --dsn: the table is guessed from the statements.
        wait = from_log([str(log)], incident=2, server=logging.server)
        assert wait.verified is not None and wait.verified.reproduced, wait
        assert "# TODO" in wait.written.text if wait.written else False
        assert "released_by" in (wait.written.text if wait.written else "") or statements == "none"

        # Everything ran in scratch databases: the incident's own is as the incident left it.
        assert logging.shop_rows() == rows
        assert logging.databases() == databases


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A real log before any incident (quiet) and one with a deadlock, from one server."""
    where = tmp_path_factory.mktemp("logs")
    with real.logging_server("18") as logging:
        shutil.copy(logging.logfile(), where / "quiet.log")
        real.deadlock(logging)
        shutil.copy(logging.logfile(), where / "deadlock.log")
    return {"quiet": where / "quiet.log", "deadlock": where / "deadlock.log"}


def _refused(args: list[str], out: Path) -> str:
    result = CliRunner().invoke(main, ["from-log", *args, "-o", str(out)])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    assert not out.exists()
    return lines[0]


@pytest.mark.server
def test_a_log_without_incident_is_refused(recorded: dict[str, Path], tmp_path: Path) -> None:
    line = _refused([str(recorded["quiet"])], tmp_path / "out.toml")
    assert line.startswith(f"pgrace: {recorded['quiet']}: no incident")


@pytest.mark.server
def test_a_deadlock_report_cut_short_is_refused_at_its_line(recorded: dict[str, Path], tmp_path: Path) -> None:
    text = recorded["deadlock"].read_text()
    cut = text.index("waits for ShareLock", text.index("ERROR:  deadlock detected"))
    truncated = tmp_path / "truncated.log"
    truncated.write_text(text[:cut])
    line = _refused([str(truncated)], tmp_path / "out.toml")
    assert f"{truncated}:" in line and "cut short" in line


@pytest.mark.server
def test_a_prefix_that_does_not_match_is_refused(recorded: dict[str, Path], tmp_path: Path) -> None:
    line = _refused([str(recorded["deadlock"]), "--prefix", "%t [%p]: [%l-1] "], tmp_path / "out.toml")
    assert f"{recorded['deadlock']}:1: line does not start with the log_line_prefix" in line


def test_a_binary_file_is_refused(tmp_path: Path) -> None:
    line = _refused([sys.executable], tmp_path / "out.toml")
    assert "a binary file, not a server log" in line


def test_much_unrelated_text_is_refused_at_once(tmp_path: Path) -> None:
    noise = tmp_path / "noise.txt"
    with noise.open("w") as f:
        for n in range(400_000):
            f.write(f"GET /index.html {n} HTTP/1.1 200 this is a web server's log, not PostgreSQL's\n")
    line = _refused([str(noise)], tmp_path / "out.toml")
    assert "match no common log_line_prefix" in line


@pytest.mark.server
def test_many_log_lines_without_an_incident_are_refused(recorded: dict[str, Path], tmp_path: Path) -> None:
    quiet = recorded["quiet"].read_text()
    big = tmp_path / "big.log"
    with big.open("w") as f:
        for _ in range(20_000_000 // len(quiet) + 1):
            f.write(quiet)
    line = _refused([str(big)], tmp_path / "out.toml")
    assert "no incident" in line


@pytest.mark.server
def test_log_text_never_reaches_the_terminal_raw(recorded: dict[str, Path], tmp_path: Path) -> None:
    hostile = tmp_path / "evil\x1b[2J.log"
    shutil.copy(recorded["deadlock"], hostile)
    result = CliRunner().invoke(main, ["from-log", str(hostile), "--list"])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "␛[2J" in result.output
    written = CliRunner().invoke(main, ["from-log", str(hostile), "--no-verify"])
    assert written.exit_code == 0, written.output
    assert "\x1b" not in written.output and "␛[2J" in written.stdout  # the scenario's comments and its report


@pytest.mark.server
def test_an_order_that_does_not_deadlock_is_explored_until_one_does(tmp_path: Path) -> None:
    """The same steps run one transaction after the other cannot deadlock: exploring finds an order that does."""
    from pgrace.drivers.fromlog.verify import verify
    from pgrace.drivers.fromlog.writer import write_scenario

    with real.logging_server("18", statements="none") as logging:
        real.deadlock(logging)
        log = tmp_path / "server.log"
        shutil.copy(logging.logfile(), log)
        found = from_log([str(log)], verify=False)
        assert found.written is not None and found.incident is not None
        incident = found.incident
        sessions = list(dict.fromkeys(s.session for s in found.written.steps))
        serial = [s.name for session in sessions for s in found.written.steps if s.session == session]
        one_after_the_other = write_scenario(incident, order=serial)

        verified, written = verify(incident, one_after_the_other, "<test>", logging.server, None)

        assert verified.reproduced, verified.failures
        assert verified.order is not None and verified.order != serial and verified.explored > 0
        assert [s.name for s in written.steps] == verified.order
        assert 'error = "40P01"' in written.text


@pytest.mark.server
def test_a_log_that_begins_inside_the_transactions_infers_the_locks_taken_before(tmp_path: Path) -> None:
    """Log rotation cut off each transaction's first update: the rows they held are locked by inferred steps."""
    with real.logging_server("18") as logging:
        real.deadlock(logging)
        lines = logging.logfile().read_text().splitlines(keepends=True)
        first = next(i for i, line in enumerate(lines) if "SET balance = balance + 100 WHERE id = 2" in line)
        log = tmp_path / "rotated.log"
        log.write_text("".join(lines[first:]))

        found = from_log([str(log)], server=logging.server)

        assert found.verified is not None and found.verified.reproduced, found
        assert found.written is not None
        text = found.written.text
        assert "SELECT 1 FROM accounts WHERE id = 1 FOR UPDATE" in text  # alice's first update, inferred
        assert "SELECT 1 FROM accounts WHERE id = 2 FOR UPDATE" in text  # bob's
        assert any("had written before its first logged statement" in u for u in found.written.unsaid)


@pytest.mark.server
def test_lines_that_are_not_records_are_skipped_and_counted(recorded: dict[str, Path], tmp_path: Path) -> None:
    """Another program's output mixed into the log: the incident is still read, and the skipped lines told."""
    lines = recorded["deadlock"].read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if "ERROR:  deadlock detected" in line)
    mixed = tmp_path / "mixed.log"
    mixed.write_text("".join(lines[:at] + ["sh: 1: cannot create /x: Permission denied\n"] * 3 + lines[at:]))
    out = tmp_path / "out.toml"
    result = CliRunner().invoke(main, ["from-log", str(mixed), "--no-verify", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "pgrace: from-log: 3 line(s) skipped: not log records of the file's format" in result.stderr
    assert 'error = "40P01"' in out.read_text()
