"""Where a run's SQL may go: a uniquely named scratch database, or a scratch schema.

Scenarios create and mutate tables freely; giving each run its own database (dropped
afterwards, even on Ctrl-C) keeps runs independent and lets pgrace use a shared server
without touching anybody's data. Without CREATEDB, ``allow_schema`` runs in a throwaway
schema of the DSN's database instead, beside the user's tables. This module is the one
place that decides where SQL runs:

* every connection of a run is opened by :func:`connect`, which lands it in the scratch
  schema (its ``search_path``, merged with whatever options the caller needs) and checks
  that it did before any scenario SQL is sent;
* in schema mode, SQL that cannot be confined to the schema is refused before anything
  is created (:func:`pgrace.confinement.confine_scenario`).

Liveness is the server's to tell. A scratch object's name carries pgrace's prefix and a
tag derived from the rest of the name, and a run holds a session-level advisory lock
whose key is derived from that name, taken *before* the object is created and held until
it is dropped. So from its first instant an object is recognisable as pgrace's, and it
is abandoned exactly when nobody holds its lock: :func:`sweep_leftovers` removes only
what it can take the lock for, whoever and wherever (host, PID namespace) created it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import TupleRow

from pgrace.errors import RunAborted, ServerUnavailable
from pgrace.model import Scenario
from pgrace.servers import ServerInfo, deferred_interrupts, scrub_secrets

__all__ = [
    "ReusableScratch",
    "ScratchDatabase",
    "Sweep",
    "connect",
    "lock_key",
    "reusable_scratch_database",
    "scratch_database",
    "scratch_name",
    "sweep_leftovers",
]

_PREFIX = "pgrace_"
_MAX_NAME_BYTES = 63  # NAMEDATALEN - 1: longer names would be silently truncated
_RANDOM_HEX = 8
_TAG_HEX = 4
_NAME = re.compile(rf"{_PREFIX}[a-z0-9_]*_[0-9a-f]{{{_RANDOM_HEX + _TAG_HEX}}}")
_LOCK_CLASS = 0x70677263  # "pgrc": the first key of every scratch lock, apart from the keys apps use
_END_SESSIONS_DEADLINE_S = 5.0
_DROP_LOCK_TIMEOUT = "5s"  # a drop waits this long for locks, then leaves the object to a later sweep

#: Superuser settings a run's role may set: they change only how its own session behaves.
#: deadlock_timeout picks a deadlock's victim (scenarios and isolation specs set it per session).
ROLE_PARAMETERS = ("deadlock_timeout",)

# Backends opened by :func:`connect` per scratch schema: (pid, backend_start), so that the
# run's end terminates its own lingering sessions and never another run's.
_BACKENDS: dict[str, list[tuple[int, int]]] = {}


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


@dataclass
class Sweep:
    """What a sweep did: the leftovers it removed, and one-line notes on those it had to leave."""

    removed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def scratch_name(hint: str) -> str:
    """``pgrace_<sanitised hint>_<random hex><tag>``, at most 63 bytes, safe unquoted.

    The tag is derived from the rest of the name, so a name is recognisable as one pgrace
    made (a user's ``pgrace_something`` is not) without anything stored beside it.
    """
    cleaned = re.sub(r"[^a-z0-9_]+", "_", hint.lower()).strip("_")
    room = _MAX_NAME_BYTES - len(_PREFIX) - 1 - _RANDOM_HEX - _TAG_HEX
    cleaned = cleaned[:room].rstrip("_") or "run"
    stem = f"{_PREFIX}{cleaned}_{secrets.token_hex(_RANDOM_HEX // 2)}"
    return stem + _tag(stem)


def _tag(stem: str) -> str:
    return hashlib.sha256(f"pgrace scratch {stem}".encode()).hexdigest()[:_TAG_HEX]


def is_scratch_name(name: str) -> bool:
    """Whether pgrace made this name (see :func:`scratch_name`)."""
    return _NAME.fullmatch(name) is not None and _tag(name[:-_TAG_HEX]) == name[-_TAG_HEX:]


def lock_key(name: str) -> tuple[int, int]:
    """The two int4 keys of the advisory lock that says a scratch object's run is alive."""
    return _LOCK_CLASS, int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


# -- connections of a run ----------------------------------------------------------------


def connect(
    dsn: str,
    schema: str | None,
    *,
    options: str = "",
    observer: bool = False,
    autocommit: bool = True,
    connection_class: Any = psycopg.Connection,
    **kwargs: Any,
) -> Any:
    """Open one connection of a run (control, session or observer), autocommit unless told.

    ``connection_class``: the application's code gets pgrace's traced connection, which
    opens no transaction of its own (``autocommit`` False), as psycopg's default.

    ``options`` (e.g. the settings isolation specs expect) are added to the DSN's own
    rather than replacing them; in schema mode the scratch ``search_path`` comes last, so
    it wins, and is verified with ``current_schema()`` before the caller sends anything.
    The observer also searches the schema where pgrowlocks is installed, after the scratch one.
    """
    own = str(conninfo_to_dict(dsn).get("options") or "")
    merged = " ".join(part for part in (own, options, f"-c search_path={schema}" if schema else "") if part)
    if merged:
        kwargs["options"] = merged
    conn = connection_class.connect(dsn, autocommit=autocommit, **kwargs)
    if schema is None:
        return conn
    try:
        if observer:
            row = conn.execute(
                "SELECT n.nspname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                " WHERE p.proname = 'pgrowlocks' ORDER BY n.nspname = 'public' DESC LIMIT 1"
            ).fetchone()
            if row is not None:
                conn.execute(sql.SQL("SET search_path = {}, {}").format(sql.Identifier(schema), sql.Identifier(row[0])))
        found = conn.execute(
            "SELECT current_schema(), pg_backend_pid(),"
            " (SELECT (extract(epoch FROM backend_start) * 1000000)::bigint"
            "  FROM pg_stat_activity WHERE pid = pg_backend_pid())"
        ).fetchone()
        if found is None or found[0] != schema:
            raise RunAborted(
                f"a connection did not land in the scratch schema {schema} (current schema: "
                f"{found[0] if found else None}); nothing was run"
            )
        _BACKENDS.setdefault(schema, []).append((found[1], found[2]))
    except BaseException:
        conn.close()
        raise
    return conn


# -- the scratch space of one run ------------------------------------------------------------


@contextlib.contextmanager
def scratch_database(
    server: ServerInfo,
    hint: str,
    allow_schema: bool = False,
    scenario: Scenario | None = None,
    database_name: str | None = None,
    with_pgrowlocks: bool = True,
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
    """
    admin = _connect(server)
    role: str | None = None
    try:
        name = database_name if database_name is not None else _claim_new_name(admin, server, hint)
        dsn = make_conninfo(server.dsn, dbname=name)
        server_version = admin.info.server_version
        if server.scenario_role:
            role = _create_role(admin, server, name if is_scratch_name(name) else scratch_name(hint))
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
            from pgrace.confinement import confine_scenario

            confine_scenario(scenario)
            with _scratch_schema(admin, server, name) as scratch:
                yield scratch
            return
        try:
            has_pgrowlocks = with_pgrowlocks and _try_pgrowlocks(dsn)
            if role is not None:
                watcher = _create_watcher(admin, server, role)
            yield ScratchDatabase(
                dsn=make_conninfo(dsn, user=role) if role else dsn,
                name=name,
                has_pgrowlocks=has_pgrowlocks,
                role=role,
                observer_dsn=observer_conninfo(make_conninfo(dsn, user=watcher)) if role else None,
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


def observer_conninfo(dsn: str, schema: str | None = None) -> str:
    """``dsn`` with a ``search_path`` that the scenario cannot change: pg_catalog first, then ``schema``, public.

    The scenario's role owns its database, so it can set the database's default search_path
    and create functions and operators in the schemas on it; pgrace's superuser connections
    to that database never take that default.
    """
    path = ["pg_catalog", *([sql.Identifier(schema).as_string(None)] if schema else []), "public"]
    options = str(conninfo_to_dict(dsn).get("options") or "")
    return make_conninfo(dsn, options=f"{options} -c search_path={','.join(path)}".strip())


#: A role that may log in and nothing else: the run's and its observer's.
_CREATE_LOGIN_ROLE = sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS")


def _create_role(admin: psycopg.Connection[TupleRow], server: ServerInfo, role: str) -> str:
    """The run's own role, with no privilege beyond logging in (the database it will own says the rest).

    No password: it logs in as pgrace's superuser does, over the server's unix socket in a
    run directory only the server's account can enter, with trust authentication. It may
    set the few superuser settings that only affect its own session (:data:`ROLE_PARAMETERS`).
    """
    try:
        admin.execute(_CREATE_LOGIN_ROLE.format(sql.Identifier(role)))
    except psycopg.Error as exc:
        raise ServerUnavailable(
            f"cannot create the run's role {role} on {server.label}: {scrub_secrets(str(exc).strip(), server.dsn)}"
        ) from exc
    if admin.info.server_version < 150000:  # GRANT SET ON PARAMETER is new in PostgreSQL 15
        return role
    for attempt in range(3):
        try:
            admin.execute(_parameters_grant("GRANT SET ON PARAMETER {} TO {}", role))
            return role
        except psycopg.errors.UniqueViolation:
            # The first grant on a parameter makes its pg_parameter_acl row: two runs starting at
            # once (explore -j's workers) both try to, and one loses. The row exists now.
            if attempt == 2:
                _drop_role(admin, server, role, grants=False)
                raise ServerUnavailable(f"cannot grant the run's role {role} its settings on {server.label}") from None
        except psycopg.Error as exc:
            _drop_role(admin, server, role, grants=False)
            raise ServerUnavailable(
                f"cannot create the run's role {role} on {server.label}: {scrub_secrets(str(exc).strip(), server.dsn)}"
            ) from exc
    return role


def watcher_of(role: str) -> str:
    """The observer's role of a run's role."""
    return f"{role}_watch"


def _create_watcher(admin: psycopg.Connection[TupleRow], server: ServerInfo, role: str) -> str:
    """pgrace's observer's own role: logs in, holds no privilege but the run's role's (a member of it).

    Not the superuser: the observer calls pgrowlocks and reads the scenario's tables by name,
    in a database whose owner is the scenario, which could swap a schema or a table for its
    own code between the lookup and the call; that code then runs with the scenario's own
    rights. Not the run's role itself either: the scenario cannot signal this one.
    """
    watcher = watcher_of(role)
    try:
        admin.execute(_CREATE_LOGIN_ROLE.format(sql.Identifier(watcher)))
        admin.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(role), sql.Identifier(watcher)))
    except psycopg.Error as exc:
        raise ServerUnavailable(
            f"cannot create the observer's role {watcher} on {server.label}: {scrub_secrets(str(exc).strip())}"
        ) from exc
    return watcher


def _drop_role(
    admin: psycopg.Connection[TupleRow], server: ServerInfo, role: str, grants: bool = True
) -> psycopg.Connection[TupleRow]:
    """Best effort, after its database is gone: a role left on a server pgrace started goes with the server.

    A server that is gone cannot be reached to drop it (nor does it need to be): that must
    not hide why the run ended."""
    with contextlib.suppress(psycopg.Error, ServerUnavailable):
        if admin.closed or admin.broken:
            admin = _connect(server)
        if grants and admin.info.server_version >= 150000:
            admin.execute(_parameters_grant("REVOKE SET ON PARAMETER {} FROM {}", role))
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
    return admin


def _parameters_grant(template: str, role: str) -> sql.Composed:
    return sql.SQL(template).format(
        sql.SQL(", ").join(sql.Identifier(name) for name in ROLE_PARAMETERS), sql.Identifier(role)
    )


def _claim_new_name(admin: psycopg.Connection[TupleRow], server: ServerInfo, hint: str) -> str:
    """A fresh scratch name whose advisory lock this connection now holds (before anything exists)."""
    for _ in range(5):
        name = scratch_name(hint)
        try:
            row = admin.execute("SELECT pg_try_advisory_lock(%s, %s)", lock_key(name)).fetchone()
        except psycopg.Error as exc:
            raise ServerUnavailable(
                f"cannot take pgrace's lock on {server.label}: {scrub_secrets(str(exc).strip(), server.dsn)}"
            ) from exc
        if row == (True,):
            return name
    raise ServerUnavailable(f"cannot take pgrace's lock on {server.label}: every key tried is held")


# What a run may leave behind in its database, counted per catalog: user objects only
# (oid >= FirstNormalObjectId), temporary schemas aside (sessions create them lazily and
# they are harmless), plus prepared transactions and per-database settings.
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
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.database.dsn, autocommit=True)
        conn = self._conn
        deadline = time.monotonic() + _END_SESSIONS_DEADLINE_S
        others = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
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
            with deferred_interrupts():
                admin = _drop(admin, self.server, name, _admin_dsn(self.database), admin.info.server_version)
                _create(admin, self.server, name, owner=self.database.role)
                if self.database.role is not None:
                    admin.execute(sql.SQL("ALTER ROLE {} RESET ALL").format(sql.Identifier(self.database.role)))
        finally:
            admin.close()
        self.resets += 1
        return True


@contextlib.contextmanager
def scratch_database_with_schema(server: ServerInfo, hint: str, schema: str) -> Iterator[ScratchDatabase]:
    """A scratch database whose sessions work in ``schema``, first on their search_path.

    Run after run on one database (explore, code runs): :func:`schema_reset_sql` undoes what
    a run made, without a new database.
    """
    with scratch_database(server, hint) as db:
        try:
            with psycopg.connect(db.dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
                conn.execute(
                    sql.SQL("ALTER DATABASE {} SET search_path = {}, public").format(
                        sql.Identifier(db.name), sql.Identifier(schema)
                    )
                )
        except psycopg.OperationalError as exc:  # the server stopped between CREATE DATABASE and here
            detail = scrub_secrets(str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc), server.dsn)
            raise RunAborted(f"the server went away during the run ({detail})") from exc
        if db.observer_dsn is None:
            yield db
        else:
            yield dataclasses.replace(db, observer_dsn=observer_conninfo(db.observer_dsn, schema))


def schema_reset_sql(schema: str) -> str:
    """The working schema of :func:`scratch_database_with_schema` dropped and made again, empty."""
    return sql.SQL("DROP SCHEMA {0} CASCADE; CREATE SCHEMA {0}").format(sql.Identifier(schema)).as_string(None)


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


class NoCreateDb(ServerUnavailable):
    """The role may not create databases (a scratch schema may be allowed instead)."""


# -- leftovers -----------------------------------------------------------------------------


def sweep_leftovers(server: ServerInfo) -> Sweep:
    """Drop the scratch databases, and the scratch schemas of the DSN's database, that no live run holds.

    An object is pgrace's when its name says so (:func:`is_scratch_name`), and abandoned
    when its advisory lock is free: no session anywhere on the server holds it. Such an
    object is locked by the sweeper while it drops it, so two sweepers never race. One
    owned by a role this one cannot act for is left, with a note saying so.
    """
    sweep = Sweep()
    admin = _connect(server)
    try:
        rows = admin.execute(
            "SELECT 'database', d.datname, pg_get_userbyid(d.datdba), pg_has_role(d.datdba, 'MEMBER')"
            " FROM pg_database d WHERE d.datname LIKE 'pgrace\\_%%'"
            " UNION ALL SELECT 'schema', n.nspname, pg_get_userbyid(n.nspowner), pg_has_role(n.nspowner, 'MEMBER')"
            " FROM pg_namespace n WHERE n.nspname LIKE 'pgrace\\_%%' ORDER BY 1, 2"
        ).fetchall()
        for kind, name, owner, ours in rows:
            if not is_scratch_name(name) or not _take(admin, name):
                continue
            try:
                if not ours:
                    sweep.skipped.append(
                        f"left {name} alone: abandoned by a pgrace run, but owned by role {owner}"
                        f" (run `pgrace clean` as {owner} or a superuser)"
                    )
                    continue
                admin = _drop_leftover(admin, server, kind, name, sweep)
            finally:
                _release(admin, name)
    except psycopg.Error as exc:
        raise ServerUnavailable(
            f"cannot look for leftovers on {server.label}: {scrub_secrets(str(exc).strip(), server.dsn)}"
        ) from exc
    finally:
        admin.close()
    return sweep


def _drop_leftover(
    admin: psycopg.Connection[TupleRow], server: ServerInfo, kind: str, name: str, sweep: Sweep
) -> psycopg.Connection[TupleRow]:
    try:
        if kind == "database":
            dsn = make_conninfo(server.dsn, dbname=name)
            admin = _drop(admin, server, name, dsn, admin.info.server_version)
        else:
            # The dead run's backends may still wait on locks in its schema: nobody else works there.
            admin.execute(
                "SELECT pg_terminate_backend(l.pid) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
                " WHERE c.relnamespace = to_regnamespace(%s) AND l.pid <> pg_backend_pid()",
                (f'"{name}"',),
            )
            _drop_schema(admin, name)
    except (psycopg.Error, RunAborted) as exc:
        detail = scrub_secrets(str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc), server.dsn)
        sweep.skipped.append(f"could not remove {name}: {detail}")
        if admin.closed or admin.broken:
            admin = _connect(server)
        return admin
    sweep.removed.append(name)
    return admin


def _take(admin: psycopg.Connection[TupleRow], name: str) -> bool:
    """Take the object's lock, and make sure no session in another database holds it either."""
    keys = lock_key(name)
    if admin.execute("SELECT pg_try_advisory_lock(%s, %s)", keys).fetchone() != (True,):
        return False
    held = admin.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2"
        " AND classid::bigint = %s AND objid::bigint = %s AND pid <> pg_backend_pid())",
        keys,
    ).fetchone()
    if held != (False,):
        _release(admin, name)
        return False
    return True


def _release(admin: psycopg.Connection[TupleRow], name: str) -> None:
    if not admin.closed:
        with contextlib.suppress(psycopg.Error):
            admin.execute("SELECT pg_advisory_unlock(%s, %s)", lock_key(name))


# -- databases -----------------------------------------------------------------------------


def _connect(server: ServerInfo) -> psycopg.Connection[TupleRow]:
    try:
        return psycopg.connect(server.dsn, autocommit=True)
    except psycopg.Error as exc:
        raise ServerUnavailable(
            f"cannot connect to {server.label}: {scrub_secrets(str(exc).strip(), server.dsn)}"
        ) from exc


def _create(admin: psycopg.Connection[TupleRow], server: ServerInfo, name: str, owner: str | None = None) -> None:
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if owner is not None:
        statement += sql.SQL(" OWNER {}").format(sql.Identifier(owner))
    try:
        if _checkpoints_are_cheap(admin):
            # FILE_COPY copies template1's files after a checkpoint: ~6 ms instead of
            # ~13 ms, and no ~7 MB of WAL per run piling up in the embedded server's
            # tmpfs.  On a durable server those forced checkpoints would flush the
            # whole cluster, so the default (WAL_LOG) is kept there.
            statement += sql.SQL(" STRATEGY FILE_COPY")
        admin.execute(statement)
    except psycopg.errors.DuplicateDatabase as exc:
        raise ServerUnavailable(
            f"database {name} already exists on {server.label}; pgrace creates it fresh for the run and drops it"
            " afterwards, so it will not use an existing one: drop it first"
        ) from exc
    except psycopg.errors.InsufficientPrivilege as exc:
        user = admin.info.user
        raise NoCreateDb(
            f"role {user!r} may not create databases on {server.label}; pgrace needs a "
            f"scratch database per run: grant it CREATEDB (ALTER ROLE {user} CREATEDB)"
        ) from exc
    except psycopg.Error as exc:
        raise ServerUnavailable(
            f"cannot create scratch database {name} on {server.label}: {scrub_secrets(str(exc).strip(), server.dsn)}"
        ) from exc


def _checkpoints_are_cheap(admin: psycopg.Connection[TupleRow]) -> bool:
    """True on a server without fsync (the embedded one) that knows CREATE DATABASE STRATEGY."""
    if admin.info.server_version < 150000:
        return False
    row = admin.execute("SELECT current_setting('fsync')").fetchone()
    return row is not None and row[0] == "off"


def _try_pgrowlocks(dsn: str) -> bool:
    """Best effort: without the extension pgrace only loses its row-lock report."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pgrowlocks")
    except psycopg.Error:
        return False
    return True


def _untemplate(admin: psycopg.Connection[TupleRow], name: str) -> None:
    """A scenario that owns its database may mark it a template, which DROP DATABASE refuses: unmark it first."""
    row = admin.execute("SELECT datistemplate FROM pg_catalog.pg_database WHERE datname = %s", (name,)).fetchone()
    if row is not None and row[0]:
        admin.execute(sql.SQL("ALTER DATABASE {} IS_TEMPLATE false").format(sql.Identifier(name)))


def _drop(
    admin: psycopg.Connection[TupleRow], server: ServerInfo, name: str, dsn: str, server_version: int
) -> psycopg.Connection[TupleRow]:
    """Drop the database, reconnecting once if the admin connection died meanwhile.

    Returns the admin connection in use, so the caller closes the right one.
    """
    statement = sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name))
    if server_version >= 130000:  # FORCE is new in PostgreSQL 13
        statement += sql.SQL(" WITH (FORCE)")
    try:
        _end_sessions(admin, name)
        _untemplate(admin, name)
        admin.execute(statement)
        return admin
    except psycopg.errors.ObjectInUse:
        # FORCE does not end prepared (two-phase) transactions, which a scenario may
        # leave behind: roll them back, then drop again.
        _rollback_prepared(dsn, name)
    except psycopg.OperationalError:
        admin.close()  # the connection died (e.g. server restart): retry on a new one
    except psycopg.Error as exc:
        raise _drop_failed(server, name, exc) from exc
    try:
        if admin.closed:
            admin = psycopg.connect(server.dsn, autocommit=True)
        admin.execute(statement)
    except psycopg.Error as exc:
        raise _drop_failed(server, name, exc) from exc
    return admin


def _end_sessions(admin: psycopg.Connection[TupleRow], name: str) -> None:
    """Terminate the database's sessions and wait, polling, until they are gone.

    Only this run's sessions (or a dead run's) are in its scratch database. DROP DATABASE
    sleeps in steps of 100 ms while any backend is still in the database, including one
    whose client has just disconnected and that is still exiting, which is exactly the
    state a run leaves behind (measured: 7 drops in 15 took 103 ms instead of 4 ms).
    Polling pg_stat_activity every millisecond avoids that; FORCE in the DROP itself
    remains the safety net.
    """
    deadline = time.monotonic() + _END_SESSIONS_DEADLINE_S
    query = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
    try:
        while admin.execute(query, (name,)).fetchall() and time.monotonic() < deadline:
            time.sleep(0.001)
    except psycopg.OperationalError:
        raise
    except psycopg.Error:
        pass  # e.g. not allowed to signal a session: the DROP reports what is wrong


def _rollback_prepared(dsn: str, name: str) -> None:
    """ROLLBACK PREPARED only works from the transaction's own database."""
    with (
        contextlib.suppress(psycopg.Error),
        psycopg.connect(observer_conninfo(dsn), autocommit=True) as conn,
    ):
        rows = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = %s", (name,)).fetchall()
        for (gid,) in rows:
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))


def _drop_failed(server: ServerInfo, name: str, exc: psycopg.Error) -> RunAborted:
    return RunAborted(
        f"could not drop scratch database {name} on {server.label}: {scrub_secrets(str(exc).strip(), server.dsn)}"
    )
