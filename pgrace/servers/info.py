"""What a server is to everything downstream: a conninfo to an admin database and a safe label."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg


#: The log line prefix of a server pgrace starts: the database lets a run pick out its own lines.
LOG_LINE_PREFIX = "%m [%p] %q%d: "


@dataclass(frozen=True)
class ServerInfo:
    """A reachable server, described once so nobody has to re-derive it."""

    dsn: str
    """libpq conninfo of an admin database on the server; may contain a password."""
    version: str
    """``server_version`` as the server reports it, e.g. ``"18.1"``."""
    label: str
    """Human description without any password, safe for logs and reports."""
    bindir: str | None = None
    """The bin directory of the server's own installation (pgbench lives there), when pgrace started it."""
    fresh: bool = False
    """pgrace started it for this process from its clean template: no killed run can have left anything on it."""
    notes: tuple[str, ...] = ()
    """What pgrace had to mend to start it (a damaged cache entry rebuilt), one line each, for the user."""
    log_path: str | None = None
    """The server's log file (stderr, ``log_line_prefix`` ``LOG_LINE_PREFIX``), when pgrace started it."""
    scenario_role: bool = False
    """Each run's SQL runs as a role pgrace creates for it, without superuser (servers pgrace starts itself).

    False: it runs as the DSN's own role (a user's server, or ``--superuser``).
    """
    role_password: bool = False
    """The run's roles log in with a password made for them: the server is reached over TCP (a Docker
    container, a user's server), where no socket only its account can enter vouches for them."""


def server_version(conn: psycopg.Connection[Any]) -> str:
    """The server's ``server_version``: libpq has it from the start-up, else SHOW asks (an older server)."""
    version = conn.info.parameter_status("server_version")
    if version is None:
        row = conn.execute("SHOW server_version").fetchone()
        version = str(row[0]) if row else "unknown"
    return version
