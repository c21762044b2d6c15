"""One scratch database for many runs in a row, reset only when a run left something behind."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from pgrace.scratch.connections import observer_conninfo
from pgrace.scratch.databases import _connect, _create, _drop, aborted_if_lost
from pgrace.scratch.names import _END_SESSIONS_DEADLINE_S
from pgrace.scratch.run import ScratchDatabase, scratch_database
from pgrace.servers import ServerInfo, deferred_interrupts

_USER_OBJECTS = " UNION ALL ".join(
    [
        f"SELECT '{catalog}', count(*) FROM pg_catalog.{catalog} WHERE oid >= 16384"
        for catalog in (
            "pg_class",
            "pg_proc",
            "pg_type",
            "pg_operator",
            "pg_cast",
            "pg_extension",
            "pg_event_trigger",
            "pg_publication",
            "pg_collation",
            "pg_conversion",
            "pg_ts_config",
            "pg_foreign_server",
            "pg_largeobject_metadata",
            "pg_policy",
            "pg_statistic_ext",
        )
    ]
    + [
        "SELECT 'pg_namespace', count(*) FROM pg_catalog.pg_namespace WHERE oid >= 16384"
        " AND nspname !~ '^pg_(toast_)?temp_'",
        "SELECT 'pg_prepared_xacts', count(*) FROM pg_catalog.pg_prepared_xacts WHERE database = current_database()",
        "SELECT 'pg_db_role_setting', count(*) FROM pg_catalog.pg_db_role_setting s"
        " JOIN pg_catalog.pg_database d ON d.oid = s.setdatabase WHERE d.datname = current_database()",
    ]
)


_ROLE_SETTINGS = (
    "SELECT count(*) FROM pg_catalog.pg_db_role_setting s JOIN pg_catalog.pg_roles r ON r.oid = s.setrole"
    " WHERE r.rolname = current_user"
)


def _admin_dsn(database: ScratchDatabase) -> str:
    """The superuser's conninfo in the scratch database (the scenario's own when there is no run role)."""
    return database.admin_dsn if database.admin_dsn is not None else database.dsn


@dataclass
class ReusableScratch:
    """One scratch database for many runs in a row (``pgrace check``), reset only when needed.

    pg_regress runs every isolation spec in the same ``isolation_regression`` database and
    relies on each spec's teardown to clean up; dropping and creating a database per spec
    costs more than most specs. :meth:`reset_if_dirty` recreates the database (same name)
    only when a run left user objects, a prepared transaction or a setting behind.
    """

    server: ServerInfo
    database: ScratchDatabase
    clean: tuple[tuple[str, int], ...] = ()
    resets: int = 0
    _conn: psycopg.Connection[TupleRow] | None = field(default=None, repr=False)

    def fingerprint(self) -> tuple[tuple[str, int], ...]:
        """What the database holds, once the last run's sessions have gone (their locks with them).

        One connection serves every check (a connection costs as much as a small spec).
        """
        with aborted_if_lost(self.server):
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self.database.dsn, autocommit=True)
            conn = self._conn
            deadline = time.monotonic() + _END_SESSIONS_DEADLINE_S
            others = (
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            while (row := conn.execute(others).fetchone()) and row[0] and time.monotonic() < deadline:
                time.sleep(0.001)
            found = [(str(name), int(count)) for name, count in conn.execute(_USER_OBJECTS).fetchall()]
            if self.database.role is not None:  # ALTER ROLE CURRENT_USER SET would reach the next spec's sessions
                row = conn.execute(_ROLE_SETTINGS).fetchone()
                found.append(("role settings", int(row[0]) if row else 0))
        return tuple(found)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def reset_if_dirty(self) -> bool:
        """After a run: True when the database had to be dropped and created again."""
        if self.fingerprint() == self.clean:
            return False
        self.close()  # DROP DATABASE would end it anyway
        name = self.database.name
        admin = _connect(self.server)
        try:
            with deferred_interrupts(), aborted_if_lost(self.server):
                admin = _drop(admin, self.server, name, _admin_dsn(self.database), admin.info.server_version)
                _create(admin, self.server, name, owner=self.database.role)
                if self.database.role is not None:
                    admin.execute(sql.SQL("ALTER ROLE {} RESET ALL").format(sql.Identifier(self.database.role)))
        finally:
            admin.close()
        self.resets += 1
        return True


@contextlib.contextmanager
def scratch_database_with_schema(
    server: ServerInfo, hint: str, schema: str, with_pgrowlocks: bool = True
) -> Iterator[ScratchDatabase]:
    """A scratch database whose sessions work in ``schema``, first on their search_path.

    Run after run on one database (explore, code runs): :func:`schema_reset_sql` undoes what
    a run made, without a new database. ``with_pgrowlocks``: runs that read no row locks
    spare its installation (about a third of making the database).
    """
    with scratch_database(server, hint, working_schema=schema, with_pgrowlocks=with_pgrowlocks) as db:
        if db.observer_dsn is None:
            yield db
        else:
            yield dataclasses.replace(db, observer_dsn=observer_conninfo(db.observer_dsn, schema))


#: What a run's setup or steps made outside the working schema, dropped: schemas of their own, and
#: tables, views, sequences, functions and types in ``public``; never what an extension (pgrowlocks) owns,
#: nor what the role running it could not have made.
_OTHERS_RESET = """
DO $pgrace_reset$
DECLARE
  target record;
