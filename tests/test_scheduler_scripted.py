"""How the scheduler launches, waits, reports and cancels, told on scripted sessions (no server).

The sessions here are :mod:`fake_engine`'s: a tiny script language over named locks, with
an inspector that reports the script's "blocked by whom?" as the observer's probe would.
Each test reads as one rule of :class:`~pgrace.engine.scheduler.Scheduler`, in
isolationtester's order; what the server itself answers is tested on a real server
(tests/test_timeline_truth.py, tests/test_orders.py and the isolation corpus).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from fake_engine import Bench, after, scenario

from pgrace.engine.session import LiveSession
from pgrace.engine.steps import Active
from pgrace.engine.transport import LaunchedSteps, Plain
from pgrace.engine.waiting import Waiting
from pgrace.errors import ScenarioError, StepsStuck
from pgrace.model.timeline import Outcome, StepCancelled
from pgrace.model.variables import Value

TWO_WRITERS = scenario(
    "alice.a1: lock r",
    "bob.b1: lock r",
    "alice.a2: commit",
    "bob.b2: commit",
)


def test_a_step_the_inspector_says_is_blocked_waits_and_ends_right_after_the_step_that_released_it() -> None:
    bench = Bench(TWO_WRITERS)
    assert bench.play("a1", "b1", "a2", "b2") == [
        "a1 sent",
        "a1 ends ok",
        "b1 sent",
        "b1 waits for alice",
        "a2 sent",
        "a2 ends ok",
        "b1 ends ok, released by a2",
        "b2 sent",
        "b2 ends ok",
    ]
    assert bench.inspector.probes > 0  # the wait was the inspector's answer, not a guess from time


def test_a_long_step_that_is_not_blocked_is_waited_for_and_never_reported_waiting() -> None:
    bench = Bench(scenario("alice.a1: work 5", "bob.b1: select 1"))
    assert bench.play("a1", "b1") == ["a1 sent", "a1 ends ok", "b1 sent", "b1 ends ok"]
    assert bench.waiting.waits >= 5  # it waited on the session five times, asking the inspector between


def test_two_steps_one_commit_frees_are_reported_oldest_launch_first() -> None:
    readers = scenario(
        "alice.a1: lock r",
        "carol.c1: share r",
        "bob.b1: share r",
        "alice.a2: commit",
    )
    assert Bench(readers).play("a1", "c1", "b1", "a2")[-3:] == [
        "a2 ends ok",
        "c1 ends ok, released by a2",
        "b1 ends ok, released by a2",
    ]
    assert Bench(readers).play("a1", "b1", "c1", "a2")[-3:] == [
        "a2 ends ok",
        "b1 ends ok, released by a2",
        "c1 ends ok, released by a2",
    ]


def test_a_step_marker_holds_back_a_finished_steps_report_until_that_step_is_reported() -> None:
    readers = scenario(
        "alice.a1: lock r",
        "bob.b1: share r",
        "carol.c1: share r",
        "alice.a2: commit",
    )
    # isolationtester's b1(c1): b1 ends with c1, but is told after it, whatever the launch order says.
    assert Bench(readers).play("a1", after("b1", "c1"), "c1", "a2")[-3:] == [
        "a2 ends ok",
        "c1 ends ok, released by a2",
        "b1 ends ok, released by a2",
    ]


def test_a_star_marker_reports_the_step_waiting_at_once_and_its_end_at_the_permutations_end() -> None:
    bench = Bench(scenario("alice.a1: select 1", "bob.b1: select 2"))
    assert bench.play(after("a1", "*"), "b1") == [
        "a1 sent",
        "a1 waits (marker)",
        "b1 sent",
        "b1 ends ok",
        "a1 ends ok, unknown",  # it waited for no session: nothing released it
    ]


def test_a_notices_marker_holds_the_step_until_that_session_has_sent_as_many_more_notices() -> None:
    bench = Bench(scenario("alice.a1: select 1", "bob.b1: select 2", "alice.a2: notice"))
    assert bench.play("a1", after("b1", "a2 notices 1"), "a2") == [
        "a1 sent",
        "a1 ends ok",
        "b1 sent",
        "b1 waits (marker)",
        "a2 sent",
        "a2 ends ok",
        "b1 ends ok, released by a2",  # the marker's session is one it waited for
    ]


def test_a_marker_nothing_left_can_clear_is_the_scenarios_own_dead_end() -> None:
    bench = Bench(scenario("alice.a1: select 1", "bob.b1: select 2", "alice.a2: select 3"))
    with pytest.raises(StepsStuck, match="mutually-blocking steps: b1"):
        bench.play("a1", after("b1", "a2 notices 1"), "a2")  # a2 sends no notice


def test_a_busy_sessions_next_step_waits_for_its_blocked_step_which_the_step_timeout_cancels() -> None:
    # b2 is bob's, and bob still waits for alice, whose commit comes only after b2: as isolationtester,
    # the scheduler waits for b1 (nothing else can go) until the step timeout, and cancels it.
    bench = Bench(TWO_WRITERS, step_timeout=0.2)
    assert bench.play("a1", "b1", "b2", "a2") == [
        "a1 sent",
        "a1 ends ok",
        "b1 sent",
        "b1 waits for alice",
        "b1 cancelled after 0.2 s",
        "b1 ends 57014, step_timeout",
        "b2 sent",
        "b2 ends ok",
        "a2 sent",
        "a2 ends ok",
    ]
    assert bench.sessions["bob"].cancels == 1
    (cancel,) = (e for e in bench.run.events if isinstance(e, StepCancelled))
    assert cancel.graph == (("bob", ("alice",)),)  # who waited for whom when it was cancelled
    (alice,) = cancel.holders
    assert (alice.session, alice.state, alice.running, alice.next_step) == ("alice", "idle in transaction", None, "a2")


def test_with_deferral_a_busy_sessions_step_waits_while_the_other_sessions_go_on() -> None:
    # defer_busy_sessions (explore): b2 waits for bob to be free; a2 goes ahead, releases b1, then b2 goes.
    bench = Bench(TWO_WRITERS, step_timeout=0.2, defer_busy_sessions=True)
    assert bench.play("a1", "b1", "b2", "a2") == [
        "a1 sent",
        "a1 ends ok",
        "b1 sent",
        "b1 waits for alice",
        "a2 sent",
        "a2 ends ok",
        "b1 ends ok, released by a2",
        "b2 sent",
        "b2 ends ok",
    ]
    assert bench.sessions["bob"].cancels == 0


def test_a_step_still_running_at_the_step_timeout_is_cancelled_once() -> None:
    bench = Bench(scenario("alice.a1: hang", "bob.b1: select 1"), step_timeout=0.1)
    assert bench.play("a1", "b1") == ["a1 sent", "a1 cancelled after 0.1 s", "a1 ends 57014", "b1 sent", "b1 ends ok"]
    assert bench.sessions["alice"].cancels == 1


@pytest.mark.timing
def test_the_cancel_comes_at_the_step_timeout_not_before_nor_much_after() -> None:
    bench = Bench(TWO_WRITERS, step_timeout=0.5)
    started = time.perf_counter()
    assert "b1 cancelled after 0.5 s" in bench.play("a1", "b1", "b2", "a2")
    assert 0.5 <= time.perf_counter() - started < 0.9


def test_when_one_commit_wakes_two_waiters_the_one_the_server_let_go_first_is_recorded() -> None:
    queue = scenario(
        "alice.a1: lock r",
        "bob.b1: lock r",
        "carol.c1: lock r",
        "alice.a2: commit",
        "bob.b2: commit",
        "carol.c2: commit",
    )
    assert Bench(queue).play("a1", "b1", "c1", "a2", "b2", "c2")[4:] == [
        "c1 sent",
        "c1 waits for alice",
        "a2 sent",
        "a2 ends ok",
        "b1 ends ok, released by a2",
        "c1 waits for b1, which the server let go first",
        "b2 sent",
        "b2 ends ok",
        "c1 ends ok, released by b2",
        "c2 sent",
        "c2 ends ok",
    ]


@pytest.mark.timing
def test_a_session_whose_waiter_the_server_let_go_second_is_held_aside_while_the_others_go_on() -> None:
    # alice's commit wakes bob and carol; the server lets bob go first, and carol now waits for bob.
    # carol's next step cannot go before bob's commit: it waits aside (no step timeout), b2 goes.
    queue = scenario(
        "alice.a1: lock r",
        "bob.b1: lock r",
        "carol.c1: lock r",
        "alice.a2: commit",
        "bob.b2: commit",
        "carol.c2: commit",
    )
    bench = Bench(queue, step_timeout=5.0)
    started = time.perf_counter()
    assert bench.play("a1", "b1", "c1", "a2", "c2", "b2")[8:] == [
        "b1 ends ok, released by a2",
        "c1 waits for b1, which the server let go first",
        "b2 sent",
        "b2 ends ok",
        "c1 ends ok, released by b2",
        "c2 sent",
        "c2 ends ok",
    ]
    assert time.perf_counter() - started < 5.0 and bench.sessions["carol"].cancels == 0


def test_a_step_held_by_a_marker_nothing_left_clears_stops_its_sessions_next_step() -> None:
    bench = Bench(scenario("alice.a1: select 1", "bob.b1: select 2", "alice.a2: select 3"))
    with pytest.raises(StepsStuck, match="mutually-blocking steps: a1"):
        bench.play(after("a1", "b1 notices 1"), "b1", "a2")  # bob sends no notice: a1 is never told, a2 never sent


def test_a_capture_is_its_sessions_variable_and_every_sessions_by_qualified_name() -> None:
    captured = scenario("alice.a1: select 7", "bob.b1: lock r", "carol.c1: lock r")
    steps = tuple(
        dataclasses.replace(s, capture=(("claimed", "v"),)) if s.name in ("a1", "c1") else s for s in captured.steps
    )
    bench = Bench(dataclasses.replace(captured, steps=steps), step_timeout=0.1)
    assert bench.play("a1", "b1", "c1")[-2:] == ["c1 cancelled after 0.1 s", "c1 ends 57014, step_timeout"]
    scheduler, alice = bench.scheduler, bench.sessions["alice"]
    assert alice.variables == {"claimed": Value("7", "7")}
    assert scheduler.values(bench.sessions["bob"])["alice.claimed"] == Value("7", "7")
    assert scheduler.values(alice)["claimed"] == Value("7", "7")  # its own, unqualified too
    assert scheduler.values(None)["alice.pid"] == Value(alice.pid)  # a session's pid is a fact
    assert "alice.pid" not in scheduler.values(None, facts=False)  # not in the timeline's text
    assert scheduler.values(None)["carol.claimed"] == Value(None)  # its step failed: NULL


def test_a_step_that_fails_captures_null_and_one_whose_column_is_missing_is_bad_input() -> None:
    failing = scenario("alice.a1: fail 23505", "bob.b1: select 1")
    steps = tuple(dataclasses.replace(s, capture=(("claimed", "w"),)) for s in failing.steps)
    bench = Bench(dataclasses.replace(failing, steps=steps))
    with pytest.raises(ScenarioError, match="step 'b1' captures column 'w', but its result has v"):
        bench.play("a1", "b1")
    assert bench.sessions["alice"].variables == {"claimed": Value(None)}


class OwnSteps(Plain):
    """A transport that runs a step with a ``sleep`` itself, and keeps what the scheduler told it."""

    def __init__(self, waiting: Waiting[Any]) -> None:
        super().__init__(waiting)
        self.own: list[str] = []
        self.reported: list[int] = []

    def run_own(self, session: LiveSession, active: Active, launched: LaunchedSteps) -> Outcome | None:
        self.own.append(active.step.name)
        assert launched.is_pending(active) is False  # being launched: not yet among the steps waited for
        return Outcome()

    def step_reported(self, last_done: int) -> None:
        self.reported.append(last_done)


def test_a_transports_own_step_is_run_by_the_transport_and_each_report_is_told_to_it() -> None:
    """A sleep or a crash is the transport's to run (the scheduler knows no transport by name); after
    each step reported, the transport hears which was done last (to find sessions the server ended)."""
    napping = scenario("alice.a1: select 1", "bob.b1: select 2")
    napping = dataclasses.replace(napping, steps=(dataclasses.replace(napping.steps[0], sleep=0.5), napping.steps[1]))
    bench = Bench(napping, transport=OwnSteps)
    assert bench.play("a1", "b1") == ["a1 sent", "a1 ends ok", "b1 sent", "b1 ends ok"]
    assert isinstance(bench.transport, OwnSteps)
    assert bench.transport.own == ["a1"] and bench.transport.reported == [1, 2]
    assert bench.sessions["alice"].statement is None  # the transport's step was never sent as SQL
