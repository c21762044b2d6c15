"""`pgrace from-log` never acts on a log's word: a hostile log, real servers, superuser DSNs.

A client without privileges sent, inside the transactions that deadlocked, a ``COPY … TO
PROGRAM`` and a read of ``pg_authid``; both failed for it, and the server logged them. The
team then gives pgrace superuser DSNs (the incident's database, ``PGRACE_DSN``,
``--server``): what the log recorded must still run as no more than pgrace's scratch role,
and nothing may be copied from a catalog.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.conninfo import make_conninfo

import tools.incidents as real
from pgrace.cli import main
from pgrace.drivers.fromlog import from_log
from pgrace.servers import ServerInfo

pytestmark = pytest.mark.server

PASSWORD = "the-superusers-secret"


def _hostile_lock_wait(logging: real.LoggingServer, touched: Path) -> None:
    """A report, logged in as the unprivileged ``app``, holds a row a payment waits for; first it tries what ``app`` may not."""
    app = make_conninfo(logging.shop, user="app")
    with (
        psycopg.connect(app, application_name="report") as report,
        psycopg.connect(app, application_name="payment", autocommit=True) as payment,
        psycopg.connect(logging.server.dsn, autocommit=True) as admin,
    ):
        report.execute("SELECT balance FROM accounts WHERE id = 3 FOR UPDATE")
        for attempt in (
            f"COPY (SELECT 1) TO PROGRAM 'touch {touched}'",
            "SELECT rolname, rolpassword FROM pg_authid WHERE rolname = 'postgres'",
            "SELECT usename, passwd FROM pg_shadow WHERE usename = 'postgres'",
        ):
            report.execute("SAVEPOINT try")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                report.execute(attempt.encode())
            report.execute("ROLLBACK TO SAVEPOINT try")
        worker = threading.Thread(
            target=payment.execute, args=("UPDATE accounts SET balance = balance + 1 WHERE id = 3",)
        )
        worker.start()
        real._blocked(admin, payment.info.backend_pid)
        real._in_log(logging, "still waiting for")
        report.commit()
        worker.join()
    assert not touched.exists()  # it failed for the client, as the log says


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[real.LoggingServer, Path, Path]]:
    """The incident's server (superuser DSN, a password hash in pg_authid), its log, and the file COPY would make."""
    # A directory the server's account may write to (as root it runs as another user).
    where = Path(tempfile.mkdtemp(prefix="pgrace-logsafety-", dir="/tmp"))
    where.chmod(0o777)
    touched = where / f"ran-{uuid.uuid4().hex}"
    with real.logging_server("18") as logging:
        with psycopg.connect(logging.shop, autocommit=True) as conn:
            conn.execute(f"ALTER ROLE postgres PASSWORD '{PASSWORD}'")
            conn.execute("CREATE ROLE app LOGIN")
            conn.execute("GRANT SELECT, UPDATE ON accounts TO app")
        _hostile_lock_wait(logging, touched)
        log = tmp_path_factory.mktemp("hostile") / "server.log"
        shutil.copy(logging.logfile(), log)
        yield logging, log, touched
    shutil.rmtree(where)


def _from_log(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["from-log", *args], env=env)
    assert "Traceback" not in result.output, result.output
    return result.exit_code, result.stdout, result.stderr


def test_the_log_s_statements_are_in_the_scenario(hostile: tuple[real.LoggingServer, Path, Path]) -> None:
    """The premise: the written scenario does hold what the client tried (else the tests below prove nothing)."""
    _logging, log, _touched = hostile
    code, out, err = _from_log([str(log), "--no-verify"])
    assert code == 0, err
    assert "TO PROGRAM" in out and "pg_authid" in out and "pg_shadow" in out


def test_pgrace_dsn_is_not_where_a_log_is_verified(
    hostile: tuple[real.LoggingServer, Path, Path], pgrace_server: ServerInfo
) -> None:
    """PGRACE_DSN names a superuser's server: from-log verifies on its own server all the same."""
    logging, log, touched = hostile
    code, _out, err = _from_log([str(log), "--dsn", logging.shop], env={"PGRACE_DSN": pgrace_server.dsn})
    assert not touched.exists(), "the log's COPY ... TO PROGRAM ran"
    # The statements that failed for the client failed in the run too (the wait itself came back).
    assert code == 1, err
    assert "42501 permission denied to COPY to or from an external program" in err


