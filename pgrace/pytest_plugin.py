"""pytest plugin (entry point ``pytest11``): a real PostgreSQL and a scenario runner.

Fixtures:

* ``pgrace_server`` (session): a :class:`~pgrace.servers.ServerInfo`; the embedded
  PostgreSQL unless ``--pgrace-dsn`` or ``PGRACE_DSN`` names another server.
* ``pgrace_run`` (function): ``pgrace_run(scenario, variant=None, params=None)`` runs a
  scenario (a shipped name, a path, or a :class:`~pgrace.model.scenario.Scenario`) on that
  server and returns the :class:`~pgrace.model.timeline.Run` to assert on.
* ``pgrace_code`` (function): the application's own functions interleaved on that server
  (:mod:`pgrace.drivers.code`): ``pgrace_code.run(sessions, ...)``, ``pgrace_code.explore(sessions, ...)``,
  and ``pgrace_code.assert_every(found, predicate)``, which fails the test with the text
  timeline of the simplest interleaving whose outcome does not satisfy ``predicate``. Their
  options are the functions' (``framework_modules=``: more modules a step's note passes over).

pytest loads this module in every session of every project that installs pgrace, whether
a test uses pgrace or not: it imports nothing of pgrace's until a fixture is asked for
(tests/test_import_cost.py holds it to that).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pgrace.engine.options import RunOptions
    from pgrace.model.exploration import Exploration
    from pgrace.model.outcomes import OutcomeClass
    from pgrace.model.scenario import Scenario
    from pgrace.model.timeline import Run
    from pgrace.servers import ServerInfo

RunScenario = Callable[..., "Run"]
"""What ``pgrace_run`` gives a test: a function that runs a scenario and returns its record."""


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
    from pgrace.servers import open_server

    dsn = request.config.getoption("--pgrace-dsn") or os.environ.get("PGRACE_DSN") or None
    with open_server(dsn) as server:
        yield server


@pytest.fixture
def pgrace_run(pgrace_server: ServerInfo) -> RunScenario:
    """Run a scenario in a scratch database of ``pgrace_server`` and return its record."""
    from pgrace import api
    from pgrace.engine.options import RunOptions
    from pgrace.frontends import catalog
    from pgrace.model.scenario import Scenario

    def run(
        scenario: Scenario | str | Path,
        variant: str | None = None,
        params: dict[str, str] | None = None,
        options: RunOptions | None = None,
        **option_fields: Any,
    ) -> Run:
        file_scenario = scenario if isinstance(scenario, Scenario) else catalog.read_scenario(str(scenario), params)
        if option_fields:
            options = RunOptions(**option_fields)
        return api.run(file_scenario.variant_named(variant), server=pgrace_server, options=options)

    return run


class PgraceCode:
    """What the ``pgrace_code`` fixture gives a test: run_code and explore_code on the test session's server."""

    def __init__(self, server: ServerInfo) -> None:
        self.server = server

    def run(self, sessions: dict[str, Callable[[Any], object]], **options: Any) -> Run:
        from pgrace.drivers.code import run_code

        return run_code(sessions, server=self.server, **options)

    def explore(self, sessions: dict[str, Callable[[Any], object]], **options: Any) -> Exploration:
        """:func:`~pgrace.drivers.code.explore_code` (reduced; ``reduce=False`` runs every schedule)."""
        from pgrace.drivers.code import explore_code

        return explore_code(sessions, server=self.server, **options)

    def assert_every(self, found: Exploration, predicate: Callable[[OutcomeClass], bool], what: str = "") -> None:
        """Fail the test with the timeline of the simplest interleaving of the first class failing ``predicate``."""
        failing = [c for c in found.classes if not predicate(c)]
        if not failing:
            return
        from pgrace.render.text import render_text

        first = failing[0]
        said = f" ({what})" if what else ""
        shown = ", ".join(session for session, _ in first.statements)
        pytest.fail(
            f"{sum(c.count for c in failing)} of {found.run_count} runs fail{said}: {first.summary}\n"
            f"the simplest one ({shown}):\n\n{render_text(found.replay(first))}",
            pytrace=False,
        )


@pytest.fixture
def pgrace_code(pgrace_server: ServerInfo) -> PgraceCode:
    """Interleave the application's functions, statement by statement, on ``pgrace_server``."""
    return PgraceCode(pgrace_server)
