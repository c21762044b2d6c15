"""pgrace on somebody's real database: it touches nothing outside its scratch space.

These tests make a "user database" full of tables on the test server, point pgrace at
it with a DSN, and compare catalog and row-count snapshots before and after.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import psycopg
import pytest
from click.testing import CliRunner
from corpus import CORPUS, needs_corpus
from procs import start_blocked_run
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgrace.cli import main
from pgrace.scratch import connect, scratch_name
from pgrace.servers import ServerInfo

pytestmark = pytest.mark.server

PASSWORD = "Sup3r-s3cret-pw"


@pytest.fixture(scope="module")
def user_db(pgrace_server: ServerInfo) -> Iterator[str]:
    """A database with a few tables and rows, and a role that may not create databases."""
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS shop WITH (FORCE)")
        admin.execute("CREATE DATABASE shop")
        admin.execute("DROP ROLE IF EXISTS clerk")
        admin.execute(sql.SQL("CREATE ROLE clerk LOGIN NOCREATEDB PASSWORD {}").format(sql.Literal(PASSWORD)))
        admin.execute("GRANT CREATE ON DATABASE shop TO clerk")
    dsn = make_conninfo(pgrace_server.dsn, dbname="shop")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE jobs (id int PRIMARY KEY, status text);"  # same name as the scenarios' tables
            "CREATE TABLE accounts (id int PRIMARY KEY, balance int);"
            "INSERT INTO jobs SELECT g, 'done' FROM generate_series(1, 50) g;"
            "INSERT INTO accounts SELECT g, 1000 FROM generate_series(1, 20) g;"
            "CREATE VIEW rich AS SELECT * FROM accounts WHERE balance > 500;"
        )
    yield dsn
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS shop WITH (FORCE)")
        admin.execute("DROP ROLE IF EXISTS clerk")


def snapshot(server: ServerInfo, dsn: str) -> dict[str, object]:
    with psycopg.connect(server.dsn, autocommit=True) as admin:
        databases = admin.execute("SELECT datname FROM pg_database ORDER BY 1").fetchall()
        roles = admin.execute("SELECT rolname FROM pg_roles ORDER BY 1").fetchall()
    with psycopg.connect(dsn, autocommit=True) as conn:
        relations = conn.execute(
            "SELECT n.nspname, c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') ORDER BY 1, 2"
        ).fetchall()
        schemas = conn.execute("SELECT nspname FROM pg_namespace ORDER BY 1").fetchall()
        extensions = conn.execute("SELECT extname FROM pg_extension ORDER BY 1").fetchall()
        rows = conn.execute(
            "SELECT (SELECT count(*) FROM jobs), (SELECT sum(balance) FROM accounts),"
            " (SELECT count(*) FROM jobs WHERE status = 'done')"
        ).fetchone()
    return {
        "databases": databases,
        "roles": roles,
        "relations": relations,
        "schemas": schemas,
        "extensions": extensions,
        "rows": rows,
    }


def clerk_dsn(user_db: str) -> str:
    return make_conninfo(user_db, user="clerk", password=PASSWORD)


def test_without_createdb_pgrace_says_so_and_stops(user_db: str, pgrace_server: ServerInfo) -> None:
    before = snapshot(pgrace_server, user_db)
    result = CliRunner().invoke(main, ["run", "nowait", "--dsn", clerk_dsn(user_db)])
    assert result.exit_code == 3
    assert "may not create databases" in result.stderr and "--allow-scratch-schema" in result.stderr
    assert snapshot(pgrace_server, user_db) == before


def test_an_allowed_scratch_schema_is_used_and_dropped(user_db: str, pgrace_server: ServerInfo) -> None:
    before = snapshot(pgrace_server, user_db)
    cli = CliRunner()
    for name in ["head-of-line-blocking", "nowait", "lost-update"]:
        result = cli.invoke(
            main, ["run", name, "--format", "json", "--allow-scratch-schema", "--dsn", clerk_dsn(user_db)]
        )
        assert result.exit_code == 0, result.output
    # pgrowlocks is not installed in the user's database, and pgrace will not install it
    # there: row-lock expectations are unknown and fail rather than guess.
    result = cli.invoke(main, ["run", "offset-overlock", "--allow-scratch-schema", "--dsn", clerk_dsn(user_db)])
    assert result.exit_code == 1
    assert "got unknown (pgrowlocks is not available)" in result.output
    assert snapshot(pgrace_server, user_db) == before  # same tables, same rows, no leftover schema


def test_passwords_never_appear_in_any_output(user_db: str) -> None:
    uri = f"postgresql://clerk:{PASSWORD}@/shop?host={conninfo_to_dict(user_db)['host']}"
    cli = CliRunner()
    outputs = []
    for fmt in ["text", "json", "isolation"]:
        result = cli.invoke(main, ["run", "lost-update", "--format", fmt, "--allow-scratch-schema", "--dsn", uri])
        assert result.exit_code == 0, result.output
        outputs.append(result.output)
    for bad in [uri.replace("/shop", "/nosuchdb"), uri.replace("host=", "host=/nonexistent")]:
        result = cli.invoke(main, ["run", "lost-update", "--dsn", bad])
        assert result.exit_code == 3
        outputs.append(result.output)
    assert all(PASSWORD not in output for output in outputs)
    assert any("clerk" in output for output in outputs)  # the user is named, only the secret is hidden


def test_a_server_started_for_the_command_is_not_swept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server pgrace has just made from its template holds nothing a killed run left: no sweep, no connection."""
    from pgrace import scratch

    def sweep(server: ServerInfo) -> scratch.Leftovers:
        raise AssertionError(f"swept {server.label}")

    monkeypatch.setattr(scratch, "sweep_leftovers", sweep)
    result = CliRunner().invoke(main, ["run", "nowait"])
    assert result.exit_code == 0, result.output  # a --dsn server is swept: the next test


