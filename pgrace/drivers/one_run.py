"""One scenario variant run in a scratch database of a server, its expectations evaluated.

The unit every driver repeats (``run``, ``check``, a sweep's combinations, explore's
replays); it lives below them all, so a driver never imports the library layer above it.
"""

from __future__ import annotations

from pgrace.engine.options import RunOptions
from pgrace.model.checks import evaluate
from pgrace.model.scenario import Scenario
from pgrace.model.timeline import Run, SetupRan
from pgrace.scratch import ScratchDatabase, scratch_database
from pgrace.servers import ServerInfo
from pgrace.text import visible


def run_in_scratch(
    scenario: Scenario,
    server: ServerInfo,
    options: RunOptions | None = None,
    allow_scratch_schema: bool = False,
    database_name: str | None = None,
) -> Run:
    """Run ``scenario`` on ``server`` in a scratch database (a scratch schema with ``allow_scratch_schema``).

    ``database_name`` names the scratch database exactly (it must not exist yet).
    """
    with scratch_database(
        server, scenario.name, allow_schema=allow_scratch_schema, scenario=scenario, database_name=database_name
    ) as db:
        result = run_in(scenario, server, db, options)
    result.checks = evaluate(result)
    return result


def run_in(scenario: Scenario, server: ServerInfo, db: ScratchDatabase, options: RunOptions | None = None) -> Run:
    """Run ``scenario`` in ``db``, a scratch database (or schema) of ``server``; its expectations are not evaluated."""
    # Imported here, not with this module: the CLI imports it in a thread while the database is made.
    from pgrace.engine.libpq.runner import run_scenario

    return run_scenario(
        scenario,
        db.dsn,
        server_version=server.version,
        server_label=server.label,
        row_locks_available=db.has_pgrowlocks,
        options=options,
        schema=db.schema,
        observer_dsn=db.observer_dsn,
    )


def teardown_failures(result: Run) -> list[str]:
    """Teardown errors (a teardown cancelled at the step timeout, say): isolationtester reports them, not fatal."""
    notes = []
    for event in result.events:
        if isinstance(event, SetupRan) and event.phase == "teardown" and event.outcome.error is not None:
            error = event.outcome.error
            where = f"teardown of session {event.session}" if event.session else "teardown"
            detail = f" ({error.detail})" if error.detail else ""
            notes.append(visible(f"{where} failed: {error.severity}:  {error.message}{detail}"))
    return notes
