"""Explore's reduction reads the clock where the server does: now() at its transaction's start.

now(), current_timestamp and their kin are the transaction's start time, fixed by its first
statement; clock_timestamp() and statement_timestamp() are read by the step itself. Only the
order of the readings is the interleaving's doing, so the starts of transactions that read
their start time, and the steps that read the clock as they run, are ordered against each
other and against nothing else. Each scenario of ``tests/explore/clock/`` is explored reduced
and exhaustively and the two must find the same classes; three rules that are wrong (the
clock read where now() is written, a setup's ``DEFAULT now()`` not seen, clock_timestamp()
taken as read at the transaction's start) each lose a class of one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pgrace.drivers.explore import _explore_reduced, explore
from pgrace.drivers.reduce import moves, nature_of
from pgrace.drivers.reduce.nature import Nature, setup_clock
from pgrace.drivers.searches import Exhaustive
from pgrace.frontends import catalog
from pgrace.model.exploration import Exploration
from pgrace.model.orders.space import Space
from pgrace.model.scenario import Scenario, Step
from pgrace.servers import ServerInfo

CLOCK = Path(__file__).parent / "explore" / "clock"

#: The order of two clock readings decides the final state: two classes each.
MUST_DEPEND = ["begin-order", "default-now", "clock-as-it-runs", "stamped"]


def _classes(found: Exploration) -> list[str]:
    return sorted(c.key for c in found.classes)


def _searched(scenario: Scenario, server: ServerInfo) -> Exploration:
    """The reduced search itself, even where explore would run every interleaving instead."""
    return _explore_reduced(scenario, server, Space(scenario), 10.0, None)


@pytest.mark.parametrize("name", [*MUST_DEPEND, "stale-reclaim-two"])
def test_clock_readings_keep_the_exhaustive_classes(pgrace_server: ServerInfo, name: str) -> None:
    loaded = catalog.read_scenario(str(CLOCK / f"{name}.toml"))
    for variant in loaded.variants:
        scenario = loaded.variant_named(variant)
        reduced = _searched(scenario, pgrace_server)
        every = explore(scenario, pgrace_server, search=Exhaustive())
        assert _classes(reduced) == _classes(every)
        assert reduced.covers_all and reduced.run_count < every.run_count
        if name in MUST_DEPEND:
            assert len(every.classes) == 2


def _use_site(nature: Nature, starts: bool, start_read: bool) -> bool:
    return nature.clock or nature.clock_at_start  # wrong: now() was fixed when the transaction began


def _at_start(nature: Nature, starts: bool, start_read: bool) -> bool:
    return starts and (start_read or nature.clock)  # wrong: clock_timestamp() is read as the step runs


def _setup_unseen(scenario: Scenario) -> tuple[bool, bool]:
    return False, False  # wrong: a default now() reads the clock where the insert's text does not say so


WRONG: dict[str, tuple[str, Callable[..., Any], str]] = {
    "now() read where it is written": ("reads_clock", _use_site, "begin-order"),
    "clock_timestamp() read at the start": ("reads_clock", _at_start, "clock-as-it-runs"),
    "a setup's default not seen": ("setup_clock", _setup_unseen, "default-now"),
}


@pytest.mark.parametrize("rule", WRONG)
def test_a_wrong_clock_rule_loses_a_class(
    pgrace_server: ServerInfo, monkeypatch: pytest.MonkeyPatch, rule: str
) -> None:
    """The comparisons above can fail: each wrong rule finds fewer classes than every interleaving does."""
    name, wrong, scenario_name = WRONG[rule]
    scenario = catalog.read_scenario(str(CLOCK / f"{scenario_name}.toml"))
    every = explore(scenario, pgrace_server, search=Exhaustive())
    monkeypatch.setattr(moves, name, wrong)
    reduced = _searched(scenario, pgrace_server)
    assert len(reduced.classes) < len(every.classes) == 2


def test_times_in_final_rows_classify_by_their_order(pgrace_server: ServerInfo) -> None:
    """Two explorations of a check that shows now()'s stamps find the same classes: the wall clock moved."""
    scenario = catalog.read_scenario(str(CLOCK / "stamped.toml"))
    first, again = (explore(scenario, pgrace_server, search=Exhaustive()) for _ in range(2))
    assert _classes(first) == _classes(again)
    finals = sorted(c.final[0] for c in first.classes)
    assert finals == [
        (("a", "<timestamptz 2>", False), ("b", "<timestamptz 3>", False), ("setup", "<timestamptz 1>", True)),
        (("a", "<timestamptz 3>", False), ("b", "<timestamptz 2>", False), ("setup", "<timestamptz 1>", True)),
    ]


@pytest.mark.slow
@pytest.mark.thorough  # stale-reclaim-two above compares the same queue's classes on a smaller space
@pytest.mark.parametrize("variant", ["bug", "fix"])
def test_the_stale_reclaim_queue_takes_a_tenth_of_its_space(pgrace_server: ServerInfo, variant: str) -> None:
    """Three workers of four steps (34,650 interleavings) that reclaim by now() and whose check reads it;
    bench_reduce compares every interleaving's classes."""
    scenario = catalog.read_scenario(str(CLOCK / "stale-reclaim-queue.toml")).variant_named(variant)
    found = explore(scenario, pgrace_server)
    assert found.space == 34_650 and found.covers_all and found.reduced
    assert found.run_count <= 3_465
    assert {c.reproduces for c in found.classes} == {variant == "bug"}


def _step(sql: str) -> Step:
    return Step(name="s", session="a", sql=sql)


@pytest.mark.parametrize(
    ("sql", "clock", "at_start"),
    [
        ("UPDATE jobs SET locked_at = now() WHERE id = 1", False, True),
        ("SELECT current_timestamp, localtimestamp", False, True),
        ("SELECT 'today'::date", False, True),
        ("SELECT age(locked_at) FROM jobs", False, True),
        ("INSERT INTO log VALUES (clock_timestamp())", True, False),
        ("SELECT statement_timestamp(), now()", True, True),
        ("UPDATE jobs SET locked_at = NULL WHERE id = 1", False, False),
    ],
)
def test_what_a_step_says_of_the_clock(sql: str, clock: bool, at_start: bool) -> None:
    scenario = catalog.read_scenario(str(CLOCK / "begin-order.toml"))
    nature = nature_of(_step(sql), scenario)
    assert not nature.opaque and (nature.clock, nature.clock_at_start) == (clock, at_start)


@pytest.mark.parametrize(
    ("setup", "unseen"),
    [
        (
            "CREATE TABLE t (id int, at timestamptz); INSERT INTO t VALUES (1, now() - interval '1 hour')",
            (False, False),
        ),
        ("CREATE TABLE t (id int, at timestamptz DEFAULT now()); INSERT INTO t VALUES (1)", (True, False)),
        ("CREATE FUNCTION f() RETURNS timestamptz LANGUAGE sql AS $$ SELECT clock_timestamp() $$", (False, True)),
        ("CREATE VIEW v AS SELECT current_date AS d", (True, False)),
        ("CREATE TABLE é (id int, at timestamptz DEFAULT statement_timestamp())", (False, True)),
    ],
)
def test_what_a_setup_leaves_to_the_clock(setup: str, unseen: tuple[bool, bool]) -> None:
    import dataclasses

    scenario = dataclasses.replace(catalog.read_scenario(str(CLOCK / "begin-order.toml")), setup=(setup,))
    assert setup_clock(scenario) == unseen
