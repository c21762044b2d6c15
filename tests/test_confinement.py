"""Schema mode refuses, before anything runs, SQL that could reach outside the scratch schema.

The checker is PostgreSQL's own parser (pglast) walking every statement; these tests pin
what it refuses and what it lets through, and that the shipped scenarios and the
isolation corpus all pass it.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from corpus import SPECS, needs_corpus
from documentation import page

from pgrace.cli import main
from pgrace.errors import ScenarioError
from pgrace.frontends import catalog
from pgrace.scratch.confinement import confine_scenario, refusal
from pgrace.servers import ServerInfo

SERVERS_PAGE = page("reference/servers.md")

REFUSED = [
    ("DROP TABLE public.orders", "public.orders"),
    ("SELECT * FROM public.users", "public.users"),
    ("INSERT INTO t SELECT * FROM shop.orders", "shop.orders"),
    ("SELECT public.add_one(1)", "public.add_one"),
    ("SELECT 1::public.money_t", "public.money_t"),
    ("SELECT s.t.c FROM t", "s.t"),
    ("CREATE TABLE t (id int) INHERITS (public.base)", "public.base"),
    ("CREATE TABLE p PARTITION OF public.parts FOR VALUES IN (1)", "public.parts"),
    ("SELECT 1 INTO public.copy", "public.copy"),
    ("ALTER TABLE t SET SCHEMA public", "SET SCHEMA"),
    ("SELECT nextval('public.seq')", "public.seq"),
    ("SELECT 'public.orders'::regclass", "public.orders"),
    ("SET search_path = public", "search_path"),
    ("SET LOCAL search_path TO public, pg_temp", "search_path"),
    ("SELECT set_config('search_path', 'public', false)", "search_path"),
    ("SELECT set_config(current_user, 'x', false)", "set_config"),
    ("CREATE DATABASE other", "CREATE DATABASE"),
    ("DROP DATABASE shop", "DROP DATABASE"),
    ("CREATE ROLE mallory", "CREATE ROLE"),
    ("CREATE USER mallory", "CREATE ROLE"),
    ("ALTER ROLE clerk SUPERUSER", "ALTER ROLE"),
    ("ALTER USER clerk SET search_path = public", "ALTER ROLE"),
    ("DROP ROLE clerk", "DROP ROLE"),
    ("GRANT admins TO clerk", "GRANT"),
    ("ALTER SYSTEM SET fsync = off", "ALTER SYSTEM"),
    ("CREATE SCHEMA evil", "CREATE SCHEMA"),
    ("DROP SCHEMA public CASCADE", "DROP SCHEMA"),
    ("ALTER SCHEMA public RENAME TO gone", "ALTER SCHEMA"),
    ("CREATE EXTENSION pgrowlocks", "CREATE EXTENSION"),
    ("DROP EXTENSION pgrowlocks", "DROP EXTENSION"),
    ("DROP OWNED BY clerk", "DROP OWNED"),
    ("REASSIGN OWNED BY clerk TO postgres", "REASSIGN OWNED"),
    ("COPY t TO PROGRAM 'rm -rf /'", "PROGRAM"),
    ("COPY t FROM '/etc/passwd'", "file"),
    ("COPY t TO '/tmp/out'", "file"),
    ("GRANT ALL ON ALL TABLES IN SCHEMA public TO clerk", "IN SCHEMA public"),
    ("GRANT USAGE ON SCHEMA public TO clerk", "SCHEMA"),
    ("REVOKE ALL ON public.orders FROM clerk", "public.orders"),
    ("ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO clerk", "ALTER DEFAULT PRIVILEGES"),
    ("COMMENT ON DATABASE shop IS 'x'", "COMMENT ON DATABASE"),
    ("ALTER DATABASE shop SET search_path = public", "ALTER DATABASE"),
    ("CREATE EVENT TRIGGER e ON ddl_command_start EXECUTE FUNCTION f()", "CREATE EVENT TRIGGER"),
    ("UPDATE pg_class SET relname = 'x'", "pg_class"),
    ("DELETE FROM pg_catalog.pg_proc", "pg_catalog.pg_proc"),
    ("SELECT pg_read_file('/etc/passwd')", "pg_read_file"),
    ("SELECT lo_import('/etc/passwd')", "lo_import"),
    ("SELECT pg_terminate_backend(42)", "pg_terminate_backend"),
    ("VACUUM", "every table"),
    ("ANALYZE", "every table"),
    ("CLUSTER", "every table"),
    ("REINDEX DATABASE shop", "REINDEX"),
    ("COMMIT PREPARED 'someone elses'", "someone elses"),
    ("DO $$ BEGIN EXECUTE 'DROP TABLE public.orders'; END $$", "EXECUTE"),
    ("DO $$ BEGIN DROP TABLE public.orders; END $$", "public.orders"),
    ("DO $$ BEGIN PERFORM set_config('search_path', 'public', true); END $$", "search_path"),
    ("DO LANGUAGE plperl $$ system('x') $$", "plperl"),
    (
        "CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $$ BEGIN DELETE FROM public.orders; END $$",
        "public.orders",
    ),
    (
        "CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $$ BEGIN EXECUTE format('TRUNCATE %I', 'x'); END $$",
        "EXECUTE",
    ),
    ("CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT count(*)::int FROM public.orders'", "public.orders"),
    ("CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT count(*) FROM public.orders; END", "public"),
    ("CREATE FUNCTION f() RETURNS int LANGUAGE sql SET search_path = public AS 'SELECT 1'", "search_path"),
    ("CREATE FUNCTION f() RETURNS int LANGUAGE c AS 'libc', 'abs'", "LANGUAGE c"),
    ("SELECT 1; DROP TABLE public.orders", "public.orders"),
    ("SELEC 1", "cannot be parsed"),
]

ALLOWED = [
    "CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL)",
    "CREATE TEMP TABLE scratchpad (x int); INSERT INTO pg_temp.scratchpad VALUES (1)",
    "SELECT * FROM pg_catalog.pg_locks l JOIN pg_stat_activity a USING (pid)",
    "SELECT x::pg_catalog.int4, OPERATOR(pg_catalog.+)(1, 2), information_schema.columns.column_name"
    " FROM information_schema.columns",
    "SELECT t.id, t.* FROM t",
    "BEGIN ISOLATION LEVEL SERIALIZABLE; UPDATE t SET x = x + 1 WHERE id = 1; COMMIT",
    "SET deadlock_timeout = '10ms'; SET spec.session = 1; RESET ALL; RESET search_path",
    "SELECT pg_advisory_lock(1), nextval('seq'), 'orders'::regclass, current_setting('search_path')",
    "LOCK TABLE t IN ACCESS EXCLUSIVE MODE",
    "VACUUM t; ANALYZE t (x); CLUSTER t USING t_pkey",
    "COPY t FROM STDIN",
    "PREPARE TRANSACTION 'mine'; COMMIT PREPARED 'mine'",
    "DROP TABLE IF EXISTS users, orders; DROP FUNCTION IF EXISTS f(int); DROP TRIGGER tg ON t",
    "CREATE FUNCTION f(text) RETURNS text IMMUTABLE LANGUAGE plpgsql AS $$ BEGIN"
    " RAISE NOTICE 'x %', current_setting('spec.session')::int; PERFORM pg_advisory_xact_lock(1);"
    " RETURN $1; END $$",
    "CREATE FUNCTION g() RETURNS text LANGUAGE sql AS $$ SELECT string_agg(x, '') FROM t $$",
    "DO $$ DECLARE n int := 0; BEGIN FOR n IN SELECT id FROM t LOOP UPDATE t SET x = n WHERE id = n; END LOOP; END $$",
    "CREATE VIEW v AS SELECT * FROM t; CREATE INDEX ON t (x); ALTER TABLE t ADD COLUMN y int",
    "CREATE TRIGGER tg BEFORE UPDATE ON t FOR EACH ROW EXECUTE FUNCTION f()",
    "GRANT SELECT ON t TO PUBLIC; COMMENT ON TABLE t IS 'mine'",
    "INSERT INTO t VALUES (1) ON CONFLICT (id) DO UPDATE SET x = excluded.x RETURNING *",
    "NOTIFY chan, 'x'; LISTEN chan; SELECT pg_notify('chan', 'y')",
    "SELECT * FROM t FOR UPDATE SKIP LOCKED",
]


@pytest.mark.parametrize(("text", "named"), REFUSED, ids=[t for t, _ in REFUSED])
def test_sql_that_could_reach_outside_the_scratch_schema_is_refused(text: str, named: str) -> None:
    reason = refusal(text)
    assert reason is not None, f"{text!r} should be refused"
    assert named in reason


@pytest.mark.parametrize("text", ALLOWED)
def test_sql_confined_to_the_scratch_schema_is_allowed(text: str) -> None:
    assert refusal(text) is None


def test_every_shipped_scenario_is_confinable() -> None:
    for name in catalog.shipped_names():
        loaded = catalog.read_scenario(name)
        for variant in loaded.variants:
            confine_scenario(loaded.variant_named(variant))


@needs_corpus
def test_every_corpus_spec_is_confinable() -> None:
    for spec in SPECS:
        confine_scenario(catalog.read_scenario(str(spec)))


HOSTILE = """
name = "sneaky"
title = "a step that drops the user's table"
setup = "CREATE TABLE jobs (id int PRIMARY KEY)"
sessions = ["a"]

