"""From a server log to a reproducer: find the incidents, write one as a scenario, run it.

:func:`from_log` is what ``pgrace from-log`` does: read the logs (stderr with its
``log_line_prefix``, csvlog, jsonlog), find every deadlock and every lock wait longer than
``deadlock_timeout``, write the chosen one as a pgrace scenario, and (unless told not to)
run that scenario in a scratch database to see the incident come back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pgrace.drivers.fromlog.incidents import Incident, find_incidents, reread
from pgrace.drivers.fromlog.records import open_log
from pgrace.errors import ScenarioError

if TYPE_CHECKING:
    from pgrace.drivers.fromlog.verify import Verified
    from pgrace.drivers.fromlog.writer import Written
    from pgrace.servers import ServerInfo

__all__ = ["FromLog", "from_log"]


@dataclass
class FromLog:
    """What the logs held, the scenario written for the chosen incident, and whether it reproduced."""

    incidents: list[Incident]
    lines: int
    skipped: int = 0
    unreadable: list[str] = field(default_factory=list)
    chosen: int | None = None
    written: Written | None = None
    verified: Verified | None = None


def from_log(
    paths: list[str],
    *,
    prefix: str | None = None,
    dsn: str | None = None,
    incident: int | None = None,
    list_only: bool = False,
    verify: bool = True,
    server: ServerInfo | None = None,
    server_target: str | None = None,
) -> FromLog:
    """Read ``paths``; write (and verify) incident number ``incident`` (1-based; default the first).

    ``dsn`` names the incident's database, used read-only for the tables' DDL and rows.
    The scenario runs on ``server``, or one opened from ``server_target``: pgrace's own
    embedded PostgreSQL unless one is named (``PGRACE_DSN`` is not a choice: a log's
    statements run only where the user says), never on the incident's server, and never as
    a superuser (see :func:`~pgrace.drivers.fromlog.verify.verification_server`). A log with
    no incident, or one pgrace cannot read, is invalid input (:class:`ScenarioError`, exit 2).
    """
    formats = [open_log(path, prefix) for path in paths]
    found = find_incidents(paths, formats, light=True)
    result = FromLog(found.incidents, found.lines, found.skipped, found.unreadable)
    if not found.incidents:
        if found.unreadable:
            where, line, message = _located(found.unreadable[0])
            raise ScenarioError(message, where, line)
        where = paths[0] if len(paths) == 1 else f"{len(paths)} files"
        raise ScenarioError(
            f"no incident: no deadlock and no lock wait longer than deadlock_timeout in {found.lines:,} lines "
            "(lock waits are only logged with log_lock_waits = on)",
            where,
        )
    if list_only:
        return result
    number = incident or 1
    if not 1 <= number <= len(found.incidents):
        raise ScenarioError(f"--incident {number}: the logs hold {len(found.incidents)} incident(s) (see --list)")
    from pgrace.drivers.fromlog.writer import write_scenario

    chosen = reread(found.incidents[number - 1], formats[paths.index(found.incidents[number - 1].file)])
    found.incidents[number - 1] = chosen
    result.chosen = number
    result.written = write_scenario(chosen, dsn)
    _check_parses(result.written, chosen)
    if verify:
        from pgrace.drivers.fromlog.verify import verification_server
        from pgrace.drivers.fromlog.verify import verify as run_verify

        source = f"<from-log {chosen.file}:{chosen.line}>"
        if server is not None:
            safe = verification_server(server, dsn)
            result.verified, result.written = run_verify(chosen, result.written, source, safe, dsn)
        else:
            from pgrace.servers import open_server

            with open_server(server_target or "embedded") as opened:
                safe = verification_server(opened, dsn)
                result.verified, result.written = run_verify(chosen, result.written, source, safe, dsn)
    return result


def _located(said: str) -> tuple[str, int | None, str]:
    """``FILE:LINE: message`` taken apart (a file name may hold ':' too)."""
    m = re.match(r"(.*?):(\d+): (.*)\Z", said, re.S)
    return (m.group(1), int(m.group(2)), m.group(3)) if m else ("", None, said)


def _check_parses(written: Written, incident: Incident) -> None:
    """The file written must read back as a scenario; if the log's text broke it, say so, exit 2, write nothing."""
    from pgrace.formats.scenario_toml import parse_toml_scenario

    try:
        parse_toml_scenario(written.text, "<written>")
    except ScenarioError as exc:
        raise ScenarioError(
            f"the scenario written for this incident does not read back ({exc}): a bug in pgrace, please report it",
            incident.file,
            incident.line,
        ) from None
