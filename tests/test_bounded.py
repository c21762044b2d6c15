"""Bounded explore: --max-preemptions K and --pct D, on a real server, and the guarantee each result states.

A preemption is a switch away from a session that could have gone on; the shipped lost
update, deadlock and write skew each need one (the second session's read, or its debit,
comes between the first one's steps), none is found by the serial schedules of K = 0,
and each is found with K = 2. PCT's draws are seeded: the same seed runs the same
schedules and finds the same classes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from pgrace.cli import main
from pgrace.drivers.bounded import explore_preemptions, pct_order
from pgrace.drivers.explore import explore
from pgrace.drivers.reduce import Trace, executor
from pgrace.drivers.searches import Pct, PreemptionBounded
from pgrace.frontends import catalog
from pgrace.model.exploration import Bound, Exploration
from pgrace.model.orders.space import Space
from pgrace.model.outcomes import Observed, switches
from pgrace.render.outcomes import render_exploration_html, render_exploration_markdown, render_exploration_text
from pgrace.servers import ServerInfo

TWO_PAIRS = Path(__file__).parent / "explore" / "two-lost-updates.toml"


def reproduced(found: Exploration) -> bool:
    """Some class shows the bug, as its checks' polarity says (lost-update's and write-skew's are its signature)."""
    return any(c.reproduces for c in found.classes)


@pytest.mark.parametrize("name", ["lost-update", "write-skew"])
def test_serial_schedules_miss_the_bug_one_preemption_finds_it_and_two_still_do(
    pgrace_server: ServerInfo, name: str
) -> None:
    scenario = catalog.read_scenario(name).variant_named("bug")
    serial, one, two = (explore(scenario, pgrace_server, search=PreemptionBounded(k)) for k in (0, 1, 2))
    assert serial.run_count == 2  # K = 0: each session runs to its end, in both orders
    assert not reproduced(serial)
    assert reproduced(one) and reproduced(two)
    assert serial.run_count < one.run_count < two.run_count < two.space


def test_the_deadlock_needs_one_preemption_and_is_found_within_two(pgrace_server: ServerInfo) -> None:
    """Bob's debit comes between Alice's two updates (one preemption); his credit then waits, a free switch."""
    scenario = catalog.read_scenario("deadlock-transfer").variant_named("bug")
    serial = explore(scenario, pgrace_server, search=PreemptionBounded(0))
    assert not any("40P01" in c.errors for c in serial.classes)
    for k in (1, 2):
        deadlocked = [
            c for c in explore(scenario, pgrace_server, search=PreemptionBounded(k)).classes if "40P01" in c.errors
        ]
        assert deadlocked and deadlocked[0].ok, k  # the bug variant's checks describe the deadlock's aftermath


@pytest.mark.parametrize("name", ["lost-update", "deadlock-transfer"])
def test_every_launch_order_within_the_bound_is_run(pgrace_server: ServerInfo, name: str) -> None:
    """Soundness: each launch order that running every interleaving produced, with at most K
    preemptions (counted on what the server let go: a waiting session is not preempted), is one
    of the bounded search's runs."""
    scenario = catalog.read_scenario(name).variant_named("bug")
    session = {step.name: step.session for step in scenario.steps}

    def preemptions(trace: Trace) -> int:
        launched = trace.launched
        return sum(
            session[launched[i]] != session[launched[i - 1]] and session[launched[i - 1]] in trace.enabled[i]
            for i in range(1, len(launched))
        )

    with executor(scenario, pgrace_server, 10.0, footprints=False) as execute:
        every = {(t := execute(order)).launched: preemptions(t) for order in Space(scenario)}
    for k in (0, 1, 2):
        ran: list[Observed] = []
        explore_preemptions(scenario, pgrace_server, 10.0, k, ran.append)
        assert {order for order, cost in every.items() if cost <= k} <= {one.launched for one in ran}, k


def test_a_bounded_result_says_its_guarantee_and_is_never_complete(pgrace_server: ServerInfo) -> None:
    found = explore(catalog.read_scenario("lost-update"), pgrace_server, search=PreemptionBounded(2))
    data = found.to_dict()
    assert data["guarantee"] == {"kind": "preemptions", "bound": 2, "met": True, "diverged": 0}
    assert data["complete"] is False and data["space"] == 70
    assert data["explored"] == data["runs"] == sum(c["count"] for c in data["classes"])
    header = f"every schedule with at most 2 preemptions, {found.run_count} runs (of 70 interleavings)"
    scenario = catalog.read_scenario("lost-update")
    assert header in render_exploration_text(found, scenario).splitlines()[0]
    assert header in render_exploration_markdown(found, scenario).splitlines()[0]
    assert header in render_exploration_html(found, scenario, {})
    assert explore(scenario, pgrace_server).to_dict()["guarantee"] == {"kind": "complete"}


