"""Sessions the server ends, and what a sleep lets happen: told as they happen, with the server's reason.

A console leaves a transaction open holding a job's row; ``idle_in_transaction_session_timeout``
ends it at 300 ms while the console "sleeps" for 1.5 s; the worker waiting on the row goes
on at once. Before, pgrace watched only waiting steps during a sleep: the worker was
reported finished when the sleep ended (1,5xx ms), its locks-after still showed the dead
console's row lock, the loss was never recorded (``sessions_lost: []``) and the release read
only "console's connection is gone". Now every fact carries its true time and cause.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable

import pytest
from helpers import by_name, finished_at

from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.model.scenario import Scenario
from pgrace.model.timeline import Run
from pgrace.pytest_plugin import RunScenario
from pgrace.render.json import run_to_dict
from pgrace.render.markdown import render_markdown
from pgrace.render.text import Style, render_text
from pgrace.render.wording import lost_text


def scenario_text(text: str) -> Scenario:
    return parse_toml_scenario(textwrap.dedent(text), "ended.toml")


IDLE_CONSOLE = """
setup = "CREATE TABLE jobs (id int PRIMARY KEY, state text); INSERT INTO jobs VALUES (1, 'new')"
sessions = ["console", "worker"]

[[step]]
name = "hold"
session = "console"
sql = "SET idle_in_transaction_session_timeout = '300ms'; BEGIN; SELECT * FROM jobs WHERE id = 1 FOR NO KEY UPDATE"

[[step]]
name = "work"
session = "worker"
sql = "UPDATE jobs SET state = 'done' WHERE id = 1"
expect = { waits_for = "console", released_by = "terminated" }

[[step]]
name = "nap"
session = "console"
sleep = "1500ms"
"""

REASON = "25P03: terminating connection due to idle-in-transaction timeout"


@pytest.fixture
def run(pgrace_run: RunScenario) -> Run:
    return pgrace_run(scenario_text(IDLE_CONSOLE))


def test_a_step_released_during_a_sleep_is_told_at_its_true_time_with_the_locks_then(run: Run) -> None:
    steps = by_name(run)
    hold, work, nap = steps["hold"], steps["work"], steps["nap"]
    assert 250 < finished_at(run, work.seq) - finished_at(run, hold.seq) < 1000, (
        "the timeout's time, not the sleep's end"
    )
    assert finished_at(run, work.seq) < finished_at(run, nap.seq) - 400
    assert work.locks_after == (), "the ended console holds nothing any more"


def test_the_ended_session_is_recorded_with_the_servers_reason_though_it_never_runs_again(run: Run) -> None:
    [lost] = run.sessions_lost()
    assert (lost.session, lost.sqlstate, lost.idle) == ("console", "25P03", True)
    assert lost.message == "terminating connection due to idle-in-transaction timeout"
    data = run_to_dict(run)
    assert data["sessions_lost"][0]["sqlstate"] == "25P03" and data["sessions_lost"][0]["idle"] is True
    release = {s["name"]: s["release"] for s in data["steps"]}["work"]
    assert release["cause"] == "terminated" and release["session"] == "console" and release["reason"] == REASON


RENDERERS: list[Callable[[Run], str]] = [lambda r: render_text(r, Style(colour=False, width=400)), render_markdown]


@pytest.mark.parametrize("render", RENDERERS, ids=["text", "markdown"])
def test_every_format_names_the_cause(run: Run, render: Callable[[Run], str]) -> None:
    text = " ".join(render(run).split())
    assert f"resumes: the server ended console's connection ({REASON})" in text
    assert f"⚡ the server ended console's connection ({REASON})" in text
    assert run.ok, [c for c in run.checks if not c.ok]


def test_a_session_terminated_from_outside_is_named_even_without_a_later_step(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        scenario_text(
            """
            setup = "CREATE TABLE jobs (id int PRIMARY KEY); INSERT INTO jobs VALUES (1)"
            sessions = ["console", "worker", "dba"]
            [[step]]
            session = "console"
            sql = "BEGIN; SELECT * FROM jobs FOR UPDATE"
            [[step]]
            name = "work"
            session = "worker"
            sql = "DELETE FROM jobs WHERE id = 1"
            [[step]]
            session = "dba"
            sql = "SELECT pg_terminate_backend(:console.pid)"
            """
        )
    )
    [lost] = run.sessions_lost()
    assert (lost.session, lost.sqlstate) == ("console", "57P01")
    assert (
        lost_text(lost)
        == "⚡ the server ended console's connection (57P01: terminating connection due to administrator command)"
    )
    assert by_name(run)["work"].status == "ok"


QUEUE = """
setup = "CREATE TABLE jobs (id int PRIMARY KEY, s text); INSERT INTO jobs VALUES (1, 'q')"
sessions = ["h", "w1", "w2"]
[[step]]
session = "h"
sql = "BEGIN; SELECT * FROM jobs WHERE id = 1 FOR UPDATE"
[[step]]
session = "w1"
sql = "BEGIN"
[[step]]
name = "w1-upd"
session = "w1"
sql = "UPDATE jobs SET s = 'w1' WHERE id = 1"
[[step]]
name = "w2-upd"
session = "w2"
sql = "UPDATE jobs SET s = 'w2' WHERE id = 1"
[[step]]
name = "h-commit"
session = "h"
sql = "COMMIT"
[[step]]
name = "w1-commit"
session = "w1"
sql = "COMMIT"
"""


def test_a_waiting_steps_locks_after_are_those_after_it_went_on(pgrace_run: RunScenario) -> None:
    """The JSON's locks_after of a step that waited held the locks of when its wait began (h's FOR UPDATE,
    after h had committed), while the text's lock column told the truth."""
    steps = by_name(pgrace_run(scenario_text(QUEUE)))
    assert [(lock.session, lock.mode) for lock in steps["w1-upd"].locks_after or ()] == [("w1", "NO KEY UPDATE")]
    assert steps["w2-upd"].locks_after == ()
