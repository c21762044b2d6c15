"""How ``make test`` shares the suite out: worker processes for most tests, then the solo tests alone.

A module-scoped fixture (a PostgreSQL 15 server, a built wheel) is made once per worker that
runs one of its tests, so its tests go to one worker together; and the two pytest commands of
``make test`` between them run every test, so nothing is left out by the split.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from conftest import uses_a_shared_fixture

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def made_once_per_module() -> str:
    return "expensive"


def test_a_test_of_a_module_scoped_fixture_goes_to_its_modules_worker(
    request: pytest.FixtureRequest, made_once_per_module: str
) -> None:
    assert uses_a_shared_fixture(request.node)
    if request.config.pluginmanager.hasplugin("xdist"):
        group = request.node.get_closest_marker("xdist_group")
        assert group is not None and group.args == ("tests/test_suite_workers.py",)


def test_a_test_of_function_and_session_fixtures_goes_to_any_worker(
    request: pytest.FixtureRequest, tmp_path: Path, recorded: object
) -> None:
    assert not uses_a_shared_fixture(request.node)
    assert request.node.get_closest_marker("xdist_group") is None


def make_test_commands() -> list[list[str]]:
    """The pytest command lines of the Makefile's ``test`` recipe."""
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe is not None
    return [shlex.split(line) for line in recipe.group(1).splitlines() if "pytest" in line]


def test_make_test_runs_every_test_the_workers_first_then_the_solo_ones_alone() -> None:
    parallel, alone = make_test_commands()
    assert parallel[parallel.index("-n") + 1] == "$(JOBS)" and "loadgroup" in parallel
    assert parallel[parallel.index("-m") + 1] == "not solo"
    assert alone[alone.index("-m") + 1] == "solo" and "no:xdist" in alone  # one process
    assert all(not arg.startswith(("-k", "--deselect", "--ignore")) for arg in parallel + alone)


def test_the_tests_that_bound_an_exit_within_2_s_run_alone() -> None:
    """A signal must end a run within 2 s: measured while other workers load the machine, that flakes."""
    for module in ("test_hangs.py", "test_parallel_signals.py"):
        assert "pytest.mark.solo" in (ROOT / "tests" / module).read_text(), module