def test_a_killed_run_on_a_dsn_server_is_cleaned_by_the_next_run(pgrace_server: ServerInfo) -> None:
    child, _ = start_blocked_run(["--dsn", pgrace_server.dsn])
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=30)
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        left = [r[0] for r in admin.execute("SELECT datname FROM pg_database WHERE datname LIKE 'pgrace%'")]
    assert len(left) == 1, "the killed run's scratch database should still be there"
    result = CliRunner().invoke(main, ["run", "nowait", "--dsn", pgrace_server.dsn])
    assert result.exit_code == 0
    assert f"pgrace: removed {left[0]}, left behind by a killed pgrace run\n" in result.stderr
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        assert admin.execute("SELECT count(*) FROM pg_database WHERE datname LIKE 'pgrace%'").fetchone() == (0,)
        backends = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgrace/%'"
        ).fetchone()
        assert backends == (0,)


# --- schema mode keeps every statement inside the scratch schema ---------------------------------------


@pytest.fixture
def shop2(pgrace_server: ServerInfo) -> Iterator[str]:
    """A database owned by a role without CREATEDB, with its own ``orders`` and ``users`` in ``public``."""
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS shop2 WITH (FORCE)")
        admin.execute("DROP ROLE IF EXISTS keeper")
        admin.execute(sql.SQL("CREATE ROLE keeper LOGIN NOCREATEDB PASSWORD {}").format(sql.Literal(PASSWORD)))
        admin.execute("CREATE DATABASE shop2 OWNER keeper")
    dsn = make_conninfo(pgrace_server.dsn, dbname="shop2", user="keeper", password=PASSWORD)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE public.users (id int PRIMARY KEY, name text);"
            "CREATE TABLE public.orders (id int PRIMARY KEY, user_id int REFERENCES public.users);"
            "INSERT INTO public.users SELECT g, 'user ' || g FROM generate_series(1, 30) g;"
            "INSERT INTO public.orders SELECT g, g % 30 + 1 FROM generate_series(1, 90) g;"
        )
    yield dsn
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS shop2 WITH (FORCE)")
        admin.execute("DROP ROLE IF EXISTS keeper")


def shop2_state(dsn: str) -> tuple[object, ...]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return (
            conn.execute(
                "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.relkind = 'r' AND n.nspname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2"
            ).fetchall(),
            conn.execute(
                "SELECT to_regclass('public.orders') IS NOT NULL AND to_regclass('public.users') IS NOT NULL"
            ).fetchall(),
        )


@needs_corpus
@pytest.mark.parametrize("search_path", [None, "options", "role"])
def test_a_spec_in_schema_mode_leaves_the_owners_tables_alone(
    shop2: str, pgrace_server: ServerInfo, search_path: str | None
) -> None:
    """The spec's setup drops and creates ``users`` and ``orders``: in the scratch schema only.

    Also when the DSN's own options, or the role's defaults, put ``public`` on the search_path.
    """
    before = shop2_state(shop2)
    assert before[1] == [(True,)]
    dsn = shop2
    if search_path == "options":
        dsn = make_conninfo(shop2, options="-c search_path=public -c statement_timeout=60s")
    elif search_path == "role":
        with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
            admin.execute("ALTER ROLE keeper SET search_path = public")
    spec = CORPUS / "specs" / "update-locked-tuple.spec"
    result = CliRunner().invoke(main, ["run", str(spec), "--allow-scratch-schema", "--dsn", dsn])
    assert result.exit_code == 0, result.output
    assert shop2_state(shop2) == before
    with psycopg.connect(shop2, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM public.orders").fetchone() == (90,)


def test_a_run_connection_keeps_every_option_and_lands_in_the_scratch_schema(shop2: str) -> None:
    """The DSN's options, the caller's (a spec's datestyle) and the scratch search_path, which wins."""
    name = scratch_name("options")
    with psycopg.connect(shop2, autocommit=True) as owner:
        owner.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        try:
            dsn = make_conninfo(shop2, options="-c search_path=public -c statement_timeout=61s")
            with connect(dsn, name, options="-c datestyle=Postgres,MDY", application_name="pgrace/x/a") as conn:
                shown = conn.execute(
                    "SELECT current_schema(), current_setting('statement_timeout'), current_setting('datestyle')"
                ).fetchone()
            assert shown == (name, "61s", "Postgres, MDY")
        finally:
            owner.execute(sql.SQL("DROP SCHEMA {}").format(sql.Identifier(name)))
