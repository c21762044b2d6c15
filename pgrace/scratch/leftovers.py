"""What killed runs left behind, found by its name and removed when no live run holds its lock."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.rows import TupleRow

from pgrace.errors import RunAborted, ServerUnavailable
from pgrace.scratch.databases import _connect, _drop
from pgrace.scratch.names import is_scratch_name, lock_key
from pgrace.scratch.run import _drop_schema
from pgrace.servers import ServerInfo, scrub_secrets


@dataclass
class Leftovers:
    """What a sweep of leftovers did: the objects it removed, and one-line notes on those it had to leave."""

    removed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def sweep_leftovers(server: ServerInfo) -> Leftovers:
    """Drop the scratch databases, and the scratch schemas of the DSN's database, that no live run holds.

    An object is pgrace's when its name says so (:func:`is_scratch_name`), and abandoned
    when its advisory lock is free: no session anywhere on the server holds it. Such an
    object is locked by the sweeper while it drops it, so two sweepers never race. One
    owned by a role this one cannot act for is left, with a note saying so.
    """
    leftovers = Leftovers()
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
                    leftovers.skipped.append(
                        f"left {name} alone: abandoned by a pgrace run, but owned by role {owner}"
                        f" (run `pgrace clean` as {owner} or a superuser)"
                    )
                    continue
                admin = _drop_leftover(admin, server, kind, name, leftovers)
            finally:
                _release(admin, name)
    except psycopg.Error as exc:
        raise ServerUnavailable(
            f"cannot look for leftovers on {server.label}: {scrub_secrets(str(exc).strip(), server.dsn)}"
        ) from exc
    finally:
        admin.close()
    return leftovers


def _drop_leftover(
    admin: psycopg.Connection[TupleRow], server: ServerInfo, kind: str, name: str, leftovers: Leftovers
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
        leftovers.skipped.append(f"could not remove {name}: {detail}")
        if admin.closed or admin.broken:
            admin = _connect(server)
        return admin
    leftovers.removed.append(name)
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
