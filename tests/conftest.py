"""Test-suite wide rules: a test that needs the isolation corpus or a Docker engine skips without it, or fails in CI."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import corpus
import pytest

from pgrace.servers import ServerInfo, open_server

PG15 = Path("/usr/lib/postgresql/15/bin")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs_corpus: reads PostgreSQL's isolation corpus from ../shared")
    config.addinivalue_line("markers", "needs_docker: starts containers on a Docker engine (tools/docker_ci.py)")


#: CI starts an engine (tools/docker_ci.py) and sets this: there a missing engine fails the Docker tests.
DOCKER_REQUIRED = os.environ.get("PGRACE_REQUIRE_DOCKER", "") not in ("", "0")


@functools.cache
def docker_problem() -> str | None:
    from pgrace.servers.docker import docker_available

    return docker_available()


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("needs_docker") is not None and (problem := docker_problem()) is not None:
        if DOCKER_REQUIRED:
            pytest.fail(f"PGRACE_REQUIRE_DOCKER is set but {problem}")
        pytest.skip(f"Docker backend not tested: {problem}")
    if item.get_closest_marker("needs_corpus") is None or corpus.present():
        return
    if corpus.REQUIRED:
        pytest.fail(f"PGRACE_REQUIRE_CORPUS is set but the isolation corpus is not at {corpus.CORPUS}")
    pytest.skip(f"isolation corpus not found at {corpus.CORPUS}")


@pytest.fixture(autouse=True)
def forget_remembered_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no remembered DSN secret.

    `pgrace` remembers the secrets of every DSN it is given for the life of its process; tests
    invoke the CLI in-process, so a fuzzed `--dsn "x=name"` would otherwise scrub the word
    `name` from every later test's output.
    """
    monkeypatch.setattr("pgrace.servers.secrets._REMEMBERED", set())


@pytest.fixture(scope="module", params=["embedded", "postgresql-15"])
def each_server(request: pytest.FixtureRequest, pgrace_server: ServerInfo) -> Iterator[ServerInfo]:
    """The embedded PostgreSQL 18, then Debian's PostgreSQL 15 when it is installed."""
    if request.param == "embedded":
        yield pgrace_server
        return
    if not (PG15 / "postgres").exists():
        pytest.skip(f"no PostgreSQL 15 at {PG15}")
    with open_server(str(PG15)) as local:
        yield local
