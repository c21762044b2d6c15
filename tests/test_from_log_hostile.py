"""`pgrace from-log` reads hostile text: whoever can send a statement or set application_name writes the log.

The logs here are the server's own, made by real sessions whose statements and names carry
what breaks TOML, terminals and regular expressions; where a case needs a log no server
writes (a forged name, a stream that never ends), a real log is edited or piped.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

import tools.incidents as real
from pgrace.cli import main
from pgrace.drivers.fromlog import from_log
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.text import has_control

EXAMPLE = Path(__file__).parent.parent / "examples" / "from-log" / "deadlock.log"

#: Ends every statement of the deadlock: a comment holding TOML's quotes and escapes, DEL
#: (which TOML forbids even in a basic string), ESC, a C1 CSI, a bidi override, a dollar
#: quote, a carriage return, a table header, and a psql shell escape on a line of its own.
TAIL = " /* ''' \"\"\" \\ \\n \x7f \x1b[2J \x9b \u202e $$ \r ] = # \n[[step]]\n\\! touch /tmp/pgrace-pwned\n */"
#: application_names (PostgreSQL keeps printable ASCII): quotes, a table header, '=', '#'.
NAMES = ('al"i]ce = [x] #', "bob's [[sessions]]")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same hostile deadlock, logged by PostgreSQL 18 as stderr, csvlog and jsonlog."""
    where = tmp_path_factory.mktemp("hostile")
    logs = {}
    for destination in ("stderr", "csvlog", "jsonlog"):
        with real.logging_server("18", destination) as logging:
            real.deadlock(logging, names=NAMES, tail=TAIL)
            logs[destination] = where / f"server.{destination}"
            shutil.copy(logging.logfile(), logs[destination])
    return logs


