"""A uniquely named database per run, so scenarios never see each other's tables.

Scenarios create and mutate tables freely; giving each run its own database (dropped
afterwards, even on Ctrl-C) keeps runs independent and lets pgrace use a shared
server without touching anybody's data.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import TupleRow

from pgrace.errors import RunAborted, ServerUnavailable
from pgrace.servers import ServerInfo, deferred_interrupts, scrub_secrets

__all__ = ["ScratchDatabase", "scratch_database", "sweep_leftovers"]

_PREFIX = "pgrace_"
_MAX_NAME_BYTES = 63  # NAMEDATALEN - 1: longer names would be silently truncated
_RANDOM_HEX = 10
_END_SESSIONS_DEADLINE_S = 5.0


@dataclass(frozen=True)
class ScratchDatabase:
    """A throwaway database for one run."""

    dsn: str
    """conninfo of the scratch database (the server's DSN with dbname replaced)."""
    name: str
    has_pgrowlocks: bool
    """Whether the pgrowlocks extension could be created; lock reports need it."""
    schema: str | None = None
    """Set when the run uses a scratch *schema* in the user's database instead."""


def scratch_name(hint: str) -> str:
    """``pgrace_<sanitised hint>_<random hex>``, at most 63 bytes, safe unquoted."""
    cleaned = re.sub(r"[^a-z0-9_]+", "_", hint.lower()).strip("_")
    room = _MAX_NAME_BYTES - len(_PREFIX) - 1 - _RANDOM_HEX
    cleaned = cleaned[:room].rstrip("_") or "run"
    return f"{_PREFIX}{cleaned}_{secrets.token_hex(_RANDOM_HEX // 2)}"


@contextlib.contextmanager
def scratch_database(server: ServerInfo, hint: str, allow_schema: bool = False) -> Iterator[ScratchDatabase]:
    """Create a fresh database, yield it, and always drop it (terminating its connections).

    Without the CREATEDB privilege this fails, unless ``allow_schema``: then a uniquely
    named schema in the connection's own database is used and dropped instead.
    """
    name = scratch_name(hint)
    dsn = make_conninfo(server.dsn, dbname=name)
    admin = _connect(server)
    server_version = admin.info.server_version
    try:
        try:
            _create(admin, server, name)
        except NoCreateDb:
            if not allow_schema:
                raise
            admin.close()
            with scratch_schema(server, name) as scratch:
                yield scratch
            return
        except KeyboardInterrupt:
            # Interrupted around the CREATE: the database may exist by now.
            with deferred_interrupts(), contextlib.suppress(RunAborted):
                admin = _drop(admin, server, name, dsn, server_version)
            raise
        try:
            has_pgrowlocks = _try_pgrowlocks(dsn)
            yield ScratchDatabase(dsn=dsn, name=name, has_pgrowlocks=has_pgrowlocks)
        except BaseException:
            # The run's own error is the one to report; a failed drop must not mask it.
            with deferred_interrupts(), contextlib.suppress(RunAborted):
                admin = _drop(admin, server, name, dsn, server_version)
            raise
        with deferred_interrupts():
            admin = _drop(admin, server, name, dsn, server_version)
    finally:
        admin.close()


@contextlib.contextmanager
def scratch_schema(server: ServerInfo, name: str) -> Iterator[ScratchDatabase]:
    """A uniquely named schema in the server DSN's database, first on every session's search_path.

    Only the schema is created and dropped (CASCADE); pgrowlocks is used only when it is
    already installed, since installing it would change the user's database.
    """
    admin = _connect(server)
    try:
        try:
            admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
            admin.execute(sql.SQL("COMMENT ON SCHEMA {} IS {}").format(sql.Identifier(name), sql.Literal(_marker())))
        except psycopg.Error as exc:
            raise ServerUnavailable(
                f"cannot create scratch schema {name} on {server.label}: {scrub_secrets(str(exc).strip(), server.dsn)}"
            ) from exc
        row = admin.execute("SELECT to_regproc('pgrowlocks') IS NOT NULL").fetchone()
        options = psycopg.conninfo.conninfo_to_dict(server.dsn).get("options") or ""
        dsn = make_conninfo(server.dsn, options=f"{options} -c search_path={name}".strip())
        try:
            yield ScratchDatabase(dsn=dsn, name=name, has_pgrowlocks=bool(row and row[0]), schema=name)
        finally:
            with deferred_interrupts():
                if admin.closed:
                    admin = _connect(server)
                _end_sessions_in_schema(admin, name)
                admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    finally:
        admin.close()


def _end_sessions_in_schema(admin: psycopg.Connection[TupleRow], name: str) -> None:
    """Sessions of a run are named ``pgrace/...``; end ours so DROP SCHEMA is not blocked by their locks."""
    with contextlib.suppress(psycopg.Error):
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE pid <> pg_backend_pid() AND datname = current_database()"
            " AND (application_name LIKE 'pgrace/%%' OR application_name LIKE 'isolation/%%')"
            " AND backend_start >= (SELECT min(backend_start) FROM pg_stat_activity WHERE pid = pg_backend_pid())"
        )


