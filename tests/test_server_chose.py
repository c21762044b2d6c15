"""One COMMIT or ROLLBACK wakes two waiters and the server, not the scenario, chooses which goes first.

The overtaken waiter waits for the winner now: pgrace sees it (the observer's reading of
``pg_locks``), holds that session's steps back while the others go on, and says on the
timeline that the server chose. A golden timeline stops where the server chose, so it
compares equal whichever waiter went first. A short step timeout makes a regression
fail in seconds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner
from documentation import page
from fix_recorded import Recorded
from helpers import by_name

from pgrace import api
from pgrace.cli import main
from pgrace.drivers.check import GOLDEN_STYLE
from pgrace.engine.options import RunOptions
from pgrace.frontends import catalog
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.model.timeline import Run, ServerChose, StepCancelled, StepLaunched
from pgrace.render.json import render_json
from pgrace.render.markdown import render_markdown
from pgrace.render.mermaid import render_mermaid
from pgrace.render.svg import render_svg
from pgrace.render.text import Style, render_text
from pgrace.servers import ServerInfo

QUEUE = Path(__file__).resolve().parent / "recorded" / "server-chose.toml"
FAST = RunOptions(step_timeout=2.0)  # a regression is a cancel at the step timeout: fail in seconds

# Workers 2 and 3 wait for worker 1's transaction on two different rows; when it commits,
# both wake and race for job 3: the server (its scheduling of two woken backends) decides.
RACE = """
name = "two-waiters-race"
title = "One COMMIT wakes two waiters that race for the next job"
setup = '''
CREATE TABLE jobs (id int PRIMARY KEY, status text NOT NULL, claimed_by text);
INSERT INTO jobs SELECT g, 'queued', NULL FROM generate_series(1, 5) AS g;
'''
sessions = ["worker1", "worker2", "worker3"]

[[step]]
session = "worker1"
sql = "BEGIN"
[[step]]
session = "worker1"
sql = "SELECT id FROM jobs WHERE status = 'queued' ORDER BY id LIMIT 2 FOR UPDATE"
[[step]]
session = "worker1"
sql = "UPDATE jobs SET status = 'running', claimed_by = 'worker1' WHERE id IN (1, 2)"
[[step]]
session = "worker2"
sql = "BEGIN"
[[step]]
name = "claim2"
session = "worker2"
sql = "SELECT id FROM jobs WHERE status = 'queued' ORDER BY id LIMIT 1 FOR UPDATE"
capture = { job = "id" }
[[step]]
session = "worker3"
sql = "BEGIN"
[[step]]
name = "claim3"
session = "worker3"
sql = "SELECT id FROM jobs WHERE status = 'queued' AND id >= 2 ORDER BY id LIMIT 1 FOR UPDATE"
capture = { job = "id" }
[[step]]
name = "commit1"
session = "worker1"
sql = "COMMIT"
[[step]]
session = "worker2"
sql = "UPDATE jobs SET status = 'running', claimed_by = 'worker2' WHERE id = :job"
[[step]]
session = "worker2"
sql = "COMMIT"
[[step]]
session = "worker3"
sql = "UPDATE jobs SET status = 'running', claimed_by = 'worker3' WHERE id = :job"
[[step]]
session = "worker3"
sql = "COMMIT"