@pytest.mark.server
@pytest.mark.parametrize("destination", ["stderr", "csvlog", "jsonlog"])
def test_statements_that_break_toml_are_written_as_they_ran(
    hostile: dict[str, Path], destination: str, pgrace_server: object, tmp_path: Path
) -> None:
    """The scenario parses, its steps are the statements byte for byte, and it reproduces the deadlock."""
    out = tmp_path / "deadlock.toml"
    result = CliRunner().invoke(main, ["from-log", str(hostile[destination]), "--no-verify", "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert not has_control(text), "the file is shown on terminals: no raw control character"
    scenario = parse_toml_scenario(text, str(out))
    updates = [s.sql for s in scenario.steps if s.sql.startswith("UPDATE")]
    assert len(updates) == 4 and all(sql.endswith(TAIL) for sql in updates)

    ran = CliRunner().invoke(main, ["run", str(out), "--dsn", pgrace_server.dsn])  # type: ignore[attr-defined]
    assert ran.exit_code == 0, ran.output
    assert "40P01" in ran.output
    assert not Path("/tmp/pgrace-pwned").exists()  # a psql escape is SQL text to the server, nothing else


@pytest.mark.server
def test_the_scenario_on_stdout_reaches_the_terminal_without_controls(hostile: dict[str, Path]) -> None:
    result = CliRunner().invoke(main, ["from-log", str(hostile["stderr"]), "--no-verify"])
    assert result.exit_code == 0, result.output
    assert not has_control(result.stdout) and not has_control(result.stderr)
    assert "\\u001b[2J" in result.stdout  # escaped, so that it still means what the client sent


def _edited(tmp_path: Path, old: str, new: str, source: Path = EXAMPLE) -> Path:
    text = source.read_text()
    assert old in text
    edited = tmp_path / "edited.log"
    edited.write_text(text.replace(old, new))
    return edited


def test_an_application_name_that_is_another_sessions_fallback_name_does_not_collide(tmp_path: Path) -> None:
    """bob's application_name is 'pid24914', the name alice (no application_name) falls back to."""
    log = _edited(tmp_path, "] bob ", "] pid24914 ")
    log.write_text(log.read_text().replace("] alice ", "] [unknown] "))
    out = tmp_path / "out.toml"
    result = CliRunner().invoke(main, ["from-log", str(log), "--no-verify", "-o", str(out)])
    assert result.exit_code == 0, result.output
    scenario = parse_toml_scenario(out.read_text(), str(out))
    assert len(set(scenario.session_names)) == 2


@pytest.mark.server
def test_jsonlog_with_lone_surrogates_and_fields_of_the_wrong_type_is_read(
    hostile: dict[str, Path], tmp_path: Path
) -> None:
    """JSON can spell a character UTF-8 cannot hold (\\ud800), and a field can be a number or a list."""
    text = hostile["jsonlog"].read_text()
    text = text.replace("WHERE id = 1 /*", "WHERE id = 1 /* \\ud800").replace(
        '"application_name":"bob', '"application_name":["bob"],"x":"'
    )
    text = re.sub(r'"vxid":"([^"]*)"', r'"vxid":7', text, count=3)
    log = tmp_path / "forged.json"
    log.write_text(text)
    out = tmp_path / "out.toml"
    result = CliRunner().invoke(main, ["from-log", str(log), "--no-verify", "-o", str(out)])
    assert result.exit_code == 0, result.output
    parse_toml_scenario(out.read_text(), str(out))
    assert "\\ufffd" in out.read_text() or "\ufffd" in out.read_text()


@pytest.mark.timing
@pytest.mark.server
def test_long_lines_that_match_no_prefix_are_judged_in_bounded_time(tmp_path: Path) -> None:
    """A 20 kB statement full of spaces and '@' in a log with PostgreSQL's default prefix.

    Against the other common prefixes (``%u@%d %a …``) a regular expression with lazy free-text
    fields backtracks cubically on such a line: minutes per line, before a word was written.
    """
    with real.logging_server("18", prefix="%m [%p] ") as logging:
        with psycopg.connect(logging.shop, autocommit=True) as conn:
            conn.execute(b"SELECT '" + b"a b@c d " * 2500 + b"'")
        real.deadlock(logging)
        log = tmp_path / "server.log"
        shutil.copy(logging.logfile(), log)
    started = time.monotonic()
    found = from_log([str(log)], list_only=True)
    assert time.monotonic() - started < 5
    assert [i.kind for i in found.incidents] == ["deadlock"]


def test_a_stream_that_never_ends_is_refused_at_once() -> None:
    """Only a regular file is read: it is read twice (a scan, then the incidents' stretches), and it ends."""
    line = b"2026-12-01 16:53:15.534 UTC [24884] LOG:  checkpoint starting: time\n"
    feeder = subprocess.Popen(
        [sys.executable, "-c", f"import sys\nwhile True: sys.stdout.buffer.write({line!r})"], stdout=subprocess.PIPE
    )
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pgrace", "from-log", "/dev/stdin", "--no-verify"],
            stdin=feeder.stdout,
            capture_output=True,
            timeout=30,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
        )
    finally:
        feeder.kill()
        feeder.wait()
        assert feeder.stdout is not None
        feeder.stdout.close()
    assert done.returncode == 2, done.stderr
    assert done.stderr.decode().strip().splitlines() == [
        "pgrace: /dev/stdin: not a regular file: a log is read from a file"
    ]


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_device_is_not_a_log(device: str) -> None:
    result = CliRunner().invoke(main, ["from-log", device, "--no-verify"])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"pgrace: {device}: not a regular file: a log is read from a file"


@pytest.mark.server
@pytest.mark.parametrize("statements", ["all", "none"])
def test_a_table_name_is_an_identifier_not_sql(statements: str, pgrace_server: object, tmp_path: Path) -> None:
    """A quoted table name can hold any text; written raw into the guessed setup, it ran as SQL.

    The name below closes the CREATE TABLE, runs COPY TO PROGRAM and opens another that the
    rest completes (the statements name no key, so no INSERT follows). The verifying run's
    role may not COPY TO PROGRAM (its setup failed: "permission denied to COPY to or from an
    external program"); a superuser's would have run a shell on the server's host.
    """
    marker = Path(f"/tmp/pgi{os.getpid()}")
    name = f"t();COPY(SELECT)TO PROGRAM'touch {marker}';CREATE TABLE u"
    assert len(name.encode()) <= 63  # PostgreSQL's longest identifier: a real server can have this table
    text = EXAMPLE.read_text().replace("UPDATE accounts", f'UPDATE "{name}"')
    text = re.sub(r"WHERE id = (\d)", r"WHERE id = \1 + 0", text)
    if statements == "none":  # the same log had log_statement been off: the lock steps are inferred
        text = "".join(line for line in text.splitlines(keepends=True) if "LOG:  statement:" not in line)
    log = tmp_path / "server.log"
    log.write_text(text)

    try:
        found = from_log([str(log)], server=pgrace_server)  # type: ignore[arg-type]
        assert not marker.exists(), "the log ran a shell command"
    finally:
        marker.unlink(missing_ok=True)
    assert found.written is not None
    assert f'CREATE TABLE "{name}"' in found.written.text


PASSWORD = "Sekrit-pa55word"


@pytest.mark.server
def test_dsn_is_read_only_and_its_password_is_never_shown(tmp_path: Path) -> None:
    """--dsn may be production: a role that may only SELECT, in read-only transactions, is enough, and
    one that may not read the table gets a TODO, not a crash; the password is in no output."""
    with real.logging_server("18") as logging:
        real.deadlock(logging)
        log = tmp_path / "server.log"
        shutil.copy(logging.logfile(), log)
        with psycopg.connect(logging.shop, autocommit=True) as conn:
            for role in ("reader", "stranger"):
                conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'".encode())
            conn.execute("GRANT SELECT ON accounts TO reader")
            conn.execute("ALTER ROLE reader SET default_transaction_read_only = on")
        rows, databases = logging.shop_rows(), logging.databases()
        outputs = {}
        for role in ("reader", "stranger"):
            out = tmp_path / f"{role}.toml"
            dsn = f"{logging.shop} user={role} password={PASSWORD}"
            verify = [] if role == "reader" else ["--no-verify"]  # no rows: no deadlock
            result = CliRunner().invoke(main, ["from-log", str(log), "--dsn", dsn, *verify, "-o", str(out)])
            assert result.exit_code == 0, result.output
            outputs[role] = out.read_text()
            assert PASSWORD not in result.output + outputs[role]
        assert re.search(r"INSERT INTO \"?accounts\"? VALUES\s+\('1', 'alice', ", outputs["reader"])  # the rows, copied
        assert "the role of --dsn may not read accounts: its setup is a TODO" in outputs["stranger"]
        assert logging.shop_rows() == rows and logging.databases() == databases


@pytest.mark.server
@pytest.mark.parametrize("statements", ["all", "none"])
def test_a_deadlock_of_three_processes_comes_back(statements: str, tmp_path: Path) -> None:
    """ann waits for ben, ben for cid, cid (the victim) for ann: only ben is released by the deadlock;
    ann goes on when ben commits, so the transactions end in that order."""
    with real.logging_server("18", statements=statements) as logging:
        real.cycle(logging)
        log = tmp_path / "server.log"
        shutil.copy(logging.logfile(), log)

        found = from_log([str(log)], server=logging.server)

    assert found.verified is not None and found.written is not None
    assert found.verified.reproduced, found.verified.failures
    released = [s.expect["released_by"] for s in found.written.steps if "released_by" in s.expect]
    others = [r for r in released if r != "deadlock"]
    assert len(released) == 3 and len(others) == 1  # cid's and ben's wait end with the deadlock; ann's when ben commits
    assert others[0] in {s.session for s in found.written.steps}
