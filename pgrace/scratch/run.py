"""The scratch space of one run: a database, or a schema of the DSN's database, dropped at the end."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import TupleRow

from pgrace.errors import RunAborted, ServerUnavailable
from pgrace.model.scenario import Scenario
from pgrace.scratch.connections import _BACKENDS, observer_conninfo
from pgrace.scratch.databases import (
    NoCreateDb,
    _claim_new_name,
    _connect,
    _create,
    _drop,
    _install_pgrowlocks,
    _try_pgrowlocks,
    _until_gone,
    aborted_if_lost,
)
from pgrace.scratch.names import _DROP_LOCK_TIMEOUT, is_scratch_name, scratch_name
from pgrace.scratch.roles import _create_role, _create_watcher, _drop_role, login_of, watcher_of
from pgrace.servers import ServerInfo, deferred_interrupts, scrub_secrets


@dataclass(frozen=True)
class ScratchDatabase:
    """A throwaway database (or schema) for one run."""

    dsn: str
    """conninfo of the scratch database for the scenario's SQL: sessions, setup, teardown, checks (the
    server's DSN with dbname, and the run's role, replaced; in schema mode with the scratch ``search_path``
    in its options)."""
    name: str
    has_pgrowlocks: bool
    """Whether the pgrowlocks extension could be created; lock reports need it."""
    schema: str | None = None
    """Set when the run uses a scratch *schema* in the user's database instead."""
    role: str | None = None
    """The role made for this run that the scenario's SQL runs as (None: the DSN's own role)."""
    observer_dsn: str | None = None
    """conninfo of pgrace's own observer when it is not ``dsn``: a role of its own, a member of the
    run's role (it sees and reads what the run's sessions do, with their privileges and no more:
    whatever scenario code it is led to call runs as no superuser), which the run's role cannot
    signal; its ``search_path`` is fixed, pg_catalog first."""
    admin_dsn: str | None = None
    """conninfo of the server's superuser in this database (fixed ``search_path``), for pgrace's own
    housekeeping there (prepared transactions); None when there is no run role."""


@contextlib.contextmanager
def scratch_database(
    server: ServerInfo,
    hint: str,
    allow_schema: bool = False,
    scenario: Scenario | None = None,
    database_name: str | None = None,
    with_pgrowlocks: bool = True,
    working_schema: str | None = None,
) -> Iterator[ScratchDatabase]:
    """Create a fresh database, yield it, and always drop it (terminating its connections).

    Without the CREATEDB privilege this fails, unless ``allow_schema``: then ``scenario``
    is checked for SQL that could reach outside a schema (refused with ScenarioError),
    and a uniquely named schema in the connection's own database is used and dropped instead.
    ``database_name`` gives the database that exact name instead (specs that name their
    database, as pg_regress's ``isolation_regression``); it must not exist yet.

    On a server pgrace started (``server.scenario_role``) the scenario runs as a role made for
    this run: LOGIN, no superuser, CREATEDB, CREATEROLE, replication or BYPASSRLS, member of no
    other role, owner of the database; it is dropped with it. pgrowlocks is installed by the
    superuser. So scenario SQL cannot run programs, touch files, change the server's
    configuration or reach another run's database or sessions.

    ``working_schema``: a schema made in the database by its owner, first on the database's
    ``search_path`` (see :func:`pgrace.scratch.scratch_database_with_schema`).
    """
    admin = _connect(server)
    role: str | None = None
    login: dict[str, str] = {}
    watching: dict[str, str] = {}
    try:
        name = database_name if database_name is not None else _claim_new_name(admin, server, hint)
        dsn = make_conninfo(server.dsn, dbname=name)
        server_version = admin.info.server_version
        if server.scenario_role:
            role = name if is_scratch_name(name) else scratch_name(hint)
            login = login_of(server, role)
            _create_role(admin, server, role, login)
        try:
            _create(admin, server, name, owner=role)
        except NoCreateDb as exc:
            if allow_schema:
                in_schema = True
            elif scenario is not None:  # a scenario run, the one kind that can live in a schema instead
                raise NoCreateDb(
                    f"{exc}, or pass --allow-scratch-schema to use a throwaway schema in its database instead"
                ) from exc.__cause__
            else:
                raise
        except KeyboardInterrupt:
            # Interrupted around the CREATE: the database may exist by now.
            with deferred_interrupts(), contextlib.suppress(RunAborted):
                admin = _drop(admin, server, name, dsn, server_version)
            raise
        else:
            in_schema = False
        if in_schema:
            if scenario is None:
                raise ValueError("schema mode needs the scenario, to check its SQL first")
            from pgrace.scratch.confinement import confine_scenario

            confine_scenario(scenario)
            with _scratch_schema(admin, server, name) as scratch:
                yield scratch
            return
        try:
            closed: list[int] = []
            with aborted_if_lost(server):
                has_pgrowlocks = _furnish(server, dsn, name, role, with_pgrowlocks, working_schema, closed)
                if role is not None:
                    watching = login_of(server, watcher_of(role))
                    _create_watcher(admin, server, role, watching)
                _until_gone(admin, closed)  # a run's sessions find none of pgrace's own backends still exiting
            yield ScratchDatabase(
                dsn=make_conninfo(dsn, **login) if role else dsn,
                name=name,
                has_pgrowlocks=has_pgrowlocks,
                role=role,
                observer_dsn=observer_conninfo(make_conninfo(dsn, **watching)) if role else None,
                admin_dsn=observer_conninfo(dsn) if role else None,
            )
        except BaseException:
            # The run's own error is the one to report; a failed drop must not mask it.
            with deferred_interrupts(), contextlib.suppress(RunAborted):
                admin = _drop(admin, server, name, dsn, server_version)
            raise
        with deferred_interrupts():
            vanished = not _exists(admin, "database", name)
            admin = _drop(admin, server, name, dsn, server_version)
        if vanished:
            raise RunAborted(f"the scratch database {name} disappeared during the run: its results cannot be trusted")
    finally:
        if role is not None:
            with deferred_interrupts():
                admin = _drop_role(admin, server, watcher_of(role), grants=False)
                admin = _drop_role(admin, server, role)
        admin.close()