BEGIN
  FOR target IN
    SELECT format('DROP SCHEMA %I CASCADE', n.nspname) AS drop FROM pg_catalog.pg_namespace n
    WHERE n.oid >= 16384 AND n.nspname <> {schema} AND n.nspname !~ '^pg_(toast_)?temp_'
      AND pg_catalog.pg_has_role(n.nspowner, 'USAGE')
      AND NOT EXISTS (SELECT FROM pg_catalog.pg_extension e WHERE e.extnamespace = n.oid)
    UNION ALL
    SELECT format('DROP %s IF EXISTS %s CASCADE',
                  CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' WHEN 'S' THEN 'SEQUENCE'
                                 WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END, c.oid::pg_catalog.regclass)
    FROM pg_catalog.pg_class c
    WHERE c.oid >= 16384 AND c.relnamespace = pg_catalog.to_regnamespace('public')
      AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
      AND pg_catalog.pg_has_role(c.relowner, 'USAGE')
      AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
                      AND d.objid = c.oid AND d.deptype IN ('e', 'a', 'i'))
    UNION ALL
    SELECT format('DROP ROUTINE IF EXISTS %s CASCADE', p.oid::pg_catalog.regprocedure)
    FROM pg_catalog.pg_proc p
    WHERE p.oid >= 16384 AND p.pronamespace = pg_catalog.to_regnamespace('public')
      AND pg_catalog.pg_has_role(p.proowner, 'USAGE')
      AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
                      AND d.objid = p.oid AND d.deptype = 'e')
    UNION ALL
    SELECT format('DROP TYPE IF EXISTS %s CASCADE', t.oid::pg_catalog.regtype)
    FROM pg_catalog.pg_type t
    WHERE t.oid >= 16384 AND t.typnamespace = pg_catalog.to_regnamespace('public') AND t.typrelid = 0 AND t.typelem = 0
      AND t.typtype IN ('e', 'd', 'c', 'r', 'm', 'b') AND pg_catalog.pg_has_role(t.typowner, 'USAGE')
      AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d WHERE d.classid = 'pg_catalog.pg_type'::pg_catalog.regclass
                      AND d.objid = t.oid AND d.deptype = 'e')
  LOOP
    EXECUTE target.drop;
  END LOOP;
END
$pgrace_reset$
"""


def schema_reset_sql(schema: str, others: bool = True) -> str:
    """The working schema of :func:`scratch_database_with_schema` dropped and made again, empty; with
    ``others``, whatever the run made outside it (its own schemas, objects in ``public``) dropped too, so
    that every run starts from the same database whatever its setup creates (about 5 ms more a run: the
    block is compiled each time)."""
    working = sql.SQL("DROP SCHEMA {0} CASCADE; CREATE SCHEMA {0}").format(sql.Identifier(schema))
    if not others:
        return working.as_string(None)
    rest = sql.SQL(_OTHERS_RESET.strip()).format(schema=sql.Literal(schema))
    return sql.Composed([working, sql.SQL("; "), rest]).as_string(None)


_ELSEWHERE = re.compile(r"schema|public|search_path|set_config", re.IGNORECASE)


def reaches_other_schemas(texts: Iterable[str]) -> bool:
    """Whether SQL may make objects outside the working schema, first on every session's search_path.

    SQL that never names a schema, ``public`` or the search path creates what it creates in the
    working schema (or a temporary schema, gone with its session); anything else may not.
    """
    return any(_ELSEWHERE.search(text) for text in texts)


@contextlib.contextmanager
def reusable_scratch_database(
    server: ServerInfo, hint: str, database_name: str | None = None
) -> Iterator[ReusableScratch]:
    """A :class:`ReusableScratch` (no pgrowlocks: its users print no row locks); always dropped at the end."""
    with scratch_database(server, hint, database_name=database_name, with_pgrowlocks=False) as db:
        scratch = ReusableScratch(server, db)
        try:
            scratch.clean = scratch.fingerprint()
            yield scratch
        finally:
            scratch.close()
