"""The reduced search split: ``--shard K/N`` and ``-j N`` run DPOR rooted at prefixes of the space.

A shard takes every N-th of the shortest prefixes of the interleavings there are at least N
of, and searches what follows each; the shards together cover every interleaving, so their
merge must say so and find the very classes one search finds (and every interleaving run
one by one finds). Class counts are runs, and shards run some equivalent interleavings
twice: only the class keys are compared.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pgrace.cli import main
from pgrace.drivers.explore import explore, reduces
from pgrace.drivers.reduce import explore_roots
from pgrace.drivers.searches import Exhaustive
from pgrace.drivers.shards import merge_explorations
from pgrace.frontends import catalog
from pgrace.model.exploration import Exploration
from pgrace.model.orders.space import Space
from pgrace.model.scenario import Scenario
from pgrace.servers import ServerInfo

HERE = Path(__file__).parent / "explore"

SHIPPED = ["lost-update", "deadlock-transfer", "write-skew", "nowait"]  # both variants each
SHAPES = [
    "half-cure",
    "retry-once",  # a retry loop: split, it is not reduced
    pytest.param("hard/fk-check", marks=pytest.mark.thorough),
    pytest.param("hard/sequence-order", marks=[pytest.mark.slow, pytest.mark.thorough]),
]  # serializable-three is not searched (every order matters); skip-locked-two-queues: below


def _keys(found: Exploration) -> list[str]:
    return sorted(c.key for c in found.classes)


def _variants(name: str) -> list[Scenario]:
    loaded = catalog.read_scenario(name if name in catalog.shipped_names() else str(HERE / f"{name}.toml"))
    return [loaded.variant_named(v) for v in loaded.variants]


def _sharded(scenario: Scenario, server: ServerInfo, n: int) -> Exploration:
    return merge_explorations([explore(scenario, server, shard=(k, n)) for k in range(1, n + 1)])


# -- the split (no server) ---------------------------------------------------------------------


def test_the_space_splits_into_prefixes_in_number_order_that_count_it_all() -> None:
    space = Space(catalog.read_scenario("lost-update"))
    assert space.split(1) == [((), 70)]
    assert space.split(2) == [(("alice-1",), 35), (("bob-1",), 35)]
    three = space.split(3)  # no length gives exactly three: the shortest that gives at least
    assert [len(p) for p, _ in three] == [2, 2, 2, 2] and sum(n for _, n in three) == 70
    first = 0
    for prefix, count in space.split(8):  # each prefix is a run of consecutive numbers
        numbers = [i for i in range(70) if space.unrank(i)[: len(prefix)] == prefix]
        assert numbers == list(range(first, first + count))
        first += count
    assert first == 70
    mine = space.split(3)[1::3]  # a shard's prefixes, made longer for workers
    longer = space.split(4, mine)
    assert len(longer) >= 4 and sum(n for _, n in longer) == sum(n for _, n in mine)
    assert all(any(p[: len(q)] == q for q, _ in mine) for p, _ in longer)
    assert len(space.split(1000)) == 70  # never longer than an interleaving


# -- shards and workers cover the space (real server) ------------------------------------------


@pytest.mark.parametrize("name", SHIPPED)
def test_shards_of_the_reduced_search_merge_into_its_classes(pgrace_server: ServerInfo, name: str) -> None:
    """The one search's classes are every interleaving's: tests/test_reduce.py runs them all for each shipped variant."""
    for scenario in _variants(name):
        assert reduces(scenario, Space(scenario), None, (1, 1), 1)  # the search tests/test_reduce.py compares
        one = explore(scenario, pgrace_server)
        merged = _sharded(scenario, pgrace_server, 3)
        assert merged.covers_all and merged.explored == merged.space == Space(scenario).size, scenario.variant
        assert _keys(merged) == _keys(one), scenario.variant
        assert sum(c.count for c in merged.classes) + merged.repeats == merged.run_count  # a repeat is in no class


@pytest.mark.parametrize("name", SHAPES)
def test_shards_and_workers_find_the_classes_on_hard_shapes(pgrace_server: ServerInfo, name: str) -> None:
    for scenario in _variants(name):
        every = explore(scenario, pgrace_server, search=Exhaustive())
        merged = _sharded(scenario, pgrace_server, 3)
        workers = explore(scenario, pgrace_server, jobs=2)
        assert merged.covers_all and workers.covers_all
        assert _keys(merged) == _keys(workers) == _keys(every), scenario.variant


@pytest.mark.slow
@pytest.mark.thorough
def test_shards_and_workers_find_one_searchs_classes_on_two_skip_locked_queues(pgrace_server: ServerInfo) -> None:
    """4,200 interleavings; the one search's classes are every interleaving's (bench/bench_reduce.py, and
    tests/test_reduce_rows.py for one SKIP LOCKED queue)."""
    scenario = catalog.read_scenario(str(HERE / "hard" / "skip-locked-two-queues.toml"))
    one = explore(scenario, pgrace_server)
    merged = _sharded(scenario, pgrace_server, 3)
    workers = explore(scenario, pgrace_server, jobs=2)
    assert one.covers_all and merged.covers_all and workers.covers_all
    assert _keys(merged) == _keys(workers) == _keys(one)


def test_workers_see_their_own_databases_advisory_locks_only(pgrace_server: ServerInfo) -> None:
    """advisory-lock's checks read pg_locks, which is the server's: two workers' lock 42 must not meet."""
    for scenario in _variants("advisory-lock"):
        one = explore(scenario, pgrace_server, search=Exhaustive())
        workers = explore(scenario, pgrace_server, search=Exhaustive(), jobs=2)
        assert _keys(workers) == _keys(one), scenario.variant
        # The bug's one outcome, split by where its 55P03 fell (a step that declares it, or one that does not)
        assert len(one.classes) == {"bug": 2, "fix": 1}[scenario.variant], scenario.variant


