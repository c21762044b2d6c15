"""pgrace's observer is no superuser: scenario code it is led to call runs with the scenario's own rights.

The run's role owns its database, so it can rename schemas: a scenario swapped ``public`` (where
pgrowlocks lives) with a schema holding its own ``pgrowlocks(text)`` between the observer's
lookup of the extension's schema and its call, and the observer, then the superuser, ran the
scenario's COPY TO PROGRAM (found by an attack: 3 runs of 3, 11 to 22 times each). The observer
now logs in as a role of its own, a member of the run's role: it sees what the run does, the
scenario cannot signal it, and whatever it is tricked into calling can do nothing the scenario
could not do itself.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgrace import api
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.scratch import scratch_database
from pgrace.servers import ServerInfo

SWAP = Path(__file__).resolve().parent / "hostile" / "observer-swap.toml"


def test_the_observer_logs_in_as_no_superuser_and_a_member_of_the_runs_role(pgrace_server: ServerInfo) -> None:
    if not pgrace_server.scenario_role:
        pytest.skip("a --dsn server runs as the DSN's own role: there is no run role")
    with scratch_database(pgrace_server, "watcher") as db:
        assert db.observer_dsn is not None and db.role is not None
        with psycopg.connect(db.observer_dsn) as observer:
            row = observer.execute(
                "SELECT rolsuper, pg_has_role(current_user, %s, 'USAGE') FROM pg_roles WHERE rolname = current_user",
                (db.role,),
            ).fetchone()
            assert row == (False, True)
        with (
            psycopg.connect(db.dsn, autocommit=True) as scenario,
            psycopg.connect(db.observer_dsn) as observer,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            scenario.execute("SELECT pg_terminate_backend(%s)", (observer.info.backend_pid,))


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder the server's account could write to, were it to run a program (pytest's own is root's alone)."""
    where = Path(tempfile.mkdtemp(prefix="pgrace-swap-"))
    where.chmod(0o777)
    yield where
    shutil.rmtree(where, ignore_errors=True)


def test_a_schema_swapped_under_the_observer_runs_nothing_as_the_superuser(
    pgrace_server: ServerInfo, open_folder: Path
) -> None:
    if not pgrace_server.scenario_role:
        pytest.skip("a --dsn server runs as the DSN's own role: there is no run role")
    marker = open_folder / "pwned"
    text = SWAP.read_text().replace("MARKER_PATH", str(marker))
    run = api.run(parse_toml_scenario(text, "observer-swap.toml"), server=pgrace_server)
    assert run.step_runs()[-1].step.startswith("a-")
    assert not marker.exists(), marker.read_text()
