"""Fixtures about servers: the versions a test runs on, and the secrets pgrace remembers of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pgrace.servers import ServerInfo, open_server

PG15 = Path("/usr/lib/postgresql/15/bin")
"""Debian's PostgreSQL 15, the second version the suite runs on where it is installed."""

needs_pg15 = pytest.mark.skipif(not (PG15 / "postgres").exists(), reason=f"no PostgreSQL 15 at {PG15}")


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
