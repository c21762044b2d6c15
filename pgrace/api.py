"""The library entry points: everything the CLI does, a Python caller can do."""

from __future__ import annotations

from pgrace.checks import evaluate
from pgrace.model import Scenario
from pgrace.runner import RunOptions, run_scenario
from pgrace.scratch import scratch_database
from pgrace.servers import ServerInfo, open_server
from pgrace.timeline import Run


def run(
    scenario: Scenario,
    *,
    dsn: str | None = None,
    server: ServerInfo | None = None,
    options: RunOptions | None = None,
    allow_scratch_schema: bool = False,
    database_name: str | None = None,
) -> Run:
    """Run one scenario variant in a scratch database and evaluate its expectations.

    Give ``server`` to reuse a server across runs; otherwise one is opened from ``dsn``
    (or ``PGRACE_DSN``, or the embedded PostgreSQL) and closed afterwards. Without the
    CREATEDB privilege, ``allow_scratch_schema`` runs in a throwaway schema instead.
    ``database_name`` names the scratch database exactly (it must not exist yet).
    """
    if server is None:
        with open_server(dsn) as opened:
            return run(
                scenario,
                server=opened,
                options=options,
                allow_scratch_schema=allow_scratch_schema,
                database_name=database_name,
            )
    with scratch_database(
        server, scenario.name, allow_schema=allow_scratch_schema, scenario=scenario, database_name=database_name
    ) as db:
        result = run_scenario(
            scenario,
            db.dsn,
            server_version=server.version,
            server_label=server.label,
            row_locks_available=db.has_pgrowlocks,
            options=options,
            schema=db.schema,
            observer_dsn=db.observer_dsn,
        )
    result.checks = evaluate(result)
    return result
