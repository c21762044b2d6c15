"""The Docker backend against a real engine: a run, a start that fails or is interrupted, no engine.

Tests marked ``docker`` skip without an engine, and fail instead where
``PGRACE_REQUIRE_DOCKER=1`` (CI, through ``tools/docker_ci.py``, which also builds the
``postgres:15`` and ``postgres:17`` images they start). A container pgrace starts carries
the label ``org.pgrace.container``; after each test none is left, running or stopped.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgrace import api
from pgrace.errors import ServerUnavailable
from pgrace.frontends import catalog
from pgrace.servers import open_server

needs_docker = pytest.mark.docker
#: Each test counts the engine's containers, which another worker's would change: make test runs them alone.
pytestmark = pytest.mark.alone
IMAGE = os.environ.get("PGRACE_DOCKER_IMAGE", "postgres:17")
#: An image whose PostgreSQL never comes up: testcontainers waits on it until told to stop.
NEVER_READY = "pgrace-test/never-ready:1"
#: Recent testcontainers mark every container they make (4.0 did not); pgrace's carry a label of their own.
TESTCONTAINERS_LABEL = "org.testcontainers"
PGRACE_LABEL = "org.pgrace.container"
ROOT = Path(__file__).resolve().parents[1]
CI_GUIDE = ROOT / "docs" / "guide" / "ci.md"


def containers(*labels: str) -> set[str]:
    """`docker ps -a` for labels (both of ours when none is named): the containers there, running or not."""
    import docker  # type: ignore[import-untyped,unused-ignore]  # the Docker SDK ships no types

    client = docker.from_env()
    try:
        return {
            c.id
            for label in labels or (TESTCONTAINERS_LABEL, PGRACE_LABEL)
            for c in client.containers.list(all=True, filters={"label": label})
        }
    finally:
        client.close()


@pytest.fixture
def no_container_left() -> Iterator[None]:
    assert containers() == set(), "a container was there before the test"
    yield
    assert containers() == set(), "the test left a container behind"


@pytest.fixture(scope="module")
def never_ready() -> Iterator[str]:
    """``IMAGE`` with its server replaced by a sleep: a start that waits for PostgreSQL forever."""
    import docker  # type: ignore[import-untyped,unused-ignore]  # the Docker SDK ships no types

    client = docker.from_env()
    try:
        recipe = f'FROM {IMAGE}\nCMD ["sleep", "infinity"]\n'.encode()
        client.images.build(fileobj=io.BytesIO(recipe), tag=NEVER_READY, rm=True)
        yield NEVER_READY
        client.images.remove(NEVER_READY)
    finally:
        client.close()


def pgrace(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pgrace", *args],
        env={**os.environ, "TESTCONTAINERS_RYUK_DISABLED": "true", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,  # the documentation's commands name scenarios/ from the checkout
    )


@needs_docker
def test_a_scenario_runs_on_a_docker_server(no_container_left: None) -> None:
    with open_server(f"docker:{IMAGE}") as server:
        assert server.label.startswith(f"docker:{IMAGE} PostgreSQL ")
        assert containers(PGRACE_LABEL) != set()
        assert api.run(catalog.read_scenario("nowait"), server=server).ok


#: A scenario whose one session says who it runs as, and tries what only a superuser may.
WHO_AM_I = """
name = "who-am-i"
title = "Who the scenario's SQL runs as"

[[sessions]]
name = "s"

[[step]]
session = "s"
sql = "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
expect = { rows = [[false]] }

