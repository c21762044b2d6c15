"""From a server log to a reproducer: find the incidents, write one as a scenario, run it.

:func:`from_log` is what ``pgrace from-log`` does: read the logs (stderr with its
``log_line_prefix``, csvlog, jsonlog), find every deadlock and every lock wait longer than
``deadlock_timeout``, write the chosen one as a pgrace scenario, and (unless told not to)
run that scenario in a scratch database to see the incident come back.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pgrace.drivers.fromlog.incidents import find_incidents, reread
from pgrace.drivers.fromlog.records import open_log
from pgrace.errors import OptionError, ScenarioError
from pgrace.model.fromlog import FromLog, Incident, Written

if TYPE_CHECKING:
    from pgrace.servers import ServerInfo

__all__ = ["from_log"]


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
    step_timeout: float = 10.0,
    minimize: bool = False,
) -> FromLog:
    """Read ``paths``; write (and verify) incident number ``incident`` (1-based; default the first).

    ``dsn`` names the incident's database, used read-only for the tables' DDL and rows.
    The scenario runs on ``server``, or one opened from ``server_target``: pgrace's own
    embedded PostgreSQL unless one is named (``PGRACE_DSN`` is not a choice: a log's
    statements run only where the user says), never on the incident's server, and never as
    a superuser (see :func:`~pgrace.drivers.fromlog.verify.verification_server`). A log with
    no incident, or one pgrace cannot read, is invalid input (:class:`ScenarioError`, exit 2).
    When the check cannot run (its setup fails, no server, too few connections, more
    sessions than pgrace runs at once), the scenario is still written and ``not_checked`` says why.
    ``minimize``: once it reproduced, the incident is shrunk on the same server to the
    smallest scenario that fails the same way (``minimized``, ``minimized_text``): the
    statements of the cycle and the rows they touch, without the transactions' unrelated ones.
    """
    formats = [open_log(path, prefix) for path in paths]
    found = find_incidents(paths, formats)
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
        raise OptionError(f"{number}: the logs hold {len(found.incidents)} incident(s)", "incident")
    from pgrace.drivers.fromlog.writer import write_scenario

    listed = found.incidents[number - 1]
    chosen = reread(listed, formats[paths.index(listed.file)])
    result.chosen, result.incident = number, chosen
    result.written = write_scenario(chosen, dsn)
    _check_parses(result.written, chosen)
    if verify:
        _check(result, chosen, dsn, server, server_target, step_timeout, minimize)
    if minimize and result.minimized is None and result.not_minimized is None:
        result.not_minimized = "the incident did not come back" if verify else "the scenario was not run (--no-verify)"
    return result


#: The most sessions a check runs: each is a connection and a backend, and the run's steps grow with them
#: (a cycle of 30 is checked in about 30 s on two busy cores; of 60, not in 8 minutes). An incident
#: has no more (incidents.MAX_PROCESSES): this holds should that change.
MOST_CHECKED_SESSIONS = 32


def _check(
    result: FromLog,
    chosen: Incident,
    dsn: str | None,
    server: ServerInfo | None,
    server_target: str | None,
    step_timeout: float,
    minimize: bool = False,
) -> None:
    """Run the written scenario (see :func:`~pgrace.drivers.fromlog.verify.verify`); when it cannot run, say why.

    With ``minimize``, a scenario that reproduced is shrunk on the same server, before it closes.
    """
    from pgrace.drivers.fromlog.verify import verification_server
    from pgrace.drivers.fromlog.verify import verify as run_verify
    from pgrace.drivers.load.run import DEFAULT_CONNECTIONS, connections_for
    from pgrace.errors import ScenarioFailed, ServerUnavailable
    from pgrace.servers import open_server, starts_its_own

    assert result.written is not None
    sessions = len(chosen.pids)
    if sessions > MOST_CHECKED_SESSIONS:
        result.not_checked = (
            f"a {chosen.kind} of {sessions:,} processes: pgrace checks at most {MOST_CHECKED_SESSIONS} sessions at "
            f"once; run the scenario on a server with max_connections of {connections_for(sessions)} or more"
        )
        return
    source = f"<from-log {chosen.file}:{chosen.line}>"
    try:
        if server is not None:
            safe = verification_server(server, dsn)
            _room(safe, sessions)
            result.verified, result.written = run_verify(chosen, result.written, source, safe, dsn, step_timeout)
            if minimize:
                _minimize(result, source, safe, step_timeout)
            return
        target = server_target or "embedded"
        needed = connections_for(sessions)
        settings = {"max_connections": str(needed)} if needed > DEFAULT_CONNECTIONS and starts_its_own(target) else None
        with open_server(target, settings=settings) as opened:
            safe = verification_server(opened, dsn)
            _room(safe, sessions)
            result.verified, result.written = run_verify(chosen, result.written, source, safe, dsn, step_timeout)
            if minimize:
                _minimize(result, source, safe, step_timeout)
    except (ScenarioFailed, ServerUnavailable) as exc:
        result.not_checked, result.not_checked_exit = str(exc), exc.exit_code
        result.not_minimized = "the scenario could not be run"


def _minimize(result: FromLog, source: str, server: ServerInfo, step_timeout: float) -> None:
    """Shrink the written scenario, when it reproduced the incident, in the order that did."""
    import tempfile
    from pathlib import Path

    from pgrace.drivers.minimize import minimize
    from pgrace.drivers.minimize.export import verified_toml
    from pgrace.frontends.scenario_toml import parse_toml_scenario

    assert result.written is not None
    if result.verified is None or not result.verified.reproduced:
        return
    scenario = parse_toml_scenario(result.written.text, source)
    order = tuple(p.step for p in scenario.permutations[0])
    try:
        result.minimized = minimize(scenario, server, order, step_timeout=step_timeout)
        text = verified_toml(result.minimized, server, Path(tempfile.gettempdir()), step_timeout)
    except ScenarioError as exc:  # it did not fail again in its order, or the minimized file did not
        result.minimized, result.not_minimized = None, str(exc)
        return
    result.minimized_text = _header(result.written.text) + text


def _header(text: str) -> str:
    """The comment lines a written scenario starts with: where it came from and what the log did not say."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line + "\n")
    return "".join(lines)


