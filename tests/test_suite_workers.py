"""How ``make test`` shares the suite out: worker processes for most tests, then the timing tests alone.

Under ``PGRACE_THOROUGH=1`` (as CI runs it) both commands take every test; without it, the
``thorough`` tier is left out.

A module-scoped fixture (a PostgreSQL 15 server, a built wheel) is made once per worker that
runs one of its tests, so its tests go to one worker together; the two pytest commands of
``make test`` between them run every test, so nothing is left out by the split; and a test that
bounds a wall-clock time is marked ``timing``, so it does not measure while other workers load
the machine.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
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
    if getattr(request.config.option, "loadgroup", False):  # a worker of --dist loadgroup: the group is in the id
        assert request.node.nodeid.endswith("@tests/test_suite_workers.py"), "xdist did not group the test"


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


def test_make_test_runs_every_test_the_workers_first_then_the_timing_ones_alone() -> None:
    parallel, alone = make_test_commands()
    assert parallel[parallel.index("-n") + 1] == "$(JOBS)" and "loadgroup" in parallel
    assert parallel[parallel.index("-m") + 1] == "not timing and not alone$(TIER)"
    assert alone[alone.index("-m") + 1] == "(timing or alone)$(TIER)" and "no:xdist" in alone  # one process
    assert all(not arg.startswith(("-k", "--deselect", "--ignore")) for arg in parallel + alone)


@pytest.mark.parametrize(
    ("thorough", "tier"),
    [(None, " and not thorough"), ("0", " and not thorough"), ("", " and not thorough"), ("1", "")],
)
def test_the_thorough_tier_is_left_out_unless_asked_for(thorough: str | None, tier: str) -> None:
    """What make would run (``make -n``), with PGRACE_THOROUGH unset, 0, empty or 1."""
    env = {k: v for k, v in os.environ.items() if k != "PGRACE_THOROUGH" and not k.startswith("MAKE")}
    if thorough is not None:
        env["PGRACE_THOROUGH"] = thorough
    planned = subprocess.run(
        ["make", "-n", "--no-print-directory", "test"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    markers = [line.split(" -m ", 1)[1] for line in planned.splitlines() if "pytest" in line and " -m " in line]
    assert markers == [f'"not timing and not alone{tier}"', f'"(timing or alone){tier}"'], planned


#: An assertion that bounds how long something took: `assert took < 5`, `assert time.monotonic() - started < 2`.
BOUNDS_TIME = re.compile(r"\b(took|elapsed|seconds_taken)\b\s*<|(perf_counter|monotonic)\(\)\s*-\s*\w+\s*<")


def marked_timing(decorators: list[ast.expr]) -> bool:
    return any(ast.unparse(d).endswith("mark.timing") for d in decorators)


def test_every_test_that_bounds_a_wall_clock_time_is_marked_timing() -> None:
    unmarked = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        module = ast.parse(path.read_text())
        whole_module = any(
            isinstance(node, ast.Assign)
            and any(isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets)
            and "mark.timing" in ast.unparse(node.value)
            for node in module.body
        )
        for test in module.body:
            if not isinstance(test, ast.FunctionDef) or not test.name.startswith("test_"):
                continue
            bounds = [
                a for a in ast.walk(test) if isinstance(a, ast.Assert) and BOUNDS_TIME.search(ast.unparse(a.test))
            ]
            if bounds and not (whole_module or marked_timing(test.decorator_list)):
                unmarked.append(f"{path.name}:{bounds[0].lineno} {test.name}")
    assert unmarked == [], "these assert a wall-clock bound: mark them @pytest.mark.timing"


def test_the_recorded_longest_tests_are_tests_of_the_suite() -> None:
    """The workers take these first (conftest.recorded_durations): a renamed test would silently go last again."""
    from conftest import recorded_durations

    took = recorded_durations()
    assert len(took) > 50
    for node in took:
        path, name = node.split("::", 1)
        function = name.split("[", 1)[0]
        assert re.search(rf"^def {function}\(", (ROOT / path).read_text(), re.MULTILINE), node
