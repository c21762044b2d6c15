"""Explore's partial-order reduction: fewer runs, the same outcome classes as running every interleaving.

The reduction is only worth having if it is sound: every test here that compares compares
the reduced search's classes with the exhaustive search's (``reduce=False``), on shipped
scenarios (every one, both variants) and on ones made to be hard (foreign keys, SKIP LOCKED and NOWAIT, SERIALIZABLE,
sequences, advisory locks, DDL). ``bench/bench_reduce.py`` compares every shipped scenario.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from tiers import tiered

from pgrace.cli import main
from pgrace.drivers.explore import _explore_reduced, explore
from pgrace.drivers.reduce import every_order_differs, nature_of
from pgrace.drivers.searches import Exhaustive
from pgrace.frontends import catalog
from pgrace.model.exploration import Exploration
from pgrace.model.orders.space import Space
from pgrace.model.scenario import Scenario, Step
from pgrace.servers import ServerInfo

HERE = Path(__file__).parent / "explore"

SHIPPED = catalog.shipped_names()  # every one, both variants: the acceptance of the reduction
SHIPPED_VARIANTS = [(name, variant) for name in SHIPPED for variant in catalog.read_scenario(name).variants]
HARD = ["fk-check", "serializable-three", "advisory-and-ddl"]  # the slower ones are in bench/bench_reduce.py
#: Comparisons of many seconds each (hundreds of interleavings, run twice): CI runs them, make test the rest.
LONG = {
    ("skip-locked-fanout", "fix"),
    ("ddl-lock-queue", "bug"),
    ("ddl-lock-queue", "fix"),
    ("slow-work-under-lock", "bug"),
    ("slow-work-under-lock", "fix"),
    ("crashed-worker", "fix"),
    "serializable-three",
    "advisory-and-ddl",
}


def _classes(found: object) -> list[str]:
    return sorted(c.key for c in found.classes)  # type: ignore[attr-defined]


def _searched(scenario: Scenario, server: ServerInfo) -> Exploration:
    """The reduced search itself, even where explore would run every interleaving instead."""
    return _explore_reduced(scenario, server, Space(scenario), 10.0, None)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "variant"), tiered(SHIPPED_VARIANTS, LONG)
)  # a test per variant: the workers share them out
def test_reduced_classes_are_the_exhaustive_classes_on_shipped_scenarios(
    pgrace_server: ServerInfo, name: str, variant: str
) -> None:
    scenario = catalog.read_scenario(name).variant_named(variant)
    reduced = _searched(scenario, pgrace_server)
    every = explore(scenario, pgrace_server, search=Exhaustive())
    assert _classes(reduced) == _classes(every)
    assert reduced.covers_all and reduced.run_count <= every.run_count == every.space
    assert sum(c.count for c in reduced.classes) == reduced.run_count


def test_every_shipped_variant_is_compared() -> None:
    assert {name for name, _ in SHIPPED_VARIANTS} == set(SHIPPED) and len(SHIPPED_VARIANTS) > len(SHIPPED)


@pytest.mark.parametrize("name", tiered([*HARD, "half-cure", "write-and-commit"], LONG))
def test_reduced_classes_are_the_exhaustive_classes_on_hard_scenarios(pgrace_server: ServerInfo, name: str) -> None:
    path = HERE / "hard" / f"{name}.toml" if name in HARD else HERE / f"{name}.toml"
    scenario = catalog.read_scenario(str(path))
    reduced = _searched(scenario, pgrace_server)
    every = explore(scenario, pgrace_server, search=Exhaustive())
    assert _classes(reduced) == _classes(every)
    assert reduced.covers_all
    if every_order_differs(scenario):  # the search runs every interleaving too: explore runs them without it
        assert reduced.run_count == every.space


@pytest.mark.thorough  # 560 runs; test_which_shipped_scenarios_have_every_order_matter holds the decision every day
def test_where_the_text_shows_every_order_to_matter_every_interleaving_is_run(pgrace_server: ServerInfo) -> None:
    """Three SERIALIZABLE transactions past their BEGIN: each pair of steps depends, so no run can stand
    for another; explore runs all 560 without reading footprints, as the search would have run them
    (the search's own runs: test_reduced_classes_are_the_exhaustive_classes_on_hard_scenarios)."""
    scenario = catalog.read_scenario(str(HERE / "hard" / "serializable-three.toml"))
    assert every_order_differs(scenario)
    found = explore(scenario, pgrace_server)
    assert found.covers_all and not found.reduced and found.run_count == found.space == 560


@pytest.mark.parametrize(
    ("name", "differs"),
    [("lost-update", False), ("write-skew", False), ("lock-strengths", True), ("crashed-worker", True)],
)
def test_which_shipped_scenarios_have_every_order_matter(name: str, differs: bool) -> None:
    assert every_order_differs(catalog.read_scenario(name).variant_named("bug")) is differs


@pytest.mark.timing
def test_two_independent_lost_updates_are_covered_completely_in_few_runs(pgrace_server: ServerInfo) -> None:
    """Four sessions of four steps: 63,063,000 interleavings, no sample; each pair's outcome beside the other's."""
    scenario = catalog.read_scenario(str(HERE / "two-lost-updates.toml"))
    started = time.perf_counter()
    found = explore(scenario, pgrace_server)
    assert time.perf_counter() - started < 120
    assert (found.space, found.explored, found.covers_all) == (63_063_000, 63_063_000, True)
    assert found.run_count <= 2_000
    assert {c.final[0][0] for c in found.classes} == {(300, 300), (300, 400), (400, 300), (400, 400)}


def test_three_withdrawals_take_a_tenth_of_the_runs(pgrace_server: ServerInfo) -> None:
    """Three sessions of four steps (34,650 interleavings; bench_reduce compares them with every one)."""
    scenario = catalog.read_scenario(str(HERE / "three-withdrawals.toml"))
    found = explore(scenario, pgrace_server)
    assert found.space == 34_650 and found.covers_all
    assert found.run_count <= 3_465
    assert {c.final[0][0][0] for c in found.classes} == {200, 300, 400}


def test_the_json_says_runs_and_whether_the_space_is_covered(pgrace_server: ServerInfo) -> None:
    result = CliRunner().invoke(main, ["explore", "lost-update", "-f", "json", "--dsn", pgrace_server.dsn])
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert (found["space"], found["explored"], found["complete"]) == (70, 70, True)
    assert found["runs"] < 70 and sum(c["count"] for c in found["classes"]) == found["runs"]
    text = CliRunner().invoke(main, ["explore", "lost-update", "--dsn", pgrace_server.dsn]).output
    assert text.startswith(f"lost-update (bug): all 70 interleavings, {found['runs']} runs: 2 outcome classes")


@pytest.mark.parametrize(
    ("sql", "opaque", "local"),
    [
        ("UPDATE t SET v = 1", False, False),
        ("SELECT * FROM t FOR UPDATE SKIP LOCKED", False, False),
        ("SET lock_timeout = '1s'", False, True),
        ("COMMIT", False, False),
        ("ALTER TABLE t ADD COLUMN c int", True, False),
        ("CREATE OR REPLACE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'", True, False),
        ("SELECT now()", False, False),  # the clock: ordered by tests/test_reduce_clock.py's rule
        ("SELECT random()", True, False),
        ("SELECT * FROM pg_locks", True, False),
        ("SELECT pg_advisory_xact_lock(1)", False, False),
        ("PREPARE TRANSACTION 'x'", True, False),
        ("SELECT xmin FROM t", True, False),
        ("DO $$ BEGIN END $$", True, False),
        ("SELEC oops", True, False),
    ],
)
def test_what_a_steps_text_says_before_it_runs(sql: str, opaque: bool, local: bool) -> None:
    scenario = catalog.read_scenario("lost-update")
    nature = nature_of(Step("s", "alice", sql), scenario)
    assert (nature.opaque, nature.local) == (opaque, local)
