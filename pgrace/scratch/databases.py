"""Creating and dropping scratch databases, ending their sessions first and rolling back their prepared transactions."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from pgrace.errors import RunAborted, ServerUnavailable
from pgrace.scratch.connections import observer_conninfo
from pgrace.scratch.names import _END_SESSIONS_DEADLINE_S, lock_key, scratch_name
from pgrace.servers import ServerInfo, scrub_secrets


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


class NoCreateDb(ServerUnavailable):
    """The role may not create databases (a scratch schema may be allowed instead)."""


@contextlib.contextmanager
def aborted_if_lost(server: ServerInfo) -> Iterator[None]:
    """pgrace's own SQL around a run: its connection lost meanwhile (the server stopped) ends the run, exit 3."""
    try:
        yield
    except psycopg.OperationalError as exc:
        said = str(exc).strip()
        detail = scrub_secrets(said.splitlines()[0] if said else type(exc).__name__, server.dsn)
        raise RunAborted.server_gone(detail) from exc


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


def _try_pgrowlocks(dsn: str, closed: list[int]) -> bool:
    """Best effort: without the extension pgrace only loses its row-lock report.

    ``closed`` gets the backend of the connection it used (see :func:`_until_gone`)."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            closed.append(conn.info.backend_pid)
            return _install_pgrowlocks(conn)
    except psycopg.Error:
        return False


def _install_pgrowlocks(conn: psycopg.Connection[TupleRow]) -> bool:
    """As :func:`_try_pgrowlocks`, on a superuser's connection to the database."""
    try:
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


def _until_gone(admin: psycopg.Connection[TupleRow], pids: list[int]) -> None:
    """Wait, polling, until the server shows these backends of pgrace's closed connections gone.

    A backend exits after its client has closed: under load it stays in pg_stat_activity a while,
    under no application_name, and a run's check for connections pgrace did not open would take
    it for a stranger. Bounded: a backend still there after the deadline is the run's to report.
    """
    deadline = time.monotonic() + _END_SESSIONS_DEADLINE_S
    query = "SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE pid = ANY(%s)"
    while pids and (row := admin.execute(query, (pids,)).fetchone()) and row[0] and time.monotonic() < deadline:
        time.sleep(0.001)


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