def _furnish(
    server: ServerInfo,
    dsn: str,
    name: str,
    role: str | None,
    with_pgrowlocks: bool,
    schema: str | None,
    closed: list[int],
) -> bool:
    """pgrowlocks (installed by the superuser) and the working schema (made by the database's owner),
    on one connection: a connection costs as much as both. Returns whether pgrowlocks is there;
    ``closed`` gets the backend of the connection it closed."""
    if schema is None:
        return with_pgrowlocks and _try_pgrowlocks(dsn, closed)
    make = sql.SQL("CREATE SCHEMA {0}; ALTER DATABASE {1} SET search_path = {0}, public").format(
        sql.Identifier(schema), sql.Identifier(name)
    )
    if role is not None:  # the owner makes it, as its own connection would
        make = sql.SQL("SET ROLE {0}; {1}; RESET ROLE").format(sql.Identifier(role), make)
    with aborted_if_lost(server), psycopg.connect(dsn, autocommit=True) as conn:  # the server may stop meanwhile
        closed.append(conn.info.backend_pid)
        has_pgrowlocks = with_pgrowlocks and _install_pgrowlocks(conn)
        conn.execute(make)
    return has_pgrowlocks


_ROOM = """
SELECT current_setting('max_connections')::int,
       current_setting('superuser_reserved_connections')::int
         + coalesce(current_setting('reserved_connections', true)::int, 0),
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int
"""


@dataclass(frozen=True)
class ConnectionRoom:
    """How many more connections the server takes: its max_connections, less the reserved and the used."""

    most: int
    reserved: int
    used: int

    @property
    def free(self) -> int:
        return self.most - self.reserved - self.used

    def __str__(self) -> str:
        return f"max_connections = {self.most}, {self.reserved} reserved, {self.used} in use"


