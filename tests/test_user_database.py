"""Every shipped scenario and every corpus spec, run against a user's database full of look-alikes.

The user's database holds a table named like every table the scenarios and specs create
(found by parsing their SQL with PostgreSQL's parser, not listed by hand), with rows, plus
functions named like theirs, a view, a role with a grant, and pgrowlocks. Each scenario
and spec runs twice against it: in schema mode as a role without CREATEDB that does not
own the database, and in database mode. Before and after, a snapshot of the catalogs, the
row counts and a checksum of every table: they must be identical. Every run must also be
right: a scenario's expectations hold, a spec prints exactly its expected output.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from corpus import SPECS, needs_corpus
from pglast import ast, parse_sql
from pglast.visitors import Visitor
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgrace.cli import main
from pgrace.drivers.speccheck import compare_output, expected_files
from pgrace.frontends import catalog
from pgrace.model.scenario import Scenario
from pgrace.scratch.confinement import sql_texts
from pgrace.servers import ServerInfo

DATABASE = "lookalike"
ROLE = "stranger"  # not the owner, no CREATEDB: may only create schemas in the database
PASSWORD = "str4nger-pw"


def everything() -> list[Scenario]:
    scenarios = []
    for name in catalog.shipped_names():
        loaded = catalog.read_scenario(name)
        scenarios += [loaded.variant_named(v) for v in loaded.variants]
    return scenarios + [catalog.read_scenario(str(spec)) for spec in SPECS]


def created_names(scenarios: list[Scenario]) -> tuple[set[str], set[str]]:
    """The tables (and views, sequences) and the functions the scenarios' SQL creates, by parsing it."""
    relations: set[str] = set()
    functions: set[str] = set()

    def name(relation: ast.RangeVar | None) -> str:
        assert relation is not None and relation.relname is not None
        return relation.relname

    class Creates(Visitor):
        def visit_CreateStmt(self, ancestors: object, node: ast.CreateStmt) -> None:
            relations.add(name(node.relation))

        def visit_ViewStmt(self, ancestors: object, node: ast.ViewStmt) -> None:
            relations.add(name(node.view))

        def visit_CreateSeqStmt(self, ancestors: object, node: ast.CreateSeqStmt) -> None:
            relations.add(name(node.sequence))

        def visit_CreateFunctionStmt(self, ancestors: object, node: ast.CreateFunctionStmt) -> None:
            assert node.funcname is not None
            functions.add(node.funcname[-1].sval)

    for scenario in scenarios:
        for text, _ in sql_texts(scenario):
            Creates()(parse_sql(text))
    return relations, functions


@pytest.fixture(scope="module")
def lookalike(pgrace_server: ServerInfo) -> Iterator[tuple[str, str]]:
    """(the superuser's DSN of the user database, the limited role's DSN of it)."""
    relations, functions = created_names(everything())
    assert {"accounts", "jobs", "users", "orders", "foo", "bar"} <= relations  # the parse found them
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(ROLE)))
        admin.execute("DROP ROLE IF EXISTS lookalike_reader")
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN NOCREATEDB PASSWORD {}").format(sql.Identifier(ROLE), sql.Literal(PASSWORD))
        )
        admin.execute("CREATE ROLE lookalike_reader NOLOGIN")
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
        admin.execute(
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(DATABASE), sql.Identifier(ROLE))
        )
        # Three specs set deadlock_timeout, a superuser setting: what a DBA grants such a role.
        admin.execute(sql.SQL("GRANT SET ON PARAMETER deadlock_timeout TO {}").format(sql.Identifier(ROLE)))
    owner_dsn = make_conninfo(pgrace_server.dsn, dbname=DATABASE)
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pgrowlocks")
        for name in sorted(relations):
            table = sql.Identifier("public", name)
            conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text)").format(table))
            conn.execute(
                sql.SQL("INSERT INTO {} SELECT g, {} || g FROM generate_series(1, 7) g").format(
                    table, sql.Literal(f"{name} row ")
                )
            )
        for name in sorted(functions):
            for args in ("", "text"):
                conn.execute(
                    sql.SQL(
                        "CREATE FUNCTION {}({}) RETURNS text LANGUAGE sql AS $$ SELECT 'the user''s own' $$"
                    ).format(sql.Identifier("public", name), sql.SQL(args))
                )
        conn.execute("CREATE VIEW public.overview AS SELECT count(*) AS n FROM public.accounts")
        conn.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO lookalike_reader")
        conn.execute("COMMENT ON TABLE public.jobs IS 'the real job queue'")
    yield owner_dsn, make_conninfo(owner_dsn, user=ROLE, password=PASSWORD)
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))
        admin.execute(sql.SQL("REVOKE SET ON PARAMETER deadlock_timeout FROM {}").format(sql.Identifier(ROLE)))
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(ROLE)))
        admin.execute("DROP ROLE IF EXISTS lookalike_reader")


