"""Test-suite wide rules: the markers that say what a test needs, and where the fixtures live.

Markers (``--strict-markers``: a misspelt one is an error):

* ``server``: needs a PostgreSQL. Set here on every test that uses a server fixture; a module
  that starts servers another way (the CLI, a child process) says so in its ``pytestmark``.
* ``corpus``: reads PostgreSQL's isolation corpus; skips without it, fails under ``PGRACE_REQUIRE_CORPUS``.
* ``docker``: starts containers on a Docker engine; skips without one, fails under ``PGRACE_REQUIRE_DOCKER``.
* ``browser``, ``slow``: needs Chromium, or takes seconds even without a server.
* ``timing``: asserts a wall-clock bound, which an overloaded machine may miss.
* ``alone``: must not run beside other tests; ``make test`` runs it with the ``timing`` ones, after the workers.
* ``thorough``: repeats at many times the cost what a faster test checks (``tests/tiers.py``); ``make test``
  runs it only under ``PGRACE_THOROUGH=1``, which CI sets.

``make test-fast`` runs what needs none of them, with ``PGRACE_NO_SERVER`` set: there pgrace
refuses to start a server, so a test that needs one but is not marked fails loudly.

``make test`` runs the tests in worker processes (pytest-xdist, ``--dist loadgroup``), then the
``timing`` ones alone, so that no other worker loads the machine while they measure. Each worker
has its session fixtures to itself (its own embedded server); the tests of a module whose
fixtures are module-scoped (a PostgreSQL 15 server, a built wheel) go to one worker together,
so each such fixture is made once, not once per worker.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import corpus
import pytest

from pgrace.servers import DSN_ENV_VAR, NO_SERVER_ENV_VAR

pytest_plugins = ["fix_servers", "fix_recorded"]

#: Fixtures that give a test a server (pgrace's plugin, fix_servers, and a module's own `server`); a test using one, even
#: through another fixture, needs PostgreSQL.
SERVER_FIXTURES = frozenset({"pgrace_server", "pgrace_run", "pgrace_code", "each_server", "server"})

#: CI starts an engine (tools/docker_ci.py) and sets this: there a missing engine fails the Docker tests.
DOCKER_REQUIRED = os.environ.get("PGRACE_REQUIRE_DOCKER", "") not in ("", "0")


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(NO_SERVER_ENV_VAR):  # nor a server of the developer's: a mis-marked test must fail
        os.environ.pop(DSN_ENV_VAR, None)


#: Fixture scopes wider than a test and narrower than the session: made once per worker that runs such a test.
SHARED_SCOPES = frozenset({"package", "module", "class"})


def pytest_itemcollected(item: pytest.Item) -> None:
    """Markers from the fixtures a test uses, as it is collected: before ``-m`` deselects by marker, and before
    xdist's worker reads ``xdist_group`` (in its own ``pytest_collection_modifyitems``) to name the test's group."""
    if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        item.add_marker(pytest.mark.server)
    if item.config.pluginmanager.hasplugin("xdist") and uses_a_shared_fixture(item):
        item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):
        # A worker's collection: tests are handed out in its order (after the groups, largest first).
        # The long ones go first, so none is left running alone at the end: those recorded longest
        # first, then the ``slow`` ones.
        took = recorded_durations()
        items.sort(key=lambda item: (-took.get(plain_id(item), 0.0), item.get_closest_marker("slow") is None))


def plain_id(item: pytest.Item) -> str:
    """The test's id without the ``@group`` xdist's worker appends to a grouped test's."""
    group = item.get_closest_marker("xdist_group")
    return item.nodeid.removesuffix(f"@{group.args[0]}") if group is not None and group.args else item.nodeid


@functools.cache
def recorded_durations() -> dict[str, float]:
    """Seconds the longest tests took, by node id (tests/durations.txt: only their ranking counts)."""
    lines = (Path(__file__).parent / "durations.txt").read_text(encoding="utf-8").splitlines()
    rows = (line.split("\t", 1) for line in lines if line and not line.startswith("#"))
    return {node: float(seconds) for seconds, node in rows}


def uses_a_shared_fixture(item: pytest.Item) -> bool:
    """Whether a fixture of ``item`` lives longer than the test and shorter than the session (e.g. ``each_server``)."""
    info = getattr(item, "_fixtureinfo", None)
    definitions = getattr(info, "name2fixturedefs", {})
    return any(defs and defs[-1].scope in SHARED_SCOPES for defs in definitions.values())


@functools.cache
def docker_problem() -> str | None:
    from pgrace.servers.docker import docker_available

    return docker_available()


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("docker") is not None and (problem := docker_problem()) is not None:
        if DOCKER_REQUIRED:
            pytest.fail(f"PGRACE_REQUIRE_DOCKER is set but {problem}")
        pytest.skip(f"Docker backend not tested: {problem}")
    if item.get_closest_marker("corpus") is None or corpus.present():
        return
    if corpus.REQUIRED:
        pytest.fail(f"PGRACE_REQUIRE_CORPUS is set but the isolation corpus is not at {corpus.CORPUS}")
    pytest.skip(f"isolation corpus not found at {corpus.CORPUS}")