def test_a_bound_cut_at_max_runs_says_it_was_not_met(pgrace_server: ServerInfo) -> None:
    result = CliRunner().invoke(
        main, ["explore", "lost-update", "--max-preemptions", "2", "--max", "5", "--dsn", pgrace_server.dsn]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(
        "lost-update (bug): NOT every schedule with at most 2 preemptions: 5 runs of 70 interleavings"
        " (stopped at 5 runs with schedules left)"
    )


def test_one_preemption_loses_one_pairs_withdrawal_never_both(pgrace_server: ServerInfo) -> None:
    """Two independent lost updates (63,063,000 interleavings): losing both needs a preemption in each pair."""
    scenario = catalog.read_scenario(str(TWO_PAIRS))
    serial = explore(scenario, pgrace_server, search=PreemptionBounded(0))
    one = explore(scenario, pgrace_server, search=PreemptionBounded(1))
    assert serial.run_count == 24  # the 4! orders of whole sessions
    assert {c.final[0][0] for c in serial.classes} == {(300, 300)}
    assert {c.final[0][0] for c in one.classes} == {(300, 300), (300, 400), (400, 300)}


def test_pct_is_seeded_and_states_its_probability(pgrace_server: ServerInfo) -> None:
    scenario = catalog.read_scenario("lost-update")
    first = explore(scenario, pgrace_server, search=Pct(2, seed=7))
    again = explore(scenario, pgrace_server, search=Pct(2, seed=7))
    assert first.to_dict() == again.to_dict()
    guarantee = first.to_dict()["guarantee"]
    p = 1 / (2 * 8)  # 2 sessions, 8 steps, depth 2: 1/(n·k^(D-1))
    assert guarantee["kind"] == "pct" and guarantee["depth"] == 2 and guarantee["seed"] == 7
    assert guarantee["draws"] == first.explored == 100  # the default number of schedules
    assert guarantee["per_run"] == p and guarantee["missed"] == pytest.approx((1 - p) ** 100)
    assert first.run_count == sum(c.count for c in first.classes) <= 100  # a repeated order runs once
    assert reproduced(first)
    assert not reproduced(
        explore(scenario, pgrace_server, search=Pct(1, seed=7))
    )  # depth 1: whole sessions, one by one
    text = render_exploration_text(first, scenario).splitlines()[0]
    assert "pct depth 2, seed 7, 100 runs" in text
    assert "missed with probability at most 0.2% (each run finds it with probability at least 6.2%)" in text


def test_pct_orders_switch_sessions_at_most_depth_minus_one_times_before_a_session_ends() -> None:
    space = Space(catalog.read_scenario(str(TWO_PAIRS)))
    rng = random.Random(0)
    for depth in (1, 2, 3):
        for _ in range(200):
            order = pct_order(space, rng, depth)
            assert sorted(order) == sorted(space.where)
            # a switch is a change point's, or a session's end (4 sessions: 3 ends)
            assert switches(order, space.scenario) <= depth - 1 + 3


def test_a_bound_the_search_could_not_keep_says_why() -> None:
    diverged = Bound("preemptions", 2, 2, 8, 30, diverged=3)
    assert not diverged.met
    assert diverged.words(70) == (
        "NOT every schedule with at most 2 preemptions: 30 runs of 70 interleavings"
        " (3 launched in another order than asked: no claim for those branches)"
    )
    assert diverged.to_dict() == {"kind": "preemptions", "bound": 2, "met": False, "diverged": 3}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--max-preemptions", "1", "--pct", "2"], "--max-preemptions and --pct are two searches: choose one"),
        (["--max-preemptions", "1", "--no-reduce"], "--no-reduce has no meaning with it"),
        (["--pct", "2", "--shard", "1/2"], "--pct runs in one process: --shard and -j cannot split it"),
        (["--max-preemptions", "2", "-j", "2"], "--shard and -j cannot split it"),
        (["--max-preemptions", "-1"], "--max-preemptions -1: K is 0 or more and below the 8 steps"),
        (["--max-preemptions", "8"], "--max-preemptions 8: K is 0 or more and below the 8 steps"),
        (["--pct", "0"], "--pct 0: the depth D is between 1 and the 8 steps"),
        (["--pct", "9"], "--pct 9: the depth D is between 1 and the 8 steps"),
    ],
)
def test_what_a_bounded_search_cannot_mean_is_refused_before_a_server_starts(args: list[str], said: str) -> None:
    result = CliRunner().invoke(main, ["explore", "lost-update", *args, "--dsn", "postgresql://nowhere.invalid/x"])
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and said in lines[0], result.stderr


def test_bounded_results_are_not_shards_to_merge(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["explore", "lost-update", "--pct", "2", "-f", "json", "--dsn", pgrace_server.dsn]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["guarantee"]["kind"] == "pct"
    (tmp_path / "a.json").write_text(result.stdout)
    merged = CliRunner().invoke(main, ["explore", "lost-update", "--merge", str(tmp_path / "a.json")])
    assert merged.exit_code == 2
    assert "cannot merge bounded explorations" in merged.stderr
