"""Test-suite wide rules: the markers that say what a test needs, and where the fixtures live.

Markers (``--strict-markers``: a misspelt one is an error):

* ``server``: needs a PostgreSQL. Set here on every test that uses a server fixture; a module
  that starts servers another way (the CLI, a child process) says so in its ``pytestmark``.
* ``corpus``: reads PostgreSQL's isolation corpus; skips without it, fails under ``PGRACE_REQUIRE_CORPUS``.
* ``browser``, ``docker``, ``slow``: needs Chromium, a Docker engine, or takes seconds.

``make test-fast`` runs what needs none of them, with ``PGRACE_NO_SERVER`` set: there pgrace
refuses to start a server, so a test that needs one but is not marked fails loudly.
"""

from __future__ import annotations

import os

import corpus
import pytest

from pgrace.servers import DSN_ENV_VAR, NO_SERVER_ENV_VAR

pytest_plugins = ["fix_servers", "fix_recorded"]

#: Fixtures that give a test a server (pgrace's plugin, fix_servers, and a module's own `server`); a test using one, even
#: through another fixture, needs PostgreSQL.
SERVER_FIXTURES = frozenset({"pgrace_server", "pgrace_run", "pgrace_code", "each_server", "server"})


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(NO_SERVER_ENV_VAR):  # nor a server of the developer's: a mis-marked test must fail
        os.environ.pop(DSN_ENV_VAR, None)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.server)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("corpus") is None or corpus.present():
        return
    if corpus.REQUIRED:
        pytest.fail(f"PGRACE_REQUIRE_CORPUS is set but the isolation corpus is not at {corpus.CORPUS}")
    pytest.skip(f"isolation corpus not found at {corpus.CORPUS}")