[[step]]
session = "a"
sql = "SELECT 1"

[[step]]
session = "a"
sql = "DROP TABLE public.victim"
"""


def test_a_refused_scenario_exits_2_naming_file_and_line_and_leaves_nothing(
    pgrace_server: ServerInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS victimdb WITH (FORCE)")
        admin.execute("DROP ROLE IF EXISTS limited")
        admin.execute("CREATE ROLE limited LOGIN NOCREATEDB")
        admin.execute("CREATE DATABASE victimdb OWNER limited")
    dsn = psycopg.conninfo.make_conninfo(pgrace_server.dsn, dbname="victimdb", user="limited")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE public.victim (id int); INSERT INTO public.victim VALUES (1)")
        (tmp_path / "sneaky.toml").write_text(HOSTILE)
        monkeypatch.chdir(tmp_path)
        result = CliRunner().invoke(main, ["run", "sneaky.toml", "--allow-scratch-schema", "--dsn", dsn])
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith("pgrace: sneaky.toml:11: ")
        assert result.stderr.strip() in SERVERS_PAGE  # the docs show this very line
        assert "public.victim" in result.stderr and "Traceback" not in result.output
        assert len(result.stderr.splitlines()) == 1
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM public.victim").fetchone() == (1,)
            schemas = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'pgrace%'").fetchall()
            assert schemas == []
    finally:
        with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS victimdb WITH (FORCE)")
            admin.execute("DROP ROLE IF EXISTS limited")


def test_variables_are_checked_as_they_will_be_filled_in(tmp_path: Path) -> None:
    """A parameter's value is known; a captured identifier is not, so it cannot qualify a name."""
    base = 'name = "v"\ntitle = "t"\nsetup = "CREATE TABLE t (id int)"\nsessions = ["a"]\n'
    captured = base + (
        '[[step]]\nsession = "a"\nsql = "SELECT \'t\' AS s"\ncapture = { s = "s" }\n'
        '[[step]]\nsession = "a"\nsql = \'SELECT * FROM :"s".t\'\n'
    )
    path = tmp_path / "v.toml"
    path.write_text(captured)
    with pytest.raises(ScenarioError, match=r"pgrace_variable\.t"):
        confine_scenario(catalog.read_scenario(str(path)))
    path.write_text(base + '[[step]]\nsession = "a"\nsql = "SELECT :n"\n[params]\nn = 1\n')
    confine_scenario(catalog.read_scenario(str(path)))
