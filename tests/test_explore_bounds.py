"""Bounds of explore, sweep and check --explore: huge spaces are counted and sampled at once,
and options beyond what the machine can do are refused in one line (exit 2), not run out of memory.

What used to hang is run in a child process with a timeout, so a regression fails instead of hanging.
"""

from __future__ import annotations

import math
import random
import re
import subprocess
import sys
import textwrap
import time
from functools import lru_cache
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import steps_scenario

from pgrace import bounds
from pgrace.cli import main
from pgrace.drivers.exploring import choose
from pgrace.errors import ScenarioError
from pgrace.frontends import catalog
from pgrace.model.orders.space import Space
from pgrace.servers import ServerInfo

FANOUT = Path(__file__).resolve().parents[1] / "scenarios" / "skip-locked-fanout.toml"


def pgrace(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`pgrace ARGS` in a child process; a hang fails the test after ``timeout`` seconds."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "pgrace", *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"pgrace {' '.join(args)} still ran after {timeout} s")


def python(code: str, timeout: float = 20) -> str:
    """Run ``code`` in a child interpreter (a pure computation that may hang): its stdout."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"still computing after {timeout} s:\n{code}")
    assert done.returncode == 0, done.stderr
    return done.stdout


class Reference:
    """The numbering as it was defined first: a memoised count over every joint position."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.count = lru_cache(maxsize=None)(self._count)

    def _eligible(self, at: tuple[int, ...]) -> list[int]:
        chains, needs = self.space.chains, self.space.needs
        return [
            i
            for i, chain in enumerate(chains)
            if at[i] < len(chain) and all(at[j] > k for j, k in needs.get(chain[at[i]], ()))
        ]

    def _count(self, at: tuple[int, ...]) -> int:
        if all(at[i] == len(c) for i, c in enumerate(self.space.chains)):
            return 1
        return sum(self.count((*at[:i], at[i] + 1, *at[i + 1 :])) for i in self._eligible(at))


def _orders(chains: list[list[str]]) -> list[tuple[str, ...]]:
    """Every merge of the chains that keeps each one's order (brute force)."""
    if not any(chains):
        return [()]
    return [
        (chain[0], *rest)
        for i, chain in enumerate(chains)
        if chain
        for rest in _orders([*chains[:i], chain[1:], *chains[i + 1 :]])
    ]


# -- counting and numbering (no server) ---------------------------------------------------------


@pytest.mark.timing
def test_24_sessions_of_3_steps_are_counted_and_numbered_at_once() -> None:
    out = python(
        """
        import time
        from pgrace.frontends import catalog
        from pgrace.model.orders.space import Space
        started = time.perf_counter()
        space = Space(catalog.read_scenario("skip-locked-fanout", {"workers": "24"}))
        last = space.size - 1
        assert space.rank(space.unrank(last)) == last and space.rank(space.unrank(12345)) == 12345
        print(space.size, round(time.perf_counter() - started, 3))
        """
    )
    size, seconds = out.split()
    assert int(size) == math.factorial(72) // math.factorial(3) ** 24
    assert float(seconds) < 2


@pytest.mark.parametrize("name", ["lost-update", "skip-locked-fanout"])
def test_the_numbering_is_the_one_every_seed_and_shard_was_drawn_from(name: str) -> None:
    space = Space(catalog.read_scenario(name))
    reference = Reference(space)
    assert space.size == reference.count(tuple(0 for _ in space.chains))
    orders = [space.unrank(i) for i in range(space.size)]
    assert [space.rank(o) for o in orders] == list(range(space.size))
    assert orders == sorted(orders, key=lambda o: [space.where[n][0] for n in o])  # session by session


def test_sessions_tied_by_captures_are_counted_exactly_with_free_sessions_around_them() -> None:
    scenario = steps_scenario(
        [
            ("b1", "b", "SELECT 1 AS x"),
            ("a1", "a", "SELECT :b.w AS x"),
            ("d1", "d", "SELECT 1"),
            ("c1", "c", "SELECT :a.v"),
            ("a2", "a", "SELECT 2"),
            ("d2", "d", "SELECT 2"),
            ("c2", "c", "SELECT 3"),
            ("b2", "b", "SELECT 3"),
        ],
        captures={"a1": "v", "b1": "w"},
    )
    space = Space(scenario)
    reference = Reference(space)
    assert space.size == reference.count(tuple(0 for _ in space.chains))
    orders = [space.unrank(i) for i in range(space.size)]
    assert len(set(orders)) == space.size and [space.rank(o) for o in orders] == list(range(space.size))
    assert all(o.index("b1") < o.index("a1") < o.index("c1") for o in orders)
    brute = [o for o in _orders([list(c) for c in space.chains]) if o.index("b1") < o.index("a1") < o.index("c1")]
    assert sorted(brute) == sorted(orders)


@pytest.mark.timing
def test_sessions_tied_by_captures_in_too_many_joint_positions_are_refused_at_once() -> None:
    """12 sessions of 3 steps, each using the previous one's capture: 4**12 joint positions."""
    out = python(
        """
        import time
        from pgrace.errors import ScenarioError
        from pgrace.model.scenario import PermutationStep, Scenario, Session, Step
        steps = []
        for s in range(12):
            use = f":s{s - 1}.v" if s else "1"
            steps += [Step(f"s{s}a", f"s{s}", f"SELECT {use} AS x", capture=(("v", "x"),)), Step(f"s{s}b", f"s{s}", "SELECT 2"),
                      Step(f"s{s}c", f"s{s}", "SELECT 3")]
        scenario = Scenario(name="t", title="t", source="tied.toml", sessions=tuple(Session(f"s{s}") for s in range(12)),
                            steps=tuple(steps), permutations=(tuple(PermutationStep(s.name) for s in steps),))
        from pgrace.model.orders.space import Space
        started = time.perf_counter()
        try:
            Space(scenario).size
        except ScenarioError as exc:
            print(round(time.perf_counter() - started, 3), exc)
        """
    )
    seconds, message = out.split(" ", 1)
    assert float(seconds) < 2
    assert "tied.toml: " in message and "16,777,216 joint positions" in message and "at most 100,000" in message


# -- sampling (no server) --------------------------------------------------------------------------


def test_a_sample_of_a_space_of_any_size_is_drawn_in_memory_bounded_by_the_sample() -> None:
    huge = math.factorial(72) // math.factorial(3) ** 24
    picked = choose(huge, 5, seed=3)
    assert len(set(picked)) == 5 and picked == sorted(picked) and all(0 <= i < huge for i in picked)
    assert choose(huge, 5, seed=3) == picked != choose(huge, 5, seed=4)


@pytest.mark.parametrize(("size", "limit", "seed"), [(1000, 50, 7), (70, 12, 1), (1680, 1000, 0), (10**15, 300, 9)])
def test_the_same_seed_picks_what_it_always_picked(size: int, limit: int, seed: int) -> None:
    """A sample is what ``random.Random(seed).sample(range(size), limit)`` drew: old shards still merge."""
    assert choose(size, limit, seed) == sorted(random.Random(seed).sample(range(size), limit))


# -- the options' bounds (refused before a server starts) -----------------------------------------


@pytest.mark.timing
@pytest.mark.parametrize(
    "args",
    [
        ["explore", "lost-update", "-j", "100000000"],
        ["sweep", "skip-locked-fanout", "-p", "workers=2,3", "--explore", "-j", "100000000"],
        ["check", "--explore", str(FANOUT), "-j", "100000000"],
    ],
)
def test_more_processes_than_the_machine_can_run_are_refused(args: list[str]) -> None:
    started = time.perf_counter()
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert f"at most {bounds.max_jobs()} processes" in result.stderr and "Traceback" not in result.output
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("limit", ["10000000", "100000000000"])
def test_a_sample_larger_than_the_bound_is_refused(limit: str) -> None:
    for args in (["explore", "lost-update"], ["check", "--explore", str(FANOUT)]):
        result = CliRunner().invoke(main, [*args, "--max", limit])
        assert result.exit_code == 2, result.output
        assert "at most 1,000,000" in result.stderr and "Traceback" not in result.output


@pytest.mark.timing
def test_a_sweep_of_too_many_combinations_is_refused_before_anything_loads() -> None:
    values = ",".join(str(n) for n in range(2, 39))  # 37 values
    started = time.perf_counter()
    result = CliRunner().invoke(main, ["sweep", "skip-locked-fanout", "-p", f"workers={values}", "-p", f"x={values}"])
    assert result.exit_code == 2, result.output
    assert result.stderr == "pgrace: 1,369 combinations are too many for one sweep (at most 1,000); split it\n"
    assert time.perf_counter() - started < 2


def test_the_library_refuses_the_same_bounds() -> None:
    with pytest.raises(ScenarioError, match="too many for one sweep"):
        from pgrace.drivers.sweep import variants

        variants("skip-locked-fanout", {"workers": [str(n) for n in range(2, 39)], "x": ["1"] * 37})


# -- on the server ------------------------------------------------------------------------------------


def test_explore_and_check_explore_of_24_sessions_sample_two_at_once(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    explored = pgrace(["explore", "skip-locked-fanout", "-p", "workers=24", "--max", "2", "--dsn", pgrace_server.dsn])
    assert explored.returncode == 0, explored.stderr
    size = math.factorial(72) // math.factorial(3) ** 24
    assert explored.stdout.startswith(f"skip-locked-fanout (fix): 2 of {size} interleavings (seed 0)")
    many = tmp_path / "fanout-24.toml"
    many.write_text(FANOUT.read_text().replace("workers = 3", "workers = 24"))
    checked = pgrace(["check", "--explore", str(many), "--max", "2", "--dsn", pgrace_server.dsn])
    assert (checked.returncode, checked.stderr) == (0, ""), checked.stderr
    assert checked.stdout.endswith("2 checks: 2 passed, 0 failed\n"), checked.stdout


def test_sweep_explore_of_a_growing_scenario_samples_at_once(pgrace_server: ServerInfo) -> None:
    args = ["sweep", "skip-locked-fanout", "-p", "workers=12,24", "--explore", "--max", "2", "-f", "json"]
    swept = pgrace([*args, "--dsn", pgrace_server.dsn])
    assert swept.returncode == 0, swept.stderr
    assert "Traceback" not in swept.stderr and "internal error" not in swept.stderr


def test_a_long_sweep_says_how_many_combinations_before_it_loads_them() -> None:
    values = ",".join(str(n) for n in range(1, 52))
    result = CliRunner().invoke(main, ["sweep", "skip-locked-fanout", "-p", "workers=3,4", "-p", f"x={values}"])
    assert result.exit_code == 2, result.output
    first, refused = result.stderr.splitlines()
    assert first == "pgrace: 102 combinations to run"  # then the first one that does not load
    assert refused.endswith("unknown param 'x'; this scenario has: workers")


def test_more_workers_than_the_server_has_connections_for_is_one_line_exit_2(pgrace_server: ServerInfo) -> None:
    """24 sessions in each of 8 workers would need 216 connections of the embedded server's 100: each worker
    failed on its own, printing its traceback; now it is refused before any starts, with what would fit."""
    result = CliRunner().invoke(
        main,
        ["explore", "skip-locked-fanout", "-p", "workers=24", "--max", "16", "-j", "8", "--dsn", pgrace_server.dsn],
    )
    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    assert "Invalid value for --jobs: 8: 8 workers need 216 connections (27 each), and the server has room for" in line
    assert re.search(r"run [1-3] or raise max_connections", line), line
    fits = CliRunner().invoke(
        main, ["explore", "skip-locked-fanout", "-p", "workers=24", "--max", "4", "-j", "2", "--dsn", pgrace_server.dsn]
    )
    assert fits.exit_code == 0, fits.output
