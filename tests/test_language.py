"""Scenario steps that are not SQL: a ``sleep`` in the schedule, a ``crash`` of a session."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import by_name, finished_at, launched_at, toml_scenario

from pgrace.cli import main
from pgrace.errors import ScenarioError
from pgrace.frontends.catalog import shipped_names
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.model.checks import evaluate
from pgrace.model.scenario import Scenario
from pgrace.model.timeline import Release, SessionLost, StepFinished, StepRun
from pgrace.pytest_plugin import RunScenario
from pgrace.servers import ServerInfo

SETUP = "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 10), (2, 20);"
scenario = functools.partial(toml_scenario, setup=SETUP, name="lang")


def error_of(step: StepRun) -> tuple[str, str]:
    assert step.outcome is not None and step.outcome.error is not None, step
    return step.outcome.error.severity, step.outcome.error.sqlstate


# -- sleep -----------------------------------------------------------------------------------

LOCK_TIMEOUT = """
[[step]]
session = "a"
sql = "BEGIN; UPDATE t SET v = 11 WHERE id = 1"

[[step]]
name = "impatient"
session = "b"
sql = "SET lock_timeout = '500ms'; UPDATE t SET v = 12 WHERE id = 1"

[[step]]
name = "pause"
session = "a"
sleep = "1200ms"
note = "a holds the row while b's lock_timeout runs out"

[[step]]
name = "commit"
session = "a"
sql = "COMMIT"
"""


def test_lock_timeout_fires_during_a_sleep_and_is_reported_when_it_fires(pgrace_run: RunScenario) -> None:
    run = pgrace_run(scenario(LOCK_TIMEOUT))
    steps = by_name(run)
    impatient, pause = steps["impatient"], steps["pause"]
    assert impatient.waited and error_of(impatient) == ("ERROR", "55P03")
    assert pause.sql == "sleep 1200ms" and pause.status == "ok"
    slept_from, slept_to = launched_at(run, pause.seq), finished_at(run, pause.seq)
    assert slept_to - slept_from >= 1200
    finished = [e.seq for e in run.events if isinstance(e, StepFinished)]
    assert finished == [1, impatient.seq, pause.seq, steps["commit"].seq], "reported when it ended, inside the sleep"
    ended = next(e.t for e in run.events if isinstance(e, StepFinished) and e.seq == impatient.seq)
    assert slept_from < ended < slept_to - 400, "its true time, not the sleep's end"
    assert impatient.release == Release("lock_timeout")  # the server ended the wait, not the sleep
    assert impatient.released_by is None


@pytest.mark.timing
def test_a_sleep_lets_the_deadlock_detector_pick_the_victim_the_file_pinned(pgrace_run: RunScenario) -> None:
    """b closes the cycle last, but its deadlock_timeout is the shorter: b runs the check and is the victim.

    With equal timeouts a (which waited first) would be the victim; the sleep makes the
    detector fire before the next step, so the timeline tells it there. Timing: the victim's
    backend sends its error, aborts (releasing a) and only then its ReadyForQuery; on a
    starved CPU a can finish in between, and its end is then rightly reported first.
    """
    run = pgrace_run(
        scenario(
            """
            [[step]]
            session = "a"
            sql = "BEGIN; UPDATE t SET v = 11 WHERE id = 1"
            [[step]]
            session = "b"
            sql = "BEGIN; UPDATE t SET v = 21 WHERE id = 2"
            [[step]]
            name = "a-waits"
            session = "a"
            sql = "UPDATE t SET v = 12 WHERE id = 2"
            [[step]]
            name = "b-closes-the-cycle"
            session = "b"
            sql = "UPDATE t SET v = 22 WHERE id = 1"
            [[step]]
            name = "pause"
            session = "c"
            sleep = "900ms"
            [[step]]
            name = "after"
            session = "c"
            sql = "SELECT 1"
            """,
            sessions='[{ name = "a", setup = "SET deadlock_timeout = \\"5s\\"" }, '
            '{ name = "b", setup = "SET deadlock_timeout = \\"300ms\\"" }, "c"]',
        ),
        step_timeout=10,
    )
    steps = by_name(run)
    assert error_of(steps["b-closes-the-cycle"]) == ("ERROR", "40P01")
    assert steps["a-waits"].status == "ok"
    finished = [e.seq for e in run.events if isinstance(e, StepFinished)]
    a_waits, b_closes, pause = steps["a-waits"].seq, steps["b-closes-the-cycle"].seq, steps["pause"].seq
    assert finished[2:] == [b_closes, a_waits, pause, steps["after"].seq], (
        "both ended during the sleep, the victim first"
    )


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ('sleep = "soon"', "sleep is a duration from 1ms to 60s"),
        ('sleep = "2m"', "sleep is a duration"),
        ('sleep = "61s"', "sleep is a duration"),
        ("sleep = 3", "sleep is a duration"),
        ('sleep = "1s"\nsql = "SELECT 1"', "a step does one thing: it has sql and sleep"),
        ('sleep = "1s"\ncapture = "x"', "a sleep step sends no SQL: it has no capture"),
        ('crash = "explode"', 'crash is "terminate" (its backend killed) or "disconnect"'),
        ('crash = "terminate"\nexpect = { waits = false }', "a crash step sends no SQL: it has no expect"),
    ],
)
def test_bad_action_steps_name_their_line(step: str, message: str) -> None:
    text = f'sessions = ["a"]\n[[step]]\nsession = "a"\nsql = "SELECT 1"\n\n[[step]]\nsession = "a"\n{step}\n'
    with pytest.raises(ScenarioError) as info:
        parse_toml_scenario(text, "lang.toml")
    assert str(info.value).startswith("lang.toml:"), str(info.value)
    assert info.value.line is not None and info.value.line >= 6, str(info.value)
    assert message in info.value.message


def test_a_sleep_override_in_the_other_variant() -> None:
    parsed = scenario(LOCK_TIMEOUT + '\n[fix.step.pause]\nsleep = "50ms"\n')
    fix = parsed.variant_named("fix")
    assert fix.step("pause").sleep == 0.05 and fix.step("pause").sql == "sleep 50ms"
    with pytest.raises(ScenarioError, match="is a sleep step: it cannot change its sql"):
        scenario(LOCK_TIMEOUT + '\n[fix.step.pause]\nsql = "SELECT 1"\n')


# -- crash -----------------------------------------------------------------------------------

CRASH = """
[[step]]
name = "claim"
session = "a"
sql = "BEGIN; UPDATE t SET v = 11 WHERE id = 1"

