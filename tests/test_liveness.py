"""Whether a scratch object is abandoned is the server's answer, not a guess from host and pid.

A run holds a session-level advisory lock derived from its scratch object's name for its
whole life, taken before the object exists; a sweeper removes only what it can take that
lock for. These tests run real `pgrace` processes side by side, in schema mode on a user's
database and in database mode, pause them mid-run, and sweep from elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgrace.cli import main
from pgrace.scratch import lock_key, scratch_name, sweep_leftovers
from pgrace.servers import ServerInfo

PASSWORD = "liveness-pw"
TINY_SPEC = """
setup { CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1); }
teardown { DROP TABLE t; }
session a
step a1 { UPDATE t SET id = id WHERE id = 1; }
session b
step b1 { SELECT count(*) FROM t; }
permutation a1 b1
"""


@pytest.fixture(scope="module")
def userdb(pgrace_server: ServerInfo) -> Iterator[str]:
    """A user's database and a role ``teller`` without CREATEDB that may create schemas in it."""
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS bank WITH (FORCE)")
        admin.execute("DROP ROLE IF EXISTS teller")
        admin.execute("DROP ROLE IF EXISTS auditor")
        admin.execute(sql.SQL("CREATE ROLE teller LOGIN NOCREATEDB PASSWORD {}").format(sql.Literal(PASSWORD)))
        admin.execute("CREATE ROLE auditor LOGIN NOCREATEDB")
        admin.execute("CREATE DATABASE bank")
        admin.execute("GRANT CREATE ON DATABASE bank TO teller, auditor")
    with psycopg.connect(make_conninfo(pgrace_server.dsn, dbname="bank"), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pgrowlocks")  # the user installed it: pgrace may use it, from public
    yield make_conninfo(pgrace_server.dsn, dbname="bank", user="teller", password=PASSWORD)
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS bank WITH (FORCE)")
        for name in [r[0] for r in admin.execute("SELECT datname FROM pg_database WHERE datname LIKE 'pgrace%'")]:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.execute("DROP ROLE IF EXISTS teller")
        admin.execute("DROP ROLE IF EXISTS auditor")


class Paced:
    """``pgrace run … --step`` in a child process, driven prompt by prompt."""

    def __init__(self, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PGRACE_DSN"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pgrace", "run", *args, "--step"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"},
        )
        self.seen: list[str] = []

    def at_prompt(self) -> bool:
        """Read until pgrace offers the next step (True) or its output ends (False)."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.seen.append(line)
            if "▶ next:" in line:
                return True
        return False

    def finish(self) -> tuple[int, str]:
        """Press Enter at every prompt until the run ends; its exit status and stderr."""
        assert self.proc.stdin is not None and self.proc.stderr is not None
        while True:
            try:
                self.proc.stdin.write("\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                break
            if not self.at_prompt():
                break
        _, stderr = self.proc.communicate(timeout=60)
        return self.proc.returncode, stderr


def schemas(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'pgrace%'")]


def test_sweeping_from_another_pid_namespace_leaves_a_live_run_alone(userdb: str, tmp_path: Path) -> None:
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-p", "-f", "true"]).returncode != 0:
        pytest.skip("cannot make a PID namespace here (needs unshare and the privilege to use it)")
    run = Paced("lost-update", "--allow-scratch-schema", "--dsn", userdb)
    assert run.at_prompt(), "".join(run.seen)
    [live] = schemas(userdb)
    clean = subprocess.run(
        ["unshare", "-p", "-f", "--mount-proc", sys.executable, "-m", "pgrace", "clean", "--dsn", userdb],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert clean.returncode == 0, clean.stderr
    assert "0 leftovers removed" in clean.stdout
    assert schemas(userdb) == [live]
    code, stderr = run.finish()
    assert code == 0, stderr + "".join(run.seen)
    assert schemas(userdb) == []


def test_concurrent_schema_runs_never_end_each_others_sessions(userdb: str) -> None:
    first = Paced("lost-update", "--allow-scratch-schema", "--dsn", userdb)
    assert first.at_prompt()
    second = Paced("lost-update", "--fix", "--allow-scratch-schema", "--dsn", userdb)
    assert second.at_prompt()  # its sessions connected after the first run's own connections
    code, stderr = first.finish()
    assert code == 0, stderr
    code, stderr = second.finish()
    assert code == 0, stderr + "".join(second.seen)
    assert "connection is gone" not in "".join(second.seen)


def test_a_run_whose_scratch_schema_vanishes_does_not_exit_0(
    userdb: str, pgrace_server: ServerInfo, tmp_path: Path
) -> None:
    spec = tmp_path / "tiny.spec"
    spec.write_text(TINY_SPEC)
    run = Paced(str(spec), "--allow-scratch-schema", "--dsn", userdb)
    assert run.at_prompt()
    [live] = schemas(userdb)
    with psycopg.connect(make_conninfo(pgrace_server.dsn, dbname="bank"), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(live)))
    code, stderr = run.finish()
    assert code == 3, stderr
    assert f"scratch schema {live} disappeared during the run" in stderr


def test_a_leftover_is_recognised_by_its_name_alone(pgrace_server: ServerInfo, userdb: str) -> None:
    """What a SIGKILL during CREATE DATABASE leaves: a database with nothing but its name."""
    dead = scratch_name("killed during create")
    dead_schema = scratch_name("killed schema")
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dead)))
        admin.execute("CREATE DATABASE pgrace_not_ours")
        admin.execute("CREATE DATABASE pgrace_lookalike_0123456789ab")
    with psycopg.connect(userdb, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(dead_schema)))
    try:
        assert sweep_leftovers(pgrace_server).removed == [dead]
        assert sweep_leftovers(ServerInfo(userdb, pgrace_server.version, "bank")).removed == [dead_schema]
        with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
            left = {r[0] for r in admin.execute("SELECT datname FROM pg_database WHERE datname LIKE 'pgrace%'")}
        assert left == {"pgrace_not_ours", "pgrace_lookalike_0123456789ab"}
    finally:
        with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS pgrace_not_ours")
            admin.execute("DROP DATABASE IF EXISTS pgrace_lookalike_0123456789ab")


def test_an_object_whose_lock_is_held_elsewhere_is_live(pgrace_server: ServerInfo, userdb: str) -> None:
    """The holder may be in any database, on any host: the server's lock table says it lives."""
    live = scratch_name("held elsewhere")
    with (
        psycopg.connect(pgrace_server.dsn, autocommit=True) as admin,
        psycopg.connect(make_conninfo(pgrace_server.dsn, dbname="bank"), autocommit=True) as holder,
    ):
        holder.execute("SELECT pg_advisory_lock(%s, %s)", lock_key(live))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(live)))
        try:
            assert sweep_leftovers(pgrace_server).removed == []
            holder.execute("SELECT pg_advisory_unlock_all()")
            assert sweep_leftovers(pgrace_server).removed == [live]
        finally:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(live)))