@pytest.mark.thorough  # the split is checked on small spaces above; this is its 63-million-order case
def test_workers_of_the_reduced_search_cover_two_lost_updates(pgrace_server: ServerInfo) -> None:
    """63,063,000 interleavings: no exhaustive search to compare with, the one-process reduced one instead."""
    (scenario,) = _variants("two-lost-updates")
    one = explore(scenario, pgrace_server)
    seen: list[tuple[int, int]] = []
    workers = explore(scenario, pgrace_server, jobs=2, on_progress=lambda done, total: seen.append((done, total)))
    assert workers.covers_all and workers.explored == 63_063_000
    assert _keys(workers) == _keys(one)
    assert workers.run_count <= 4 * one.run_count  # what the split costs: equivalent runs under two prefixes
    assert seen[0][0] == 0 and seen[-1] == (workers.run_count, workers.run_count)
    assert all(done <= total for done, total in seen) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    shards = [explore(scenario, pgrace_server, shard=(k, 2)) for k in (1, 2)]
    assert sum(s.explored for s in shards) == 63_063_000 and all(s.explored > 0 for s in shards)
    assert _keys(merge_explorations(shards)) == _keys(one)


def test_a_prefix_the_server_cannot_launch_as_it_is_is_covered_by_another(pgrace_server: ServerInfo) -> None:
    """Bob's write waits for Alice's lock: his COMMIT cannot be sent before hers, so no run begins so."""
    scenario = catalog.read_scenario("lost-update").variant_named("bug")
    blocked = ("alice-1", "alice-read", "alice-write", "bob-1", "bob-read", "bob-write", "bob-4")
    free = ("alice-1", "alice-read", "alice-write", "bob-1", "bob-read", "alice-4", "bob-write")
    (runs, covered), (_, also) = explore_roots(scenario, pgrace_server, 10.0, [blocked, free], lambda one: None)
    assert (runs, covered, also) == (1, True, True)  # the one run that found it out, and no claim lost


def test_too_few_shards_do_not_claim_the_space(pgrace_server: ServerInfo) -> None:
    scenario = catalog.read_scenario("lost-update").variant_named("bug")
    first, second, third = (explore(scenario, pgrace_server, shard=(k, 3)) for k in (1, 2, 3))
    assert first.complete and first.to_dict()["complete"]  # its own share is covered
    partial = merge_explorations([first, second])
    assert not partial.covers_all and partial.explored == 70 - third.explored
    assert merge_explorations([first, second, third]).covers_all


# -- through the command line ----------------------------------------------------------------


def test_explore_shards_and_merge_on_the_command_line(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    cli = CliRunner()
    dsn = ["--dsn", pgrace_server.dsn]
    files = []
    for k in (1, 2):
        out = tmp_path / f"shard{k}.json"
        done = cli.invoke(main, ["explore", "lost-update", "--shard", f"{k}/2", "-f", "json", "-o", str(out), *dsn])
        assert done.exit_code == 0, done.output
        part = json.loads(out.read_text())
        assert (part["space"], part["explored"], part["complete"]) == (70, 35, True)
        assert part["runs"] < 35
        files.append(str(out))
    text = cli.invoke(main, ["explore", "lost-update", "--shard", "1/2", *dsn]).output
    assert text.startswith("lost-update (bug): 35 of 70 interleavings, ") and ", shard 1/2:" in text
    runs = sum(json.loads(Path(f).read_text())["runs"] for f in files)
    merged = cli.invoke(main, ["explore", "lost-update", "--merge", files[0], "--merge", files[1]])
    assert merged.exit_code == 0, merged.output
    assert merged.output.startswith(f"lost-update (bug): all 70 interleavings, {runs} runs: 2 outcome classes")
    alone = cli.invoke(main, ["explore", "lost-update", "--merge", files[0]])
    assert (
        alone.output.startswith("lost-update (bug): ") and "runs of 70 interleavings, not all covered" in alone.output
    )
    together = json.loads(
        cli.invoke(main, ["explore", "lost-update", "-f", "json", "--merge", files[0], "--merge", files[1]]).output
    )
    assert (together["explored"], together["complete"], together["runs"]) == (70, True, runs)
