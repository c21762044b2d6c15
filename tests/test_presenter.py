"""Presenter mode as an audience sees it: the story, each note, a blocked step and its
growing wait time, and the closing summary; in plain text off a terminal, and for real
inside tmux (which is what ssh gives a speaker) with Enter pressed between steps.
"""

from __future__ import annotations

import io
import itertools
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pgrace.cli.terminal.presenter import Presenter, bound_values
from pgrace.engine.options import RunOptions
from pgrace.frontends import catalog
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.pytest_plugin import RunScenario
from pgrace.render.text import Style
from pgrace.servers import ServerInfo

PGRACE = str(Path(sys.executable).with_name("pgrace"))


class FakeClock:
    """Presenter time under the test's control: the wait counter must grow with it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def present(
    pgrace_run: RunScenario,
    name: str,
    variant: str | None = None,
    *,
    tty: bool = False,
    width: int = 100,
    **kwargs: object,
) -> tuple[str, Presenter]:
    loaded = catalog.read_scenario(name)
    scenario = loaded.variant_named(variant)
    out = io.StringIO()
    presenter = Presenter(
        scenario,
        Style(colour=tty, width=width),
        step_by_step=True,
        out=out,
        keys=io.StringIO("\n" * 50),
        tty=tty,
        counterpart=loaded.other if scenario is loaded else loaded,
        **kwargs,  # type: ignore[arg-type]
    )
    with presenter:
        run = pgrace_run(
            scenario,
            options=RunOptions(
                before_step=presenter.before_step, on_event=presenter.on_event, on_idle=presenter.on_idle
            ),
        )
        presenter.finish(run)
    return out.getvalue(), presenter


def test_plain_presenter_tells_the_story_the_notes_the_wait_and_the_cure(pgrace_run: RunScenario) -> None:
    text, _ = present(pgrace_run, "head-of-line-blocking", width=200)
    assert "\x1b" not in text and "\r" not in text, "off a terminal the output is plain text"
    assert text.index("HEAD-OF-LINE-BLOCKING  ·  bug") < text.index("Two workers take jobs from the same queue")
    assert "» worker 1 claims job 1" in text and "» only now can worker 2 start job 2" in text
    assert "[▶ next: step 4 (worker2): Enter runs it, q quits]" in text
    blocked = text.index("⏳ waits for worker1 on row jobs id=1")
    assert blocked < text.index("▶ 5")
    assert "with :job = 1" in text  # the value the runner bound for :job
    assert "↳ step 4 resumes after worker1's COMMIT (step 6); waited" in " ".join(text.split())
    summary = text[text.index("━━ What went wrong") :]
    assert "✔ all 6 expectations held" in summary
    assert "worker2's claim2 (step 4) waits for worker1 on jobs id=1" in summary
    assert "How the cure fixes it: pgrace run head-of-line-blocking --fix" in summary
    assert "With SKIP LOCKED a worker passes over rows" in summary


def test_the_fix_variant_ends_with_what_the_cure_did_and_the_bug_it_avoids(pgrace_run: RunScenario) -> None:
    text, _ = present(pgrace_run, "nowait", "fix")
    assert "━━ What the cure did" in text and "no step waited and none failed" in text
    assert "Without the cure: pgrace run nowait --bug" in text
    assert "fails at once with SQLSTATE 55P03" in text.replace("\n  ", " ")


def test_an_error_is_shown_with_its_sqlstate(pgrace_run: RunScenario) -> None:
    text, _ = present(pgrace_run, "nowait", "bug", width=200)
    lines = [line.strip() for line in text.splitlines()]
    assert '✗ ERROR 55P03: could not obtain lock on row in relation "jobs"' in lines
    assert 'worker2\'s claim2 (step 4) failed with 55P03: could not obtain lock on row in relation "jobs"' in " ".join(
        lines
    )


def test_status_line_counts_the_wait_on_a_terminal(pgrace_run: RunScenario) -> None:
    clock = FakeClock()
    scenario = catalog.read_scenario("lost-update").variant_named("fix")
    out = io.StringIO()
    presenter = Presenter(scenario, Style(colour=False, width=100), pace=0.0001, out=out, tty=True, clock=clock)
    seen: list[str] = []

    def before_step(step: object) -> None:
        clock.now += 1.5  # the speaker talks for a while before each step
        presenter.before_step(step)  # type: ignore[arg-type]
        seen.append(presenter.status_text())

    with presenter:
        run = pgrace_run(scenario, options=RunOptions(before_step=before_step, on_event=presenter.on_event))
        presenter.finish(run)
    waiting = [s for s in seen if s.startswith("⏳ bob waiting")]
    assert waiting, seen
    seconds = [float(re.search(r"waiting\s+([\d.]+) s", s)[1]) for s in waiting]  # type: ignore[index]
    assert seconds == sorted(seconds) and seconds[-1] > seconds[0], "the counter should grow"
    assert "waits for alice on accounts id=1" in waiting[0]
    output = out.getvalue()
    assert "\r\x1b[2K⏳ bob waiting" in output, "redrawn in place, on the last line"
    assert "bob sat blocked for 3.0 s of this talk" in output


def test_on_idle_ticks_about_every_100_ms_and_the_wait_counter_follows(pgrace_run: RunScenario) -> None:
    body = """
    setup = "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 1);"
    sessions = ["a", "b"]
    [[step]]
    session = "a"
    sql = "BEGIN; UPDATE t SET v = 2 WHERE id = 1"
    [[step]]
    name = "stuck"
    session = "b"
    sql = "UPDATE t SET v = 3 WHERE id = 1"
    [[step]]
    session = "b"
    sql = "SELECT 1"
    [[step]]
    session = "a"
    sql = "COMMIT"
    """
    stuck = parse_toml_scenario(textwrap.dedent(body), "stuck.toml")
    out = io.StringIO()
    presenter = Presenter(stuck, Style(width=100), pace=0.001, out=out, tty=True)
    ticks: list[float] = []

    def idle() -> None:
        ticks.append(time.perf_counter())
        presenter.on_idle()

    with presenter:  # "SELECT 1" must wait for b's stuck step: the runner waits until the timeout
        options = RunOptions(
            step_timeout=0.6, before_step=presenter.before_step, on_event=presenter.on_event, on_idle=idle
        )
        run = pgrace_run(stuck, options=options)
    assert [s.status for s in run.step_runs()][1] == "cancelled"
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert 4 <= len(ticks) <= 9, ticks
    assert min(gaps) >= 0.099, gaps
    shown = [float(s) for s in re.findall(r"⏳ b waiting\s+([\d.]+) s", out.getvalue())]
    assert len(set(shown)) >= 4 and shown == sorted(shown), shown


def test_bound_values_name_what_the_runner_substituted() -> None:
    assert bound_values("UPDATE t SET v = :v WHERE id = :id", "UPDATE t SET v = 'x' WHERE id = 2") == (
        "with :v = 'x', :id = 2"
    )
    assert bound_values("SELECT :a, :a", "SELECT 1, 1") == "with :a = 1"
    assert bound_values("SELECT 1", "SELECT 2") == "sent: SELECT 2"


# -- for real, in tmux ---------------------------------------------------------------------


class Tmux:
    """A private tmux server (its own socket) running one pgrace command in a fixed-size pane."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket

    def __call__(self, *args: str) -> str:
        result = subprocess.run(
            ["tmux", "-S", str(self.socket), *args], capture_output=True, text=True, timeout=10, check=True
        )
        return result.stdout

    def start(self, command: str) -> None:
        shell = (
            f"{command}; echo PGRACE-EXIT=$?; stty -a | tr ' ' '\\n' | grep -x -- '-*icanon'; echo PGRACE-DONE;"
            " tail -f /dev/null"
        )
        self("new-session", "-d", "-s", "talk", "-x", "110", "-y", "50", shell)

    def screen(self) -> str:
        return self("capture-pane", "-p", "-J", "-S", "-", "-t", "talk")

    def wait_for(self, predicate: Callable[[str], bool], what: str, timeout: float = 20.0) -> str:
        """Poll the pane until ``predicate`` holds: this is a person watching the screen."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if predicate(screen):
                return screen
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}; the pane shows:\n{screen}")
            time.sleep(0.05)


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (Debian: apt-get install tmux); presenter mode is not tested in a terminal")
    session = Tmux(tmp_path / "tmux.sock")
    yield session
    subprocess.run(["tmux", "-S", str(session.socket), "kill-server"], capture_output=True, timeout=10, check=False)


def waited(screen: str) -> float:
    """The wait time the status line shows now (0 when it shows none)."""
    return max((float(s) for s in re.findall(r"worker2 waiting\s+([\d.]+) s", screen)), default=0.0)


def showing(text: str) -> Callable[[str], bool]:
    return lambda screen: text in screen


def waited_more_than(seconds: float) -> Callable[[str], bool]:
    return lambda screen: waited(screen) >= seconds


def pgrace_command(server: ServerInfo, *args: str) -> str:
    # pytest's environment pins COLUMNS=80: let pgrace ask the pane for its size, as on a real terminal
    return shlex.join(["env", "-u", "COLUMNS", "-u", "LINES", f"PGRACE_DSN={server.dsn}", PGRACE, "run", *args])


def test_step_mode_in_tmux_runs_a_step_per_enter_and_counts_the_wait(tmux: Tmux, pgrace_server: ServerInfo) -> None:
    tmux.start(pgrace_command(pgrace_server, "head-of-line-blocking", "--step", "--color"))
    for step in range(1, 9):
        screen = tmux.wait_for(showing(f"▶ next: step {step} ("), f"the prompt for step {step}")
        if step == 5:  # worker 2 is blocked: the counter must keep growing while we wait
            assert "⏳ worker2 waiting" in screen, screen
            first = waited(screen)
            tmux.wait_for(waited_more_than(first + 0.3), "the wait counter to grow")
        tmux("send-keys", "-t", "talk", "Enter")
    screen = tmux.wait_for(lambda s: "PGRACE-DONE" in s, "pgrace to exit")
    assert "PGRACE-EXIT=0" in screen
    assert "⏳ waits for worker1 on row jobs id=1" in screen
    assert "↳ step 4 resumes after worker1's COMMIT (step 6); waited" in " ".join(screen.split())
    assert "━━ What went wrong" in screen and "✔ all 6 expectations held" in screen
    assert "How the cure fixes it: pgrace run head-of-line-blocking --fix" in screen
    assert re.search(r"^icanon$", screen, re.MULTILINE), "the terminal's line mode was not restored"


def test_pace_mode_in_tmux_plays_the_run_by_itself(tmux: Tmux, pgrace_server: ServerInfo) -> None:
    tmux.start(pgrace_command(pgrace_server, "lost-update", "--fix", "--pace", "0.05"))
    screen = tmux.wait_for(lambda s: "PGRACE-DONE" in s, "pgrace to exit")
    assert "PGRACE-EXIT=0" in screen
    assert "waits for alice on row accounts id=1" in screen and "→ balance=400" in screen
    assert "━━ What the cure did" in screen


def test_q_stops_presenting_and_the_run_ends_as_it_would_have(tmux: Tmux, pgrace_server: ServerInfo) -> None:
    """q is the presenter's choice, not an interrupt: the rest plays at once, and the exit is the run's own."""
    tmux.start(pgrace_command(pgrace_server, "nowait", "--step"))
    tmux.wait_for(lambda s: "▶ next: step 1 (" in s, "the first prompt")
    tmux("send-keys", "-t", "talk", "q")
    screen = tmux.wait_for(lambda s: "PGRACE-DONE" in s, "pgrace to exit")
    assert "(q: the rest of the run plays without stopping)" in screen
    assert "PGRACE-EXIT=0" in screen and "interrupted" not in screen
    assert "expectations held" in screen and "▶ next: step 2 (" not in screen
    assert re.search(r"^icanon$", screen, re.MULTILINE)