[[step]]
name = "waits"
session = "b"
sql = "UPDATE t SET v = 12 WHERE id = 1 RETURNING v"
expect = {{ waits = true }}

[[step]]
name = "dies"
session = "a"
crash = "{how}"

[[step]]
name = "later"
session = "a"
sql = "COMMIT"

[[check]]
description = "a's update died with its transaction; b's stands"
sql = "SELECT v FROM t WHERE id = 1"
rows = [[12]]
"""


@pytest.mark.parametrize(
    ("how", "sqlstate", "message", "shown"),
    [
        ("terminate", "57P01", "terminating connection due to administrator command", "crash: backend terminated"),
        ("disconnect", "08006", "connection closed by pgrace (crash)", "crash: connection closed"),
    ],
)
def test_a_crashed_session_is_lost_and_its_locks_go_with_it(
    pgrace_run: RunScenario, how: str, sqlstate: str, message: str, shown: str
) -> None:
    run = pgrace_run(scenario(CRASH.format(how=how)))
    steps = by_name(run)
    dies = steps["dies"]
    assert dies.sql == shown and dies.status == "ok"
    assert [(e.session, e.during_seq, e.sqlstate, e.message) for e in run.sessions_lost()] == [
        ("a", dies.seq, sqlstate, message)
    ]
    assert steps["waits"].status == "ok" and steps["waits"].released_by == dies.seq
    assert error_of(steps["later"]) == ("ERROR", "08003"), "a later step of a crashed session is not sent"
    assert all(r.ok for r in evaluate(run)), [r for r in evaluate(run) if not r.ok]
    lost = [i for i, e in enumerate(run.events) if isinstance(e, SessionLost)]
    finished = next(i for i, e in enumerate(run.events) if isinstance(e, StepFinished) and e.seq == dies.seq)
    assert lost == [finished + 1], "the loss is recorded right after the crash step"


# -- pgrace check without a path -------------------------------------------------------------


@pytest.mark.thorough  # every shipped scenario again: test_check runs them every day, by name
def test_check_without_a_path_runs_the_shipped_scenarios_when_there_is_no_scenarios_folder(
    pgrace_server: ServerInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["check", "--quiet", "--dsn", pgrace_server.dsn])
    assert result.exit_code == 0, result.output
    cases = sum(len(parse_scenario(name).variants) for name in shipped_names())
    assert result.output.endswith(f"{cases} checks: {cases} passed, 0 failed\n")


def parse_scenario(name: str) -> Scenario:
    from pgrace.frontends.catalog import read_scenario

    return read_scenario(name)


HEAD = """sessions = ["a", "b"]
[params]
level = { default = "SERIALIZABLE", choices = ["SERIALIZABLE", "READ COMMITTED"] }

[[step]]
session = "a"
"""


@pytest.mark.parametrize(
    ("step", "args", "message"),
    [
        ('sleep = "soon"', [], "lang.toml:7: sleep is a duration"),
        ('crash = "explode"', [], 'lang.toml:7: crash is "terminate"'),
        ('sql = "SELECT :b.nope"', [], "lang.toml:7: step 'a-1' uses :b.nope, but no step of session 'b' captures"),
        ('sql = "BEGIN ISOLATION LEVEL :level"', ["-p", "level=chaos"], "lang.toml: param 'level' must be one of"),
    ],
)
def test_bad_language_input_is_one_line_and_exit_2(tmp_path: Path, step: str, args: list[str], message: str) -> None:
    (tmp_path / "lang.toml").write_text(HEAD + step + "\n")
    result = CliRunner().invoke(main, ["run", str(tmp_path / "lang.toml"), "--dsn", "host=/nonexistent", *args])
    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("pgrace: ") and message in line.replace(str(tmp_path) + "/", ""), line