def test_a_named_superuser_server_runs_the_log_as_a_scratch_role(
    hostile: tuple[real.LoggingServer, Path, Path], pgrace_server: ServerInfo
) -> None:
    """--server as a superuser: the statements run as a role made for the run, and fail as they did for the client."""
    logging, log, touched = hostile
    named = ServerInfo(dsn=pgrace_server.dsn, version=pgrace_server.version, label="the team's server")
    result = from_log([str(log)], dsn=logging.shop, server=named)
    assert not touched.exists(), "the log's COPY ... TO PROGRAM ran"
    assert result.verified is not None and result.verified.run is not None
    steps = result.verified.run.step_runs()
    refused = [s for s in steps if "TO PROGRAM" in s.sql or "pg_authid" in s.sql or "pg_shadow" in s.sql]
    assert len(refused) == 3, [s.sql for s in steps]
    for step in refused:
        assert step.outcome is not None and step.outcome.error is not None
        assert step.outcome.error.sqlstate == "42501", step.outcome.error
    assert [f for f in result.verified.failures if "42501" not in f] == []
    code, _out, err = _from_log([str(log), "--server", pgrace_server.dsn])
    assert not touched.exists(), "the log's COPY ... TO PROGRAM ran"
    assert code == 1 and "42501 permission denied to COPY to or from an external program" in err, err


def test_the_incident_s_own_server_is_refused(hostile: tuple[real.LoggingServer, Path, Path], tmp_path: Path) -> None:
    logging, log, touched = hostile
    out = tmp_path / "out.toml"
    code, _out, err = _from_log([str(log), "--dsn", logging.shop, "--server", logging.server.dsn, "-o", str(out)])
    assert code == 2, err
    assert err.startswith(
        "pgrace: from-log: Invalid value for --server: it is the server of the incident's database"
    ), err
    assert len(err.strip().splitlines()) == 1, err
    assert not touched.exists() and not out.exists()
    # The same server through another database's DSN is still the same server.
    code, _out, err = _from_log([str(log), "--dsn", logging.shop, "--server", logging.shop])
    assert code == 2, err


def test_no_catalog_row_is_copied(hostile: tuple[real.LoggingServer, Path, Path]) -> None:
    """--dsn as a superuser: pg_authid and pg_shadow stay unread; the accounts the incident touched are copied."""
    logging, log, _touched = hostile
    code, out, err = _from_log([str(log), "--dsn", logging.shop, "--no-verify"])
    assert code == 0, err
    with psycopg.connect(logging.server.dsn) as conn:
        row = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = 'postgres'").fetchone()
    assert row is not None and str(row[0]).startswith("SCRAM-SHA-256$")
    for text in (out, err):
        assert "SCRAM-SHA-256" not in text and str(row[0]) not in text
    assert "INSERT INTO pg_authid" not in out and "INSERT INTO pg_shadow" not in out
    assert "INSERT INTO accounts VALUES\n  ('3', 'carol', '501');" in out
    assert "pg_authid is one of PostgreSQL's catalogs: nothing of it is copied" in err
    # Which rows came from the team's database, in the file and on stderr.
    assert (
        "# Copied from the database --dsn names (review them before sharing this file):\n#   - 1 row(s) of accounts"
        in out
    )
    assert "pgrace:   - 1 row(s) of accounts" in err


def test_a_column_the_role_may_not_read_is_not_copied(
    hostile: tuple[real.LoggingServer, Path, Path], tmp_path: Path
) -> None:
    """--dsn as a role that may read accounts' id and owner only: balance stays in the database."""
    logging, log, _touched = hostile
    with psycopg.connect(logging.shop, autocommit=True) as conn:
        conn.execute("CREATE ROLE auditor LOGIN")
        conn.execute("GRANT SELECT (id, owner) ON accounts TO auditor")
    try:
        code, out, err = _from_log([str(log), "--dsn", make_conninfo(logging.shop, user="auditor"), "--no-verify"])
        assert code == 0, err
        assert 'INSERT INTO accounts ("id", "owner") VALUES' in out or "INSERT INTO accounts (id, owner) VALUES" in out
        assert "'501'" not in out and "('3', 'carol')" in out
        assert "may not read accounts's column(s) balance" in err
    finally:
        with psycopg.connect(logging.shop, autocommit=True) as conn:
            conn.execute("DROP OWNED BY auditor; DROP ROLE auditor")