[[step]]
session = "s"
sql = "COPY (SELECT 1) TO PROGRAM 'true'"
expect = { error = "42501" }
"""


@needs_docker
def test_the_server_is_the_run_s_alone(no_container_left: None) -> None:
    """Published on the loopback only, a superuser password made for the run, scenarios as no superuser."""
    import docker  # type: ignore[import-untyped,unused-ignore]  # the Docker SDK ships no types
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from pgrace.frontends.scenario_toml import parse_toml_scenario

    with open_server(f"docker:{IMAGE}") as server:
        client = docker.from_env()
        try:
            (container,) = client.containers.list(filters={"label": PGRACE_LABEL})
            published = container.attrs["NetworkSettings"]["Ports"]["5432/tcp"]
        finally:
            client.close()
        assert published and {p["HostIp"] for p in published} == {"127.0.0.1"}, published
        params = conninfo_to_dict(server.dsn)
        assert params["host"] == "127.0.0.1" and len(str(params["password"])) >= 20
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(host="127.0.0.1", port=params["port"], user="test", password="test", dbname="test").close()
        run = api.run(parse_toml_scenario(WHO_AM_I, "who-am-i.toml"), server=server)
        assert run.ok, [(c.description, c.actual) for c in run.checks if not c.ok]


@needs_docker
def test_the_cli_runs_lost_update_on_postgresql_17(no_container_left: None) -> None:
    run = pgrace("run", "lost-update", "--server", "docker:postgres:17")
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    assert "server: docker:postgres:17 PostgreSQL 17." in out + err


@needs_docker
def test_a_start_that_times_out_leaves_no_container(never_ready: str, no_container_left: None) -> None:
    # testcontainers gives up on a container that is not ready after TC_MAX_TRIES polls.
    run = pgrace("run", "nowait", "--server", f"docker:{never_ready}", env={"TC_MAX_TRIES": "2"})
    _out, err = run.communicate(timeout=120)
    assert run.returncode == 3, err
    assert err.startswith(f"pgrace: cannot start docker:{never_ready}: "), err
    assert len(err.splitlines()) == 1, err


@needs_docker
@pytest.mark.parametrize(
    ("signum", "code", "word"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_a_signal_while_a_container_starts_leaves_no_container(
    never_ready: str, no_container_left: None, signum: signal.Signals, code: int, word: str
) -> None:
    run = pgrace("run", "nowait", "--server", f"docker:{never_ready}")
    deadline = time.monotonic() + 60
    while not containers() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # waiting for the engine to have made the container: then the start is under way
    assert run.poll() is None, run.communicate()
    run.send_signal(signum)
    _out, err = run.communicate(timeout=60)
    assert run.returncode == code, err
    assert f"{word}; cleaned up" in err


def test_docker_without_an_engine_is_a_clear_server_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with (
        pytest.raises(ServerUnavailable, match=r"^cannot start docker:postgres:17: no Docker engine is reachable"),
        open_server("docker:postgres:17"),
    ):
        pass


def test_an_engine_that_does_not_answer_is_a_clear_server_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:9")  # the discard port: nothing listens there
    with (
        pytest.raises(ServerUnavailable, match=r"^cannot start docker:postgres:17: no Docker engine is reachable"),
        open_server("docker:postgres:17"),
    ):
        pass


# A blank line after the marker: it is not one of test_readme's, which are run without Docker.
LAST_LINE = re.compile(
    r"<!-- docker output, last line: pgrace (?P<args>[^\n]+) -->\n\n```text\n(?P<line>[^\n]*)\n```\n"
)


@needs_docker
def test_the_library_reads_the_same_on_postgresql_18_15_and_17(no_container_left: None) -> None:
    """The CI guide's version matrix through Docker: all checks pass, each timeline is its variant's golden file."""
    shown = LAST_LINE.search(CI_GUIDE.read_text(encoding="utf-8"))
    assert shown is not None, "the CI guide should show the Docker version matrix"
    assert (
        "--golden" in shown["args"] and "docker:postgres:15" in shown["args"] and "docker:postgres:17" in shown["args"]
    )
    run = pgrace(*shlex.split(shown["args"]))
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, out + err
    assert "≠ differs" not in out
    assert out.rstrip("\n").splitlines()[-1] == shown["line"]