def test_a_leftover_owned_by_another_role_is_skipped_with_a_note(pgrace_server: ServerInfo, userdb: str) -> None:
    theirs = scratch_name("auditor's run")
    superuser_db = make_conninfo(pgrace_server.dsn, dbname="bank")
    with psycopg.connect(superuser_db, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION auditor").format(sql.Identifier(theirs)))
    try:
        cli = CliRunner()
        result = cli.invoke(main, ["clean", "--dsn", userdb])
        assert result.exit_code == 0, result.output
        note = f"pgrace: left {theirs} alone: abandoned by a pgrace run, but owned by role auditor"
        assert note in result.stderr
        assert len([line for line in result.stderr.splitlines() if theirs in line]) == 1
        assert theirs in schemas(userdb)
        result = cli.invoke(main, ["run", "nowait", "--allow-scratch-schema", "--dsn", userdb])
        assert result.exit_code == 0, result.output
        assert note in result.stderr
    finally:
        with psycopg.connect(superuser_db, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {}").format(sql.Identifier(theirs)))


LEFT_PREPARED = """
setup { CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1); }
session a
step a1 { BEGIN; UPDATE t SET id = 2 WHERE id = 1; PREPARE TRANSACTION 'left-behind'; }
session b
step b1 { SELECT count(*) FROM t; }
permutation a1 b1
"""


def test_a_prepared_transaction_left_in_the_scratch_schema_does_not_keep_it(userdb: str, tmp_path: Path) -> None:
    """Its locks outlive every session of the run: the run rolls it back, then drops its schema."""
    spec = tmp_path / "prepared.spec"
    spec.write_text(LEFT_PREPARED)
    result = CliRunner().invoke(main, ["run", str(spec), "--allow-scratch-schema", "--dsn", userdb])
    assert result.exit_code == 0, result.output
    assert schemas(userdb) == []
    with psycopg.connect(userdb, autocommit=True) as conn:
        assert conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall() == []