def _room(server: ServerInfo, sessions: int) -> None:
    """Too few connections for every session: one line, before a run fails session by session."""
    from pgrace.drivers.explore import CONNECTIONS_PER_WORKER
    from pgrace.errors import ServerUnavailable
    from pgrace.scratch import connection_room

    room = connection_room(server)
    if room.free < sessions + CONNECTIONS_PER_WORKER:
        raise ServerUnavailable(
            f"the check needs {sessions + CONNECTIONS_PER_WORKER} connections ({sessions} sessions and pgrace's "
            f"own {CONNECTIONS_PER_WORKER}), and {server.label} has room for {max(0, room.free)} ({room})"
        )


def _located(said: str) -> tuple[str, int | None, str]:
    """``FILE:LINE: message`` taken apart (a file name may hold ':' too)."""
    m = re.match(r"(.*?):(\d+): (.*)\Z", said, re.S)
    return (m.group(1), int(m.group(2)), m.group(3)) if m else ("", None, said)


def _check_parses(written: Written, incident: Incident) -> None:
    """The file written must read back as a scenario; if the log's text broke it, say so, exit 2, write nothing."""
    from pgrace.frontends.limits import MAX_FILE_BYTES
    from pgrace.frontends.scenario_toml import parse_toml_scenario

    size = len(written.text.encode())
    if size > MAX_FILE_BYTES:
        raise ScenarioError(
            f"a {incident.kind} of {len(incident.pids):,} processes: its scenario would be {size / 2**20:.1f} MiB, "
            f"over the {MAX_FILE_BYTES // 2**20} MiB pgrace reads in a scenario file; nothing is written",
            incident.file,
            incident.line,
        )
    try:
        parse_toml_scenario(written.text, "<written>")
    except ScenarioError as exc:
        raise ScenarioError(
            f"the scenario written for this incident does not read back ({exc}): a bug in pgrace, please report it",
            incident.file,
            incident.line,
        ) from None
