"""Progress of long work: one line on a terminal's stderr, redrawn in place; nothing off a terminal.

The renderer is tested on a fake clock and a stream that says it is a terminal; the
commands, on the real server, with their stderr a terminal or not.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pgrace.cli import main
from pgrace.cli.terminal import progress as progress_module
from pgrace.cli.terminal.progress import CLEAR, Progress, duration
from pgrace.servers import ServerInfo

FANOUT = Path(__file__).resolve().parents[1] / "scenarios" / "skip-locked-fanout.toml"


class Terminal(io.StringIO):
    """What a terminal on stderr would have received."""

    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_done_total_rate_and_time_left_are_redrawn_in_place_and_cleared_at_the_end() -> None:
    terminal, clock = Terminal(), Clock()
    with Progress(terminal, clock=clock, width=120) as progress:
        progress.start("lost-update (bug)", 1000, "interleavings")
        clock.now += 2
        progress.update(100)
        clock.now += 0.05
        progress.update(110)  # within the redraw interval: not drawn
        clock.now += 1.95
        progress.update(400, "3 outcome classes")
        clock.now += 6
        progress.update(1000)
    assert terminal.getvalue().split(CLEAR) == [
        "",
        "lost-update (bug): 0/1,000 interleavings",
        "lost-update (bug): 100/1,000 interleavings · 50.0/s · 18 s left",
        "lost-update (bug): 400/1,000 interleavings · 100/s · 6 s left · 3 outcome classes",
        "lost-update (bug): 1,000/1,000 interleavings · 100/s",
        "",  # cleared: the terminal is as it was
    ]
    assert "\n" not in terminal.getvalue()


def test_a_note_stays_above_the_line_which_is_drawn_again() -> None:
    terminal = Terminal()
    progress = Progress(terminal, clock=Clock(), width=80)
    progress.start("load lost-update", 4, "client counts")
    progress.note("lost-update bug: 1 clients, 900.0 tps")
    assert terminal.getvalue() == (
        f"{CLEAR}load lost-update: 0/4 client counts{CLEAR}lost-update bug: 1 clients, 900.0 tps\n"
        f"{CLEAR}load lost-update: 0/4 client counts"
    )


def test_the_line_never_wraps_and_shows_no_control_character() -> None:
    terminal = Terminal()
    progress = Progress(terminal, clock=Clock(), width=30)
    progress.start("a\x1b[31mred name that goes on and on", 5, "cases")
    [drawn] = terminal.getvalue().split(CLEAR)[1:]
    assert len(drawn) == 29 and "\x1b" not in drawn


def test_off_a_terminal_nothing_but_notes_is_written() -> None:
    log = io.StringIO()
    progress = Progress(log, clock=Clock())
    progress.start("sweep", 3, "combinations")
    progress.update(1)
    progress.update(3)
    progress.close()
    assert log.getvalue() == ""
    progress.note("pgrace: 1,000 combinations to run")
    assert log.getvalue() == "pgrace: 1,000 combinations to run\n"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.2, "1 s"), (44.1, "45 s"), (60, "1 min"), (61, "2 min"), (3600, "1 h"), (12000, "3 h 20 min")],
)
def test_time_left_reads_as_a_person_would_say_it(seconds: float, text: str) -> None:
    assert duration(seconds) == text


# -- the commands -----------------------------------------------------------------------------


def _commands(server: ServerInfo) -> list[list[str]]:
    dsn = ["--dsn", server.dsn]
    return [
        ["explore", "lost-update", *dsn],
        ["explore", "lost-update", "-j", "2", *dsn],
        ["sweep", "skip-locked-fanout", "-p", "workers=3,4", "--fix", "--explore", "--max", "5", *dsn],
        ["check", "--explore", str(FANOUT), "--max", "5", *dsn],
        ["load", "lost-update", "-c", "1,2", "-t", "20", *dsn],
    ]


@pytest.mark.parametrize("which", range(5), ids=["explore", "explore-j2", "sweep", "check", "load"])
def test_off_a_terminal_stderr_has_nothing_extra(pgrace_server: ServerInfo, which: int) -> None:
    result = CliRunner().invoke(main, _commands(pgrace_server)[which])
    assert result.exit_code in (0, 1), result.output
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("which", "last"),
    [
        (0, "lost-update (bug): 6/6 runs"),  # reduced: the runs known so far, the total at the end
        (1, "lost-update (bug): 25/25 runs"),  # -j 2 reduced: the workers' runs in all, as they count them
        (2, "sweep: 2/2 combinations"),
        (3, "check: 2/2 cases"),
        (4, "load lost-update: 2/2 client counts"),
    ],
    ids=["explore", "explore-j2", "sweep", "check", "load"],
)
def test_on_a_terminal_progress_is_drawn_on_stderr_and_stdout_is_unchanged(
    pgrace_server: ServerInfo, monkeypatch: pytest.MonkeyPatch, which: int, last: str
) -> None:
    args = _commands(pgrace_server)[which]
    plain = CliRunner().invoke(main, [*args, "-f", "json"] if which != 3 else args)
    terminal = Terminal()
    monkeypatch.setattr(progress_module, "Progress", lambda stream: Progress(terminal, width=200))
    shown = CliRunner().invoke(main, [*args, "-f", "json"] if which != 3 else args)
    assert shown.exit_code == plain.exit_code, shown.output
    if which != 3:  # the JSON is the same, and nothing of the progress reached it
        assert _without_timings(json.loads(shown.stdout)) == _without_timings(json.loads(plain.stdout))
    else:
        assert shown.stdout.count("PASS") == plain.stdout.count("PASS") and CLEAR not in shown.stdout
    drawn = terminal.getvalue().split(CLEAR)
    assert drawn[-1] == ""  # cleared at the end
    assert [line for line in drawn if line.startswith(last.split(":")[0])][-1].startswith(last)
    assert shown.stderr == ""


def _without_timings(data: object) -> object:
    """Load's measured figures differ from run to run: compare what was run, not what it measured."""
    if isinstance(data, dict):
        measured = {"tps", "latency_ms", "lock_waiters_max", "failures", "retries", "violations", "transactions"}
        return {k: _without_timings(v) for k, v in data.items() if k not in measured}
    if isinstance(data, list):
        return [_without_timings(v) for v in data]
    return data