def snapshot(owner_dsn: str) -> dict[str, object]:
    """Catalogs of the cluster and of the user database, and every user table's row count and checksum."""
    system = "('pg_catalog', 'information_schema', 'pg_toast')"
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        shot: dict[str, object] = {
            name: conn.execute(query).fetchall()
            for name, query in {
                "databases": "SELECT datname, datdba::regrole::text FROM pg_database ORDER BY 1",
                "roles": "SELECT rolname, rolsuper, rolcreatedb, rolcanlogin FROM pg_roles ORDER BY 1",
                "role settings": "SELECT setdatabase, setrole, setconfig::text FROM pg_db_role_setting ORDER BY 1, 2",
                "schemas": "SELECT nspname, nspowner::regrole::text, nspacl::text FROM pg_namespace ORDER BY 1",
                "relations": "SELECT n.nspname, c.relname, c.relkind, c.relowner::regrole::text, c.relacl::text,"
                " obj_description(c.oid, 'pg_class') FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                f" WHERE n.nspname NOT IN {system} ORDER BY 1, 2",
                "functions": "SELECT n.nspname, p.oid::regprocedure::text, p.prosrc FROM pg_proc p"
                f" JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname NOT IN {system} ORDER BY 1, 2",
                "extensions": "SELECT extname, extnamespace::regnamespace::text FROM pg_extension ORDER BY 1",
                "prepared": "SELECT gid FROM pg_prepared_xacts ORDER BY 1",
                "large objects": "SELECT count(*) FROM pg_largeobject_metadata",
            }.items()
        }
        tables = conn.execute(
            "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            f" WHERE c.relkind = 'r' AND n.nspname NOT IN {system} ORDER BY 1"
        ).fetchall()
        shot["rows"] = [
            (name, *row)
            for (name,) in tables
            for row in conn.execute(
                sql.SQL(
                    "SELECT count(*), md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) FROM {} t"
                ).format(sql.SQL(name))
            ).fetchall()
        ]
    return shot


@needs_corpus
@pytest.mark.thorough  # a minute; tests/test_safety.py is the everyday check of a user's database
def test_every_scenario_and_spec_in_both_modes_leaves_the_users_database_as_it_was(
    lookalike: tuple[str, str],
) -> None:
    owner_dsn, stranger_dsn = lookalike
    before = snapshot(owner_dsn)
    cli = CliRunner()
    wrong: list[str] = []
    for mode, args in (
        ("schema mode", ["--allow-scratch-schema", "--dsn", stranger_dsn]),
        ("database mode", ["--dsn", owner_dsn]),
    ):
        for scenario in everything():
            if scenario.dialect == "spec":
                result = cli.invoke(main, ["run", scenario.source, "--format", "isolation", *args])
                output = result.stdout
                compared = compare_output(output, expected_files(Path(scenario.source)), actual_name="pgrace")
                right = result.exit_code == 0 and compared.matched is not None
            else:
                result = cli.invoke(main, ["run", scenario.name, f"--{scenario.variant}", *args])
                right = result.exit_code == 0
            if not right or "Traceback" in result.output:
                wrong.append(
                    f"{mode}: {scenario.source} ({scenario.variant}): exit {result.exit_code}\n{result.output}"
                )
    assert not wrong, "\n".join(w.split("\n")[0] + "\n" + w.split("\n")[1] for w in wrong)
    assert snapshot(owner_dsn) == before
