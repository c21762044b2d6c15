"""While one session runs a long statement, the others are still watched: their ends are told as they happen.

A job holds a row and then runs a 1 s statement (``SELECT pg_sleep(1)``); a web request
queued for the row gives up after its 200 ms ``lock_timeout``. Before, pgrace waited for the
long statement alone and reported the web request when it ended (finished at ~1,0xx ms, and
the row after the job's). Now the web request's end is told at ~200 ms, with the locks then,
and the job's long statement has its row where it started, as a sleep step has. A step that
releases a lock and then keeps running (``COMMIT; SELECT pg_sleep(1)``) is named as the release.
"""

from __future__ import annotations

import textwrap

import pytest
from helpers import by_name

from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.model.scenario import Scenario
from pgrace.pytest_plugin import RunScenario
from pgrace.render.markdown import render_markdown
from pgrace.render.text import Style, render_text


def scenario_text(text: str) -> Scenario:
    return parse_toml_scenario(textwrap.dedent(text), "long.toml")


LONG_HOLDER = """
setup = "CREATE TABLE jobs (id int PRIMARY KEY, state text); INSERT INTO jobs VALUES (1, 'new')"
sessions = ["job", "web"]

[[step]]
name = "hold"
session = "job"
sql = "BEGIN; UPDATE jobs SET state = 'running' WHERE id = 1"

[[step]]
name = "request"
session = "web"
sql = "SET lock_timeout = '200ms'; UPDATE jobs SET state = 'seen' WHERE id = 1"
expect = { waits_for = "job", error = "55P03", released_by = "lock_timeout" }

[[step]]
name = "work"
session = "job"
sql = "SELECT pg_sleep(1)"

[[step]]
name = "done"
session = "job"
sql = "COMMIT"
"""


@pytest.mark.timing
def test_a_wait_that_ends_during_a_long_statement_is_told_when_it_ends(pgrace_run: RunScenario) -> None:
    run = pgrace_run(scenario_text(LONG_HOLDER))
    assert run.ok, [c for c in run.checks if not c.ok]
    steps = by_name(run)
    request, work = steps["request"], steps["work"]
    assert request.finished_ms is not None and work.finished_ms is not None
    assert request.finished_ms - request.started_ms < 600, request.finished_ms  # 200 ms, not after the 1 s
    assert work.finished_ms - work.started_ms >= 1000
    assert request.finished_ms < work.finished_ms
    text = render_text(run, Style(colour=False, width=400))
    # the long statement's row comes where it started, before the request gives up during it
    assert text.index("SELECT pg_sleep(1)") < text.index("its lock_timeout expired"), text
    markdown = render_markdown(run)
    assert markdown.index("SELECT pg_sleep(1)") < markdown.index("its lock\\_timeout expired"), markdown


RELEASE_THEN_WORK = """
setup = "CREATE TABLE jobs (id int PRIMARY KEY, state text); INSERT INTO jobs VALUES (1, 'new')"
sessions = ["job", "web"]

[[step]]
name = "hold"
session = "job"
sql = "BEGIN; UPDATE jobs SET state = 'running' WHERE id = 1"

[[step]]
name = "request"
session = "web"
sql = "UPDATE jobs SET state = 'seen' WHERE id = 1"
expect = { waits_for = "job", released_by = "job" }

[[step]]
name = "commit-and-work"
session = "job"
sql = "COMMIT; SELECT pg_sleep(1)"
"""


@pytest.mark.timing
def test_a_step_that_releases_and_keeps_running_is_the_release(pgrace_run: RunScenario) -> None:
    run = pgrace_run(scenario_text(RELEASE_THEN_WORK))
    assert run.ok, [c for c in run.checks if not c.ok]
    steps = by_name(run)
    request, work = steps["request"], steps["commit-and-work"]
    assert request.finished_ms is not None and work.finished_ms is not None
    assert request.finished_ms < work.finished_ms - 500  # told at the COMMIT, not after the sleep
    assert request.release is not None and request.released_by == work.seq
