"""The role a run's SQL runs as, and its observer's: no superuser, made and dropped with the run."""

from __future__ import annotations

import contextlib
import secrets

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from pgrace.errors import ServerUnavailable
from pgrace.scratch.databases import _connect
from pgrace.scratch.names import _WATCHER_SUFFIX
from pgrace.servers import ServerInfo, remember_secrets, scrub_secrets

#: Superuser settings a run's role may set: they change only how its own session behaves.
#: deadlock_timeout picks a deadlock's victim (scenarios and isolation specs set it per session).
ROLE_PARAMETERS = ("deadlock_timeout",)


#: A role that may log in and nothing else: the run's and its observer's.
_CREATE_LOGIN_ROLE = sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS")


def login_of(server: ServerInfo, role: str) -> dict[str, str]:
    """How ``role`` logs in, as conninfo parameters: its name, and a password made now where it needs one."""
    if not server.role_password:
        return {"user": role}
    password = secrets.token_urlsafe(24)
    remember_secrets(f"password={password}")
    return {"user": role, "password": password}


def _set_password(admin: psycopg.Connection[TupleRow], login: dict[str, str]) -> None:
    """Give the role its password as a SCRAM verifier made here: the password itself never reaches the server's log."""
    if "password" not in login:
        return
    verifier = admin.pgconn.encrypt_password(login["password"].encode(), login["user"].encode(), b"scram-sha-256")
    admin.execute(
        sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(login["user"]), sql.Literal(verifier.decode()))
    )


def _create_role(
    admin: psycopg.Connection[TupleRow], server: ServerInfo, role: str, login: dict[str, str] | None = None
) -> str:
    """The run's own role, with no privilege beyond logging in (the database it will own says the rest).

    On a server pgrace started it has no password: it logs in as pgrace's superuser does, over
    the server's unix socket in a run directory only the server's account can enter, with trust
    authentication. Over TCP (``server.role_password``) it logs in with ``login``'s password,
    made for this run. It may set the few superuser settings that only affect its own session
    (:data:`ROLE_PARAMETERS`).
    """
    try:
        admin.execute(_CREATE_LOGIN_ROLE.format(sql.Identifier(role)))
        _set_password(admin, login or {})
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
    return f"{role}{_WATCHER_SUFFIX}"


def _create_watcher(
    admin: psycopg.Connection[TupleRow], server: ServerInfo, role: str, login: dict[str, str] | None = None
) -> str:
    """pgrace's observer's own role: logs in, holds no privilege but the run's role's (a member of it).

    Not the superuser: the observer calls pgrowlocks and reads the scenario's tables by name,
    in a database whose owner is the scenario, which could swap a schema or a table for its
    own code between the lookup and the call; that code then runs with the scenario's own
    rights. Not the run's role itself either: the scenario cannot signal this one.
    """
    watcher = watcher_of(role)
    try:
        admin.execute(_CREATE_LOGIN_ROLE.format(sql.Identifier(watcher)))
        _set_password(admin, login or {})
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
