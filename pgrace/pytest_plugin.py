"""pytest plugin (entry point ``pytest11``): a real PostgreSQL and a scenario runner.

Fixtures:

* ``pgrace_server`` (session): a :class:`~pgrace.servers.ServerInfo`; the embedded
  PostgreSQL unless ``--pgrace-dsn`` or ``PGRACE_DSN`` names another server.
* ``pgrace_run`` (function): ``pgrace_run(scenario, variant=None, params=None)`` runs a
  scenario (a shipped name, a path, or a :class:`~pgrace.model.Scenario`) on that
  server and returns the :class:`~pgrace.timeline.Run` to assert on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pgrace.model import Scenario
from pgrace.servers import ServerInfo, open_server
from pgrace.timeline import Run

RunScenario = Callable[..., Run]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pgrace")
    group.addoption(
        "--pgrace-dsn",
        default=None,
        help="Run pgrace scenarios on this server instead of the embedded PostgreSQL (or set PGRACE_DSN).",
    )


@pytest.fixture(scope="session")
def pgrace_server(request: pytest.FixtureRequest) -> Iterator[ServerInfo]:
    """One server for the whole test session; embedded unless a DSN is given."""
    dsn = request.config.getoption("--pgrace-dsn") or os.environ.get("PGRACE_DSN") or None
    with open_server(dsn) as server:
        yield server


@pytest.fixture
def pgrace_run(pgrace_server: ServerInfo) -> RunScenario:
    """Run a scenario in a scratch database of ``pgrace_server`` and return its record."""
    from pgrace import api, catalog
    from pgrace.runner import RunOptions

    def run(
        scenario: Scenario | str | Path,
        variant: str | None = None,
        params: dict[str, str] | None = None,
        options: RunOptions | None = None,
        **option_fields: Any,
    ) -> Run:
        loaded = scenario if isinstance(scenario, Scenario) else catalog.load(str(scenario), params)
        if option_fields:
            options = RunOptions(**option_fields)
        return api.run(loaded.variant_named(variant), server=pgrace_server, options=options)

    return run
