"""Other servers: a local PostgreSQL installation, Docker, and how `--server` picks one."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest
from fix_servers import PG15, needs_pg15

from pgrace import api, catalog
from pgrace.errors import ServerUnavailable
from pgrace.servers import open_server
from pgrace.servers.docker import docker_available


@pytest.mark.server
@needs_pg15
def test_every_shipped_scenario_holds_on_a_local_postgresql_15() -> None:
    with open_server(str(PG15)) as server:
        assert server.version.startswith("15.")
        assert server.label.startswith("local PostgreSQL 15.")
        for name in catalog.shipped_names():
            scenario = catalog.load(name)
            for variant in scenario.variants:
                run = api.run(scenario.variant_named(variant), server=server)
                assert run.ok, (name, variant, [c for c in run.checks if not c.ok])
                assert run.row_locks_available  # Debian's package ships pgrowlocks


@pytest.mark.server
@needs_pg15
def test_the_local_server_is_gone_after_the_block() -> None:
    with open_server(str(PG15)) as server:
        run_dir = Path(str(psycopg.conninfo.conninfo_to_dict(server.dsn)["host"]))
        assert (run_dir / "data" / "postmaster.pid").exists()
    assert not run_dir.exists()


def test_a_directory_without_postgres_is_no_server(tmp_path: Path) -> None:
    with pytest.raises(ServerUnavailable, match="no PostgreSQL installation"), open_server(str(tmp_path)):
        pass


@pytest.mark.docker
@pytest.mark.server
def test_docker_backend_runs_a_scenario_when_an_engine_is_reachable() -> None:
    problem = docker_available()
    if problem is not None:
        pytest.skip(f"Docker backend not tested: {problem}")
    with open_server(os.environ.get("PGRACE_DOCKER_IMAGE", "docker:postgres:17")) as server:
        assert api.run(catalog.load("nowait"), server=server).ok


def test_docker_without_an_engine_is_a_clear_server_error() -> None:
    problem = docker_available()
    if problem is None:
        pytest.skip("a Docker engine is reachable here; the no-engine message cannot be shown")
    with (
        pytest.raises(ServerUnavailable, match=r"cannot start docker:postgres:17: "),
        open_server("docker:postgres:17"),
    ):
        pass
