"""A team's schema as the setup: ``setup_file`` loads ``pg_dump --schema-only`` output as it is.

The dump is made by the server's own pg_dump from a real database (with its ``\\restrict``
fence, its ``SET``s and ``check_function_bodies = false``), and every interleaving of an
exploration starts from the same database whatever the setup creates: a schema of its own,
a sequence, objects in ``public``, with no teardown written by hand.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from pgrace import api
from pgrace.cli import main
from pgrace.drivers.searches import Exhaustive
from pgrace.errors import ScenarioError
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.servers import ServerInfo

SCHEMA = """
CREATE SCHEMA app;
CREATE FUNCTION app.touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.updated = now(); RETURN NEW; END $$;
CREATE TABLE app.accounts (id serial PRIMARY KEY, balance int NOT NULL CHECK (balance >= 0), updated timestamptz);
CREATE TRIGGER touch BEFORE UPDATE ON app.accounts FOR EACH ROW EXECUTE FUNCTION app.touch();
CREATE TABLE public.audit (id bigserial PRIMARY KEY, note text NOT NULL);
CREATE VIEW public.balances AS SELECT id, balance FROM app.accounts;
"""

SCENARIO = """
name = "dumped"
setup_file = "schema.sql"
setup = "INSERT INTO app.accounts (balance) VALUES (500); INSERT INTO audit (note) VALUES ('seeded')"
sessions = ["alice", "bob"]

[[step]]
name = "alice-read"
session = "alice"
sql = "SELECT balance FROM app.accounts WHERE id = 1"
capture = "balance"

[[step]]
name = "bob-read"
session = "bob"
sql = "SELECT balance FROM app.accounts WHERE id = 1"
capture = "balance"

[[step]]
name = "alice-write"
session = "alice"
sql = "UPDATE app.accounts SET balance = :balance - 100 WHERE id = 1"

[[step]]
name = "bob-write"
session = "bob"
sql = "UPDATE app.accounts SET balance = :balance - 100 WHERE id = 1"

[[check]]
description = "the seed's ids are the first ones every time"
sql = "SELECT (SELECT max(id) FROM app.accounts), (SELECT max(id) FROM audit)"
rows = [[1, 1]]
"""


def dump(server: ServerInfo, tmp_path: Path, *options: str) -> Path:
    """The schema made on a real database, then dumped by the server's own pg_dump."""
    assert server.bindir is not None
    with psycopg.connect(server.dsn, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS team_schema")
        admin.execute("CREATE DATABASE team_schema")
    dsn = server.dsn.replace("dbname=postgres", "dbname=team_schema")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
        out = subprocess.run(
            [os.path.join(server.bindir, "pg_dump"), "--schema-only", *options, dsn],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        with psycopg.connect(server.dsn, autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS team_schema")
    path = tmp_path / "schema.sql"
    path.write_text(out)
    return path


def test_a_pg_dump_schema_is_the_setup_and_every_interleaving_starts_from_it(
    pgrace_server: ServerInfo, tmp_path: Path
) -> None:
    schema = dump(pgrace_server, tmp_path, "--no-owner", "--no-privileges")
    text = schema.read_text()
    assert "\\restrict" in text and "check_function_bodies = false" in text  # pg_dump 18's own output
    (tmp_path / "dumped.toml").write_text(SCENARIO)
    explored = api.explore(api.read_scenario(str(tmp_path / "dumped.toml")), server=pgrace_server, search=Exhaustive())
    assert explored.explored == 6 and explored.complete
    (only,) = explored.classes  # nothing a run left behind changed the next one's ids
    assert only.count == 6 and only.ok


def test_the_dumps_settings_do_not_reach_the_scenarios_own_setup(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    dump(pgrace_server, tmp_path, "--no-owner", "--no-privileges")
    (tmp_path / "dumped.toml").write_text(SCENARIO)  # its setup names audit unqualified: search_path is back
    scenario = parse_toml_scenario(SCENARIO, str(tmp_path / "dumped.toml"))
    assert scenario.setup[1].startswith("RESET ") and "RESET search_path;" in scenario.setup[1]
    run = api.run(scenario, server=pgrace_server)
    assert run.ok, [e for e in run.events][:3]


def test_ownership_and_privileges_are_refused_with_the_dump_options_that_leave_them_out(
    pgrace_server: ServerInfo, tmp_path: Path
) -> None:
    schema = dump(pgrace_server, tmp_path)  # as a team dumps it: with OWNER TO
    (tmp_path / "dumped.toml").write_text(SCENARIO)
    with pytest.raises(ScenarioError) as caught:
        parse_toml_scenario(SCENARIO, str(tmp_path / "dumped.toml"))
    error = caught.value
    assert error.file == str(schema)
    lines = schema.read_text().split("\n")
    assert error.line is not None and "OWNER TO" in lines[error.line - 1]
    assert "--no-owner --no-privileges" in str(error)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("CREATE TABLE t (id int);\n\\! touch /tmp/pgrace-pwned\n", 'meta-command "\\! touch /tmp/pgrace-pwned"'),
        ("CREATE TABLE t (id int);\nGRANT SELECT ON t TO someone;\n", "sets privileges"),
        ("CREATE TABLE t (id int;\n", "is not SQL PostgreSQL can read"),
    ],
)
def test_a_hostile_or_broken_setup_file_is_one_line_naming_it(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "schema.sql").write_text(content)
    (tmp_path / "dumped.toml").write_text(SCENARIO)
    result = CliRunner().invoke(main, ["show", str(tmp_path / "dumped.toml")])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and str(tmp_path / "schema.sql") in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not os.path.exists("/tmp/pgrace-pwned")


def test_a_fifo_or_a_missing_setup_file_is_refused_at_once(tmp_path: Path) -> None:
    (tmp_path / "dumped.toml").write_text(SCENARIO)
    missing = CliRunner().invoke(main, ["show", str(tmp_path / "dumped.toml")])
    assert missing.exit_code == 2 and "setup_file" in missing.stderr and "dumped.toml:3" in missing.stderr
    os.mkfifo(tmp_path / "schema.sql")
    fifo = CliRunner().invoke(main, ["show", str(tmp_path / "dumped.toml")])
    assert fifo.exit_code == 2 and "is not a regular file" in fifo.stderr


def test_a_setup_that_makes_its_own_schema_needs_no_teardown(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    path = tmp_path / "own.toml"
    path.write_text(
        SCENARIO.replace('setup_file = "schema.sql"\n', "").replace(
            'setup = "', 'setup = "' + SCHEMA.replace("\n", " ").replace('"', '\\"').replace("$$", "$$") + " "
        )
    )
    explored = api.explore(api.read_scenario(str(path)), server=pgrace_server, search=Exhaustive())
    assert explored.explored == 6
    (only,) = explored.classes
    assert only.count == 6 and only.ok
