"""A scenario is hostile text: on a server pgrace starts, its SQL cannot reach the machine, the cache or another run.

Each run's sessions, setup, teardown and checks run as a role made for that run: no
superuser, owner of its scratch database and nothing else. What a superuser could do
(run programs and write files as the server's account, change the server's
configuration, load code, signal pgrace's own observer) fails inside the run with its
SQLSTATE, shown in the timeline like any other error.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.conninfo import make_conninfo

from pgrace import api
from pgrace.cli import main
from pgrace.drivers.searches import Exhaustive
from pgrace.errors import SetupFailed
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.model.scenario import Scenario
from pgrace.model.timeline import CheckQueried, SetupRan
from pgrace.pytest_plugin import RunScenario
from pgrace.render.text import render_text
from pgrace.servers import ServerInfo, open_server
from pgrace.servers.embedded import CACHE_ENV_VAR

pytestmark = pytest.mark.server


@pytest.fixture
def reachable_dir() -> Iterator[Path]:
    """A directory the server's account could write to, were it allowed to: nothing may appear in it."""
    path = Path(tempfile.mkdtemp(prefix="pgrace-hostile-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        for child in path.iterdir():
            child.unlink()
        path.rmdir()


def hostile_scenario(steps: dict[str, str], setup: str = "CREATE TABLE t (line text)") -> Scenario:
    lines = [f"setup = {json.dumps(setup)}", 'sessions = ["a"]']
    for name, statement in steps.items():
        lines += ["[[step]]", f'name = "{name}"', 'session = "a"', f"sql = {json.dumps(statement)}"]
    return parse_toml_scenario("\n".join(lines) + "\n", "hostile.toml")


def errors(run_steps: dict[str, str], pgrace_run: RunScenario) -> tuple[dict[str, str | None], str]:
    run = pgrace_run(hostile_scenario(run_steps))
    found = {
        step.step: (step.outcome.error.sqlstate if step.outcome and step.outcome.error else None)
        for step in run.step_runs()
    }
    return found, render_text(run)


def test_a_step_cannot_run_a_program_on_the_server_machine(pgrace_run: RunScenario, reachable_dir: Path) -> None:
    found, timeline = errors({"program": f"COPY (SELECT 1) TO PROGRAM 'id > {reachable_dir}/marker'"}, pgrace_run)
    assert found == {"program": "42501"}
    assert "✗ ERROR 42501: permission denied to COPY to or from an external program" in timeline
    assert not (reachable_dir / "marker").exists()


# What each statement gets on PostgreSQL 18 as the run's role. 42501 insufficient_privilege,
# 0A000 (an extension the server does not ship), 42883/42704 (dblink and postgres_fdw
# could not be installed, so there is nothing to call).
HOSTILE = {
    "copy_to_program": ("COPY (SELECT 1) TO PROGRAM 'touch {dir}/to_program'", "42501"),
    "copy_from_program": ("COPY t FROM PROGRAM 'touch {dir}/from_program'", "42501"),
    "copy_to_file": ("COPY (SELECT 'default_transaction_read_only = on') TO '{dir}/file'", "42501"),
    "copy_from_file": ("COPY t FROM '/etc/passwd'", "42501"),
    "read_file": ("SELECT pg_read_file('/etc/passwd')", "42501"),
    "read_binary_file": ("SELECT pg_read_binary_file('/etc/passwd')", "42501"),
    "list_dir": ("SELECT pg_ls_dir('.')", "42501"),
    "lo_export": ("SELECT lo_export(lo_from_bytea(0, 'x'), '{dir}/lo_export')", "42501"),
    "lo_import": ("SELECT lo_import('/etc/passwd')", "42501"),
    "plpython3u": ("CREATE LANGUAGE plpython3u", "0A000"),
    "language_c": (
        "CREATE FUNCTION evil() RETURNS int LANGUAGE c AS '/lib/x86_64-linux-gnu/libc.so.6', 'system'",
        "42501",
    ),
    "language_internal": ("CREATE FUNCTION evil() RETURNS int LANGUAGE internal AS 'int4in'", "42501"),
    "alter_system": ("ALTER SYSTEM SET default_transaction_read_only = on", "42501"),
    "reload_conf": ("SELECT pg_reload_conf()", "42501"),
    "load_library": ("LOAD 'auth_delay'", "42501"),
    "superuser_setting": ("SET log_statement = 'none'", "42501"),
    "adminpack": ("CREATE EXTENSION adminpack", "0A000"),
    "file_fdw": ("CREATE EXTENSION file_fdw", "42501"),
    "dblink": ("CREATE EXTENSION dblink", "42501"),
    "postgres_fdw": ("CREATE EXTENSION postgres_fdw", "42501"),
    "dblink_connect": ("SELECT dblink_connect('dbname=postgres')", "42883"),
    "fdw_server": ("CREATE SERVER other FOREIGN DATA WRAPPER postgres_fdw OPTIONS (dbname 'postgres')", "42704"),
    "kill_observer": (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE 'pgrace/%/observer'",
        "42501",
    ),
    "set_role": ("SET ROLE postgres", "42501"),
    "create_role": ("CREATE ROLE mallory SUPERUSER", "42501"),
    "become_superuser": ("ALTER ROLE CURRENT_USER SUPERUSER", "42501"),
    "create_database": ("CREATE DATABASE other", "42501"),
    "drop_database": ("DROP DATABASE postgres", "42501"),
    "tablespace": ("CREATE TABLESPACE elsewhere LOCATION '{dir}'", "42501"),
    "checkpoint": ("CHECKPOINT", "42501"),
}


def test_every_hostile_statement_fails_inside_the_run_with_its_sqlstate(
    each_server: ServerInfo, reachable_dir: Path
) -> None:
    """On the embedded PostgreSQL 18 and on a local PostgreSQL 15 pgrace starts (``--server BINDIR``)."""
    run = api.run(
        hostile_scenario({name: sql.format(dir=reachable_dir) for name, (sql, _) in HOSTILE.items()}),
        server=each_server,
    )
    expected = {name: sqlstate for name, (_, sqlstate) in HOSTILE.items()}
    if int(each_server.version.split(".")[0]) < 17:
        expected["adminpack"] = "42501"  # still shipped, and untrusted
    found = {s.step: s.outcome.error.sqlstate if s.outcome and s.outcome.error else None for s in run.step_runs()}
    assert found == expected
    denied = sum(1 for sqlstate in expected.values() if sqlstate == "42501")
    assert render_text(run).count("✗ ERROR 42501") == denied
    assert list(reachable_dir.iterdir()) == []


def test_the_scenario_runs_as_a_role_of_its_own_that_owns_only_its_database(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        hostile_scenario(
            {
                "who": "SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls,"
                " (SELECT count(*) FROM pg_auth_members WHERE member = r.oid) AS memberships,"
                " (SELECT datdba = r.oid FROM pg_database WHERE datname = current_database()) AS owns_database"
                " FROM pg_roles r WHERE rolname = current_user"
            }
        )
    )
    (who,) = run.step_runs()
    assert who.outcome is not None and who.outcome.last_rows is not None
    assert who.outcome.last_rows.text_rows == (("f", "f", "f", "f", "f", "0", "t"),)


def test_setup_teardown_and_checks_run_as_that_role_too(pgrace_run: RunScenario, reachable_dir: Path) -> None:
    program = f"COPY (SELECT 1) TO PROGRAM 'touch {reachable_dir}/%s'"
    with pytest.raises(SetupFailed, match="permission denied to COPY to or from an external program"):
        pgrace_run(hostile_scenario({"noop": "SELECT 1"}, setup=program % "setup"))
    scenario = parse_toml_scenario(
        textwrap.dedent(
            f"""
            setup = "CREATE TABLE t (line text)"
            teardown = "{program % "teardown"}"
            sessions = ["a"]
            [[step]]
            session = "a"
            sql = "SELECT 1"
            [[check]]
            description = "files stay unread"
            sql = "SELECT pg_read_file('/etc/passwd')"
            rows = [["x"]]
            """
        ),
        "hostile.toml",
    )
    run = pgrace_run(scenario)
    teardown = [e for e in run.events if isinstance(e, SetupRan) and e.phase == "teardown"]
    checks = [e for e in run.events if isinstance(e, CheckQueried)]
    assert [e.outcome.error.sqlstate for e in teardown + checks if e.outcome.error] == ["42501", "42501"]
    assert list(reachable_dir.iterdir()) == []


def test_one_run_cannot_reach_another_runs_database(pgrace_run: RunScenario, pgrace_server: ServerInfo) -> None:
    """Runs on one server each have their own role: another run's database is not theirs to drop or enter."""
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        admin.execute("CREATE ROLE other_run LOGIN")
        admin.execute("CREATE DATABASE other_run OWNER other_run")
        other = psycopg.connect(make_conninfo(pgrace_server.dsn, dbname="other_run", user="other_run"))
        try:
            found, _ = errors(
                {
                    "drop": "DROP DATABASE other_run WITH (FORCE)",
                    "settings": "ALTER DATABASE other_run SET default_transaction_read_only = on",
                    "signal": "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'other_run'",
                },
                pgrace_run,
            )
            assert other.execute("SELECT 1").fetchone() == (1,)
        finally:
            other.close()
            admin.execute("DROP DATABASE other_run")
            admin.execute("DROP ROLE other_run")
    assert found == {"drop": "42501", "settings": "42501", "signal": "42501"}


def test_a_role_made_for_a_run_is_dropped_with_its_database(pgrace_run: RunScenario, pgrace_server: ServerInfo) -> None:
    def roles() -> list[tuple[str]]:
        with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
            return admin.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE 'pgrace\\_%' ORDER BY 1").fetchall()

    before = roles()
    pgrace_run(hostile_scenario({"grab": "CREATE TABLE mine (id int); CREATE SCHEMA mine"}))
    assert roles() == before


# -- the cached template -----------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="only as root does the server run as another account")


@pytest.fixture(scope="module")
def own_cache() -> Iterator[Path]:
    """A cache of this module's own, so that nothing here can touch the machine's."""
    path = Path(tempfile.mkdtemp(prefix="pgrace-cache-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    path.chmod(0o755)
    previous = os.environ.get(CACHE_ENV_VAR)
    os.environ[CACHE_ENV_VAR] = str(path)
    try:
        yield path
    finally:
        if previous is None:
            del os.environ[CACHE_ENV_VAR]
        else:
            os.environ[CACHE_ENV_VAR] = previous
        shutil.rmtree(path, ignore_errors=True)


def template_of(cache: Path) -> Path:
    (template,) = cache.glob("template-*/data")
    return template


@needs_root
def test_even_a_superuser_scenario_cannot_write_into_the_cached_template(own_cache: Path, tmp_path: Path) -> None:
    with open_server("embedded"):
        pass  # builds the template
    auto_conf = template_of(own_cache) / "postgresql.auto.conf"
    before = auto_conf.read_text()
    scenario = tmp_path / "poison.toml"
    scenario.write_text(
        "sessions = ['a']\n[[step]]\nsession = 'a'\n"
        f"sql = \"COPY (SELECT 'default_transaction_read_only = on') TO '{auto_conf}'\"\n"
    )
    result = CliRunner().invoke(main, ["run", str(scenario), "--superuser"])
    assert "✗ ERROR 42501: could not open file" in result.output
    assert auto_conf.read_text() == before
    result = CliRunner().invoke(main, ["run", "lost-update"])
    assert result.exit_code == 0, result.output


@needs_root
def test_a_template_the_server_account_could_write_is_built_again_before_use(own_cache: Path) -> None:
    from pgrace.servers.embedded.binaries import _server_user

    with open_server("embedded"):
        pass
    template = template_of(own_cache)
    account = _server_user()
    assert account is not None
    for path in [template, *template.rglob("*")]:  # as an older pgrace left it: the server account's
        os.lchown(path, account.uid, account.gid)
    (template / "postgresql.auto.conf").write_text("default_transaction_read_only = on\n")
    with open_server("embedded") as server, psycopg.connect(server.dsn, autocommit=True) as conn:
        row = conn.execute("SHOW default_transaction_read_only").fetchone()
    assert row == ("off",)
    assert all(os.lstat(p).st_uid == os.geteuid() for p in [template, *template.rglob("*")])


KILL_CONTROL = (
    "SELECT count(*) AS ended FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
    " WHERE application_name LIKE '%/control connection') AS k"
)


def control_killer(setup: str) -> str:
    """Session b ends every control connection of the server mid-run, while a is inside a transaction."""
    return f"""
setup = {json.dumps(setup)}
sessions = ["a", "b"]
[[step]]
session = "a"
sql = "BEGIN"
[[step]]
name = "kill"
session = "b"
sql = {json.dumps(KILL_CONTROL)}
[[step]]
session = "a"
sql = "INSERT INTO t VALUES ('after')"
[[step]]
session = "a"
sql = "COMMIT"
[[check]]
description = "the row is there"
sql = "SELECT count(*) FROM t"
rows = [[1]]
"""


def test_a_step_that_ends_pgraces_control_connection_does_not_end_the_run(pgrace_run: RunScenario) -> None:
    """The control connection runs as the scenario's role, so a step can end it: it is opened again for the checks."""
    run = pgrace_run(parse_toml_scenario(control_killer("CREATE TABLE t (line text)"), "kill-control.toml"))
    kill = next(s for s in run.step_runs() if s.step == "kill")
    assert kill.outcome is not None and kill.outcome.last_rows is not None
    assert kill.outcome.last_rows.text_rows == (("1",),)  # it did end one connection: pgrace's
    assert list(run.check_outcomes()) == [0]
    assert run.ok


def test_explore_goes_on_when_interleavings_end_the_control_connection(pgrace_server: ServerInfo) -> None:
    scenario = parse_toml_scenario(control_killer("CREATE TABLE t (line text)"), "kill-control.toml")
    exploration = api.explore(scenario, server=pgrace_server, search=Exhaustive())
    assert exploration.covers_all and exploration.explored == 4
    assert [c.ok for c in exploration.classes] == [True]


def test_a_setup_whose_settings_would_go_with_it_stops_the_run_saying_why(
    tmp_path: Path, pgrace_server: ServerInfo
) -> None:
    path = tmp_path / "kill-control.toml"
    path.write_text(control_killer("CREATE TABLE t (line text); SET TimeZone = 'UTC'"), encoding="utf-8")
    result = CliRunner().invoke(main, ["run", str(path), "--dsn", pgrace_server.dsn])
    assert result.exit_code == 2
    assert result.output.strip().startswith(f"pgrace: {path}: a step ended pgrace's control connection (")
    assert result.output.strip().endswith(
        "and the setup's session settings went with it; leave the connections named"
        " 'pgrace/.../control connection' alone"
    )