[[check]]
description = "jobs 3 and 4 ran, one per worker"
sql = "SELECT string_agg(claimed_by, ',' ORDER BY claimed_by) AS workers FROM jobs WHERE id IN (3, 4)"
rows = [["worker2,worker3"]]
"""


def choices(run: Run) -> list[ServerChose]:
    return [e for e in run.events if isinstance(e, ServerChose)]


def launch_order(run: Run) -> list[str]:
    return [e.step for e in run.events if isinstance(e, StepLaunched)]


def test_a_rollback_that_wakes_two_waiters_goes_on_when_the_server_lets_the_other_go_first(
    pgrace_server: ServerInfo,
) -> None:
    """Worker 3 queued first on job 1, so it takes the job back; the file's next step is worker 2's,
    whose claim now waits for worker 3: held back, not cancelled at the step timeout.

    The server's choice is its lock queue's, every time: the first waiter takes the row before
    it lets the second look at it (a COMMIT that moved the job on would leave both to race for
    the next row, which a loaded machine decides either way)."""
    run = api.run(catalog.read_scenario(str(QUEUE)), server=pgrace_server, options=FAST)
    steps = by_name(run)
    assert not any(isinstance(e, StepCancelled) for e in run.events)
    assert run.ok, [c for c in run.checks if not c.ok]
    [chose] = choices(run)
    assert (chose.seq, chose.winner, chose.winner_seq, chose.released_by) == (
        steps["claim2"].seq,
        "worker3",
        steps["claim3"].seq,
        steps["rollback1"].seq,
    )
    assert any("worker3" in w.blocked_by for w in chose.waits)
    assert steps["claim2"].released_by == steps["commit3"].seq  # the winner's COMMIT freed it
    order = launch_order(run)
    assert order.index("commit3") < order.index("run2")  # worker 2's steps waited for their claim


def test_the_server_choosing_the_files_order_is_said_as_well(pgrace_server: ServerInfo) -> None:
    """Worker 2 queued first: it goes first as the file expects, and the timeline still says the server chose."""
    text = QUEUE.read_text(encoding="utf-8")
    claim3 = text.index('[[step]]\nsession = "worker3"\nsql = "BEGIN"')
    claim2 = text.index('[[step]]\nsession = "worker2"\nsql = "BEGIN"')
    run1 = text.index('[[step]]\nname = "run1"')
    swapped = text[:claim3] + text[claim2:run1] + text[claim3:claim2] + text[run1:]
    swapped = swapped.replace('waits_for = "worker1", rows = [[1]]', 'waits_for = "worker2", rows = [[2]]')
    swapped = swapped.replace('waits_for = "worker3", rows = [[2]]', 'waits_for = "worker1", rows = [[1]]')
    swapped = swapped.replace('[[1, "worker3"], [2, "worker2"]]', '[[1, "worker2"], [2, "worker3"]]')
    run = api.run(parse_toml_scenario(swapped, "swapped.toml"), server=pgrace_server, options=FAST)
    steps = by_name(run)
    assert run.ok, [c for c in run.checks if not c.ok]
    [chose] = choices(run)
    assert (chose.seq, chose.winner, chose.winner_seq) == (steps["claim3"].seq, "worker2", steps["claim2"].seq)
    assert launch_order(run)[-4:] == ["run2", "commit2", "run3", "commit3"]  # the file's order: nothing held back


def test_a_golden_timeline_compares_equal_whichever_waiter_the_server_lets_go_first(
    pgrace_server: ServerInfo, tmp_path: Path
) -> None:
    """A real race, run until the server has chosen each waiter at least once (bounded)."""
    scenario = parse_toml_scenario(RACE, "two-waiters-race.toml")
    winners: dict[str, str] = {}  # winner -> the whole timeline
    golden: set[str] = set()
    for _ in range(40):
        run = api.run(scenario, server=pgrace_server, options=FAST)
        assert run.ok and not any(isinstance(e, StepCancelled) for e in run.events)
        [chose] = choices(run)
        assert chose.released_by == by_name(run)["commit1"].seq
        winners[chose.winner] = render_text(run)
        golden.add(render_text(run, GOLDEN_STYLE))
        if len(winners) == 2:
            break
    assert sorted(winners) == ["worker2", "worker3"], "the server chose one waiter in 40 runs"
    assert winners["worker2"] != winners["worker3"]  # the timelines differ after the COMMIT ...
    [text] = golden  # ... the golden one stops there
    assert "⇄ the server chose the order after step 8: worker1's COMMIT woke worker2 and worker3 together" in text
    # and pgrace check --golden passes on a golden timeline written in either order
    path = tmp_path / "two-waiters-race.toml"
    path.write_text(RACE, encoding="utf-8")
    check = ["check", "--dsn", pgrace_server.dsn, "--golden", "--step-timeout", "2", str(path)]
    assert CliRunner().invoke(main, [*check, "--update"]).exit_code == 0
    assert (tmp_path / "two-waiters-race.bug.out").read_text(encoding="utf-8") == text
    for _ in range(3):
        result = CliRunner().invoke(main, check)
        assert result.exit_code == 0, result.output


def test_the_guides_example_is_the_recorded_runs_timeline(recorded: Recorded) -> None:
    example = re.search(
        r"## When the server chooses\n.*?```text\n(.*?)```", page("guide/waits-and-locks.md"), re.DOTALL
    )
    assert example is not None
    drawn = "\n".join(line.rstrip() for line in render_text(recorded("server-chose", "bug")).splitlines())
    assert example[1] in drawn + "\n"


def test_every_format_says_the_server_chose(recorded: Recorded) -> None:
    run = recorded("server-chose", "bug")
    words = (
        "⇄ the server chose: worker3's step 4 went first after worker1's ROLLBACK (step 8); step 6 now waits for"
        " worker3"
    )
    assert " ".join(render_text(run, Style(width=400)).split()).count(words) == 1
    assert words in render_markdown(run)
    assert words.replace(";", "#59;") in render_mermaid(run).replace("<br/>", " ")
    assert "⇄ the server chose: worker3's" in render_svg(run)
    claim2 = next(s for s in json.loads(render_json(run))["steps"] if s["name"] == "claim2")
    [chose] = claim2["server_chose"]
    assert (chose["went_first"], chose["session"], chose["woken_by"]) == (4, "worker3", 8)
    assert chose["waits_on"][0]["blocked_by"] == ["worker3"]
    golden = render_text(run, GOLDEN_STYLE)
    assert (
        "\n8    ROLLBACK\n     → ROLLBACK\n⇄ the server chose the order after step 8: worker1's ROLLBACK woke" in golden
    )
    assert not re.search(r"^9 ", golden, re.MULTILINE) and "↳" not in golden  # the rest is the server's choice