class NoCreateDb(ServerUnavailable):
    """The role may not create databases (a scratch schema may be allowed instead)."""


def _marker() -> str:
    """Who created a scratch object, so that a later run can tell a dead run's leftovers."""
    return f"pgrace scratch: host={socket.gethostname()} pid={os.getpid()}"


def sweep_leftovers(server: ServerInfo) -> list[str]:
    """Drop scratch databases and schemas that killed pgrace runs on this host left behind.

    Only objects whose marker names this host and a process that no longer exists, and
    that nobody is connected to, are dropped. Returns their names, so the caller can say so.
    """
    host = socket.gethostname()
    removed: list[str] = []
    admin = _connect(server)
    try:
        rows = admin.execute(
            "SELECT d.datname, shobj_description(d.oid, 'pg_database') FROM pg_database d"
            " WHERE d.datname LIKE 'pgrace\\_%%'"
            " AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datname = d.datname)"
        ).fetchall()
        for name, comment in rows:
            if _left_by_dead_process(comment, host):
                admin = _drop(admin, server, name, make_conninfo(server.dsn, dbname=name), admin.info.server_version)
                removed.append(name)
        schemas = admin.execute(
            "SELECT nspname, obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname LIKE 'pgrace\\_%%'"
        ).fetchall()
        for name, comment in schemas:
            if _left_by_dead_process(comment, host):
                admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
                removed.append(name)
    except psycopg.Error as exc:
        raise ServerUnavailable(
            f"cannot look for leftovers on {server.label}: {scrub_secrets(str(exc).strip(), server.dsn)}"
        ) from exc
    finally:
        admin.close()
    return removed


def _left_by_dead_process(comment: str | None, host: str) -> bool:
    match = re.fullmatch(r"pgrace scratch: host=(\S+) pid=(\d+)", comment or "")
    if match is None or match.group(1) != host:
        return False
    try:
        os.kill(int(match.group(2)), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _connect(server: ServerInfo) -> psycopg.Connection[TupleRow]:
    try:
        return psycopg.connect(server.dsn, autocommit=True)
    except psycopg.Error as exc:
        raise ServerUnavailable(
            f"cannot connect to {server.label}: {scrub_secrets(str(exc).strip(), server.dsn)}"
        ) from exc


def _create(admin: psycopg.Connection[TupleRow], server: ServerInfo, name: str) -> None:
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    try:
        if _checkpoints_are_cheap(admin):
            # FILE_COPY copies template1's files after a checkpoint: ~6 ms instead of
            # ~13 ms, and no ~7 MB of WAL per run piling up in the embedded server's
            # tmpfs.  On a durable server those forced checkpoints would flush the
            # whole cluster, so the default (WAL_LOG) is kept there.
            statement += sql.SQL(" STRATEGY FILE_COPY")
        admin.execute(statement)
        admin.execute(sql.SQL("COMMENT ON DATABASE {} IS {}").format(sql.Identifier(name), sql.Literal(_marker())))
    except psycopg.errors.InsufficientPrivilege as exc:
        user = admin.info.user
        raise NoCreateDb(
            f"role {user!r} may not create databases on {server.label}; pgrace needs a "
            f"scratch database per run: grant it CREATEDB (ALTER ROLE {user} CREATEDB), "
            "or pass --allow-scratch-schema to use a throwaway schema in its database instead"
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

    DROP DATABASE sleeps in steps of 100 ms while any backend is still in the database,
    including one whose client has just disconnected and that is still exiting, which
    is exactly the state a run leaves behind (measured: 7 drops in 15 took 103 ms
    instead of 4 ms).  Polling pg_stat_activity every millisecond avoids that; FORCE in
    the DROP itself remains the safety net.
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
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        rows = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = %s", (name,)).fetchall()
        for (gid,) in rows:
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))


def _drop_failed(server: ServerInfo, name: str, exc: psycopg.Error) -> RunAborted:
    return RunAborted(
        f"could not drop scratch database {name} on {server.label}: {scrub_secrets(str(exc).strip(), server.dsn)}"
    )
