"""A server the user already runs, named by a DSN: checked once, never started or stopped."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgrace.errors import ScenarioError, ServerUnavailable
from pgrace.servers.info import ServerInfo, server_version
from pgrace.servers.secrets import connstring_problem, describe_dsn, remember_secrets, scrub_secrets

__all__ = ["existing_server"]

#: Seconds to wait for an unreachable host before giving up, unless the DSN says otherwise.
CONNECT_TIMEOUT_S = 5


@contextlib.contextmanager
def existing_server(dsn: str) -> Iterator[ServerInfo]:
    """Check that ``dsn`` is reachable and describe it; the server is left as it was.

    Failing here, with the address in the message, beats failing later in the middle of a
    scenario with a bare libpq error. The DSN itself is never quoted back (it may hold a
    password in any shape); its secrets are remembered so that every later message is
    scrubbed of them.
    """
    remember_secrets(dsn)
    where = describe_dsn(dsn)
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        # libpq's parse errors quote pieces of the string: those are masked.
        problem = scrub_secrets(connstring_problem(exc), dsn)
        # Invalid input (exit 2), not an unavailable server.
        raise ScenarioError(f"invalid PostgreSQL connection string (not shown): {problem}") from None
    if (number := _number_problem(params)) is not None:
        raise ScenarioError(f"invalid PostgreSQL connection string (not shown): {number}")
    if "connect_timeout" not in params:
        # Also in the DSN handed on, so no later connection hangs on a dead host either.
        dsn = make_conninfo(dsn, connect_timeout=str(CONNECT_TIMEOUT_S))
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            version = server_version(conn)
            label = scrub_secrets(_label(conn.info), dsn)
    except psycopg.Error as exc:
        detail = " ".join(scrub_secrets(str(exc), dsn).split())
        raise ServerUnavailable(f"cannot connect to PostgreSQL at {where}: {detail}") from None
    yield ServerInfo(dsn=dsn, version=version, label=label)


_WHOLE_NUMBER_PARAMS = ("connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval",
                        "keepalives_count", "tcp_user_timeout")  # fmt: skip


def _number_problem(params: Mapping[str, object]) -> str | None:
    """A port or a timeout libpq would only refuse when connecting: invalid input, said before trying."""
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            return f"port {port[:20]!r} is not a number from 1 to 65535"
    for name in _WHOLE_NUMBER_PARAMS:
        value = str(params.get(name) or "").strip()
        if value and not (value.lstrip("-").isascii() and value.lstrip("-").isdigit()):
            return f"{name} {value[:20]!r} is not a whole number"
    return None


def _label(info: psycopg.ConnectionInfo) -> str:
    """``postgresql://user@host:port/db`` as actually connected, never with a password."""
    host = info.host
    if host.startswith("/"):  # unix socket directory
        host = quote(host, safe="")
    return f"postgresql://{quote(info.user, safe='')}@{host}:{info.port}/{quote(info.dbname, safe='')}"