def connection_room(server: ServerInfo) -> ConnectionRoom:
    """Asked once, before a driver opens many connections: too many fail one by one, as tracebacks or hangs."""
    try:
        with psycopg.connect(server.dsn, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(_ROOM).fetchone()
    except psycopg.Error as exc:
        raise ServerUnavailable(f"cannot ask the server how many connections it allows: {exc}") from None
    assert row is not None
    most, reserved, used = row
    return ConnectionRoom(most, reserved, used - 1)  # this connection is closed by now


@contextlib.contextmanager
def _scratch_schema(admin: psycopg.Connection[TupleRow], server: ServerInfo, name: str) -> Iterator[ScratchDatabase]:
    """A uniquely named schema in the server DSN's database, the only one on every session's search_path.

    Only the schema is created and dropped (CASCADE); pgrowlocks is used only when it is
    already installed, since installing it would change the user's database.
    """
    try:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    except KeyboardInterrupt:
        # Interrupted around the CREATE: the schema may exist by now.
        with deferred_interrupts(), contextlib.suppress(RunAborted):
            _drop_own_schema(admin, server, name)
        raise
    except psycopg.Error as exc:
        raise ServerUnavailable(
            f"cannot create scratch schema {name} on {server.label}: {scrub_secrets(str(exc).strip(), server.dsn)}"
        ) from exc
    with aborted_if_lost(server):
        row = admin.execute("SELECT to_regproc('pgrowlocks') IS NOT NULL").fetchone()
    options = conninfo_to_dict(server.dsn).get("options") or ""
    dsn = make_conninfo(server.dsn, options=f"{options} -c search_path={name}".strip())
    try:
        yield ScratchDatabase(dsn=dsn, name=name, has_pgrowlocks=bool(row and row[0]), schema=name)
    except BaseException:
        with deferred_interrupts(), contextlib.suppress(RunAborted):
            _drop_own_schema(admin, server, name)
        raise
    with deferred_interrupts():
        vanished = not admin.broken and not _exists(admin, "schema", name)
        _drop_own_schema(admin, server, name)
    if vanished:
        raise RunAborted(f"the scratch schema {name} disappeared during the run: its results cannot be trusted")


def _drop_own_schema(admin: psycopg.Connection[TupleRow], server: ServerInfo, name: str) -> None:
    """End this run's own lingering backends (by pid and start time), then drop the schema.

    ``admin`` is used unless it died meanwhile (then the run's lock is gone with it, and a
    fresh connection drops what is left).
    """
    backends = _BACKENDS.pop(name, [])
    with contextlib.ExitStack() as stack:
        if admin.closed or admin.broken:
            admin = stack.enter_context(_connect(server))
        try:
            if backends:
                admin.execute(
                    "SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a"
                    " JOIN unnest(%s::int[], %s::bigint[]) AS ours(pid, started) ON a.pid = ours.pid"
                    " AND (extract(epoch FROM a.backend_start) * 1000000)::bigint = ours.started",
                    ([pid for pid, _ in backends], [start for _, start in backends]),
                )
            _drop_schema(admin, name)
        except psycopg.Error as exc:
            raise RunAborted(
                f"could not drop scratch schema {name} on {server.label} (`pgrace clean` will): "
                f"{scrub_secrets(str(exc).strip(), server.dsn)}"
            ) from exc


def _drop_schema(admin: psycopg.Connection[TupleRow], name: str) -> None:
    """Roll back the schema's prepared transactions (they hold its locks whoever is gone), then drop it.

    A prepared transaction's locks have no pid; they are told apart by the virtual
    transaction that also holds the lock on its own transaction id.
    """
    gids = admin.execute(
        "SELECT DISTINCT p.gid FROM pg_prepared_xacts p"
        " JOIN pg_locks x ON x.locktype = 'transactionid' AND x.transactionid = p.transaction AND x.pid IS NULL"
        " JOIN pg_locks l ON l.virtualtransaction = x.virtualtransaction AND l.pid IS NULL"
        " JOIN pg_class c ON c.oid = l.relation"
        " WHERE p.database = current_database() AND c.relnamespace = to_regnamespace(%s)",
        (f'"{name}"',),
    ).fetchall()
    for (gid,) in gids:
        with contextlib.suppress(psycopg.Error):
            admin.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    admin.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(_DROP_LOCK_TIMEOUT)))
    try:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    finally:
        with contextlib.suppress(psycopg.Error):
            admin.execute("RESET lock_timeout")


def _exists(admin: psycopg.Connection[TupleRow], kind: str, name: str) -> bool:
    query = (
        "SELECT 1 FROM pg_database WHERE datname = %s"
        if kind == "database"
        else "SELECT 1 FROM pg_namespace WHERE nspname = %s"
    )
    try:
        return admin.execute(query, (name,)).fetchone() is not None
    except psycopg.Error:
        return True  # cannot tell (the connection is gone): the run's own errors say what happened
