"""Does the written scenario reproduce the incident? Run it, and when its order does not, explore its steps.

The incident's signature is in the scenario's expectations: the victim's 40P01 in a
cycle of the same sessions, and each wait for the same holders on the same table. A run
in which every one held reproduced it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from pgrace.drivers.fromlog.writer import OTHERS_TIMEOUT, VICTIM_TIMEOUT, write_scenario
from pgrace.drivers.searches import Sample
from pgrace.model.fromlog import Incident, Verified, Written

if TYPE_CHECKING:
    from pgrace.model.timeline import Run
    from pgrace.servers import ServerInfo

__all__ = ["verification_server", "verify"]

#: Interleavings tried at most when the file's order does not reproduce (a seeded sample beyond).
EXPLORE_LIMIT = 200
#: Seconds verification takes at most, all its runs together: a logged statement that sleeps
#: (pg_sleep(300)) would otherwise wait out the step timeout in each of 200 interleavings.
VERIFY_SECONDS = 60.0


class _OutOfTime(Exception):
    """Verification's budget ran out between two interleavings."""


#: Roles whose members may run programs or read and write files as the server's account.
_SERVER_POWERS = ("pg_execute_server_program", "pg_read_server_files", "pg_write_server_files")

_WHO = """
SELECT current_user::text, rolsuper,
       ARRAY(SELECT r FROM unnest(%s::text[]) r WHERE to_regrole(r) IS NOT NULL AND pg_has_role(r, 'MEMBER'))
FROM pg_roles WHERE rolname = current_user
"""


def verification_server(server: ServerInfo, dsn: str | None) -> ServerInfo:
    """``server`` as the log's statements may run on it: never as a superuser, never on the incident's server.

    A log is hostile text: what it recorded a client sending (a ``COPY … TO PROGRAM`` that
    failed for that client) must not run with more rights than the client had. On a server
    the user names whose role is a superuser, the statements run as a role made for each
    run, as on pgrace's own servers; a role that may run programs or touch the server's
    files without being one is refused, as is the server of ``dsn`` itself (exit 2).
    """
    import dataclasses

    import psycopg

    from pgrace.drivers.fromlog.database import server_identity
    from pgrace.errors import OptionError, ServerUnavailable
    from pgrace.servers import scrub_secrets

    try:
        with psycopg.connect(server.dsn, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(_WHO, [list(_SERVER_POWERS)]).fetchone()
            here = conn.execute(
                "SELECT CASE WHEN has_function_privilege('pg_control_system()', 'EXECUTE')"
                " THEN (SELECT system_identifier FROM pg_control_system())::text END,"
                " pg_postmaster_start_time()::text"
            ).fetchone()
    except psycopg.Error as exc:
        detail = " ".join(scrub_secrets(str(exc), server.dsn).split())
        raise ServerUnavailable(f"cannot connect to {server.label} to verify there: {detail}") from None
    if dsn is not None and here is not None and server_identity(dsn) == (str(here[0]), str(here[1])):
        raise OptionError(
            "it is the server of the incident's database: the log's statements never run there; "
            "verify on pgrace's own server (the default) or another one",
            "server_target",
        )
    if row is None or server.scenario_role:
        return server
    user, superuser, powers = row
    if superuser:
        return dataclasses.replace(server, scenario_role=True, role_password=True)
    if powers:
        raise OptionError(
            f"the role {user} may run programs or use the server's files ({', '.join(powers)}): "
            "the log's statements would run with those rights; name a role without them, or verify on pgrace's own",
            "server_target",
        )
    return server


def _run(written: Written, source: str, server: ServerInfo, step_timeout: float) -> Run:
    from pgrace.drivers.one_run import run_in_scratch
    from pgrace.engine.options import RunOptions
    from pgrace.errors import ScenarioFailed
    from pgrace.frontends.scenario_toml import parse_toml_scenario
    from pgrace.model.timeline import Run

    scenario = parse_toml_scenario(written.text, source)
    try:
        return run_in_scratch(scenario, server, RunOptions(step_timeout=step_timeout))
    except ScenarioFailed as failed:
        if not isinstance(failed.run, Run):
            raise
        failed.run.checks = failed.run.checks or []
        return failed.run


def verify(
    incident: Incident, written: Written, source: str, server: ServerInfo, dsn: str | None, step_timeout: float = 10.0
) -> tuple[Verified, Written]:
    """Run ``written`` on ``server`` (a scratch database); explore its steps when the file's order fails.

    All of it within :data:`VERIFY_SECONDS` (checked between runs): out of time is not reproduced, and says so.
    """
    deadline = time.monotonic() + VERIFY_SECONDS
    run = _run(written, source, server, step_timeout)
    failures = [f"{c.description}: expected {c.expected}, got {c.actual}" for c in run.checks if not c.ok]
    if (setup := run.failed_setup()) is not None and setup.outcome.error is not None:
        failures.insert(0, f"the setup failed: {setup.outcome.error.sqlstate} {setup.outcome.error.message}")
    if run.ok:
        return Verified(True, run=run), written
    if incident.kind != "deadlock":
        return Verified(False, failures, run=run), written
    from pgrace.drivers.explore import explore
    from pgrace.drivers.exploring import prepared
    from pgrace.frontends.scenario_toml import parse_toml_scenario

    # Which orders deadlock does not depend on who is chosen: every session checks soon, so
    # no interleaving waits out the others' long pins.
    quick = written.text.replace(
        f"SET deadlock_timeout = '{OTHERS_TIMEOUT}'", f"SET deadlock_timeout = '{VICTIM_TIMEOUT}'"
    )
    scenario = prepared(parse_toml_scenario(quick, source))
    explored = 0

    def in_time(done: int, total: int) -> None:
        nonlocal explored
        explored = done
        if time.monotonic() > deadline:
            raise _OutOfTime

    try:
        found = explore(
            scenario, server, search=Sample(EXPLORE_LIMIT, 0), on_progress=in_time, step_timeout=step_timeout
        )
    except _OutOfTime:
        return Verified(False, failures, explored=explored, run=run, out_of_time=VERIFY_SECONDS), written
    for cls in found.classes:  # simplest first: the fewest session switches
        if "40P01" not in cls.errors:
            continue
        if time.monotonic() > deadline:
            return Verified(False, failures, explored=found.explored, run=run, out_of_time=VERIFY_SECONDS), written
        other = write_scenario(incident, dsn, order=list(cls.example))
        again = _run(other, source, server, step_timeout)
        if again.ok:
            return Verified(True, explored=found.explored, order=list(cls.example), run=again), other
    return Verified(False, failures, explored=found.explored, run=run), written
