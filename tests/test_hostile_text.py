"""Scenario text and server text never act on the medium they are written to.

``hostile/hostile.toml`` carries ESC[2J, an OSC window title ended by BEL, other C0 and C1
characters, a bidi override, ``<script>``, ``]]>``, ``-->``, Markdown pipes and backticks in
its title, narrative, note, SQL and check; its steps make the server send the same in an
error message, a NOTICE, a NOTIFY payload and a value. Every format is rendered from one
run of it, and through the CLI.
"""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner
from fix_recorded import Recorded

from pgrace.cli import main
from pgrace.cli.terminal.presenter import Presenter
from pgrace.engine.options import RunOptions
from pgrace.frontends import catalog
from pgrace.model.timeline import NoticeReceived, NotifyReceived, Run, StepFinished
from pgrace.pytest_plugin import RunScenario
from pgrace.render.compare import render_text_compare
from pgrace.render.html import render_html, render_html_compare
from pgrace.render.isolation import render_isolation
from pgrace.render.json import render_json
from pgrace.render.markdown import render_markdown, render_markdown_compare
from pgrace.render.mermaid import render_mermaid
from pgrace.render.svg import render_svg, render_svg_compare
from pgrace.render.text import Style, render_text
from pgrace.servers import ServerInfo
from pgrace.text import visible, without_controls

HOSTILE = Path(__file__).parent / "hostile" / "hostile.toml"

#: What must never reach an output raw: C0 but tab and newline, DEL, C1, bidi controls.
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
SGR = re.compile(r"\x1b\[[0-9;]*m")


def assert_no_raw_control(text: str, *, own: re.Pattern[str] | None = None) -> None:
    """``own``: pgrace's own escape sequences (colours), removed before looking."""
    rest = own.sub("", text) if own is not None else text
    found = RAW_CONTROL.search(rest)
    assert found is None, (found.group(0), rest[max(0, found.start() - 60) : found.end() + 20])


@pytest.fixture
def hostile_runs(recorded: Recorded) -> tuple[Run, Run]:
    """The bug and the fix variant of the hostile scenario as recorded (tests/recorded/): what each format draws of it."""
    return recorded("hostile", "bug"), recorded("hostile", "fix")


def test_the_server_really_sent_hostile_text(pgrace_server: ServerInfo) -> None:
    """The record keeps the server's text as it came; only the outputs change it."""
    from pgrace import api

    run = api.run(catalog.read_scenario(str(HOSTILE)), server=pgrace_server)
    events = run.events
    errors = [e.outcome.error.message for e in events if isinstance(e, StepFinished) and e.outcome.error]
    assert any("\x1b]0;pwned-error\x07" in m for m in errors)
    assert any("\x1b]0;pwned-notice\x07" in e.message for e in events if isinstance(e, NoticeReceived))
    assert any("\x1b]0;pwned-payload\x07" in e.payload for e in events if isinstance(e, NotifyReceived))
    data = json.loads(render_json(run))
    assert any("\x1b]0;pwned-error\x07" in s for s in strings(data))  # JSON carries it escaped; it decodes back


def strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [*strings(k), *strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def test_terminal_text_shows_control_characters_and_keeps_its_own_colours(hostile_runs: tuple[Run, Run]) -> None:
    run = hostile_runs[0]
    plain = render_text(run, Style(colour=False))
    assert_no_raw_control(plain)
    assert "␛]0;pwned-error␇" in plain and "␛]0;pwned-notice␇" in plain and "␛]0;pwned-payload␇" in plain
    assert "␛[2J" in plain and "\\u202eevil" in plain
    coloured = render_text(run, Style(colour=True))
    assert SGR.search(coloured) is not None  # colour is on ...
    assert_no_raw_control(coloured, own=SGR)  # ... and pgrace's SGR codes are the only escapes
    compared = render_text_compare(list(hostile_runs), Style(colour=True))
    assert_no_raw_control(compared, own=SGR)


def test_json_escapes_every_control_character_and_keeps_the_data(hostile_runs: tuple[Run, Run]) -> None:
    text = render_json(hostile_runs[0])
    assert_no_raw_control(text)
    assert "pwned-error" in text
    assert "\x85" in json.loads(text)["title"]  # C1, escaped, decodes back


def test_html_escapes_markup_and_control_characters(hostile_runs: tuple[Run, Run]) -> None:
    for page in (render_html(hostile_runs[0]), render_html_compare(list(hostile_runs))):
        assert_no_raw_control(page)
        assert "<script" not in page.lower()
        assert "&lt;script&gt;alert(6)" in page  # the server's error text, shown as text


def test_svg_is_well_formed_xml(hostile_runs: tuple[Run, Run]) -> None:
    for svg in (render_svg(hostile_runs[0]), render_svg_compare(list(hostile_runs))):
        assert_no_raw_control(svg)
        ET.fromstring(svg.split("\n", 1)[1])  # raises on ill-formed XML
        assert "<script" not in svg.lower()


def test_mermaid_has_no_markup_and_no_control_characters(hostile_runs: tuple[Run, Run]) -> None:
    text = render_mermaid(hostile_runs[0])
    assert_no_raw_control(text)
    assert "<script" not in text.lower() and "</script" not in text.lower()


def test_markdown_shows_markup_as_text(hostile_runs: tuple[Run, Run]) -> None:
    for text in (render_markdown(hostile_runs[0]), render_markdown_compare(list(hostile_runs))):
        assert_no_raw_control(text)
        outside_code = re.sub(r"``.*?``|`[^`]*`", "", text.replace("\\`", ""))
        assert re.search(r"(?<!\\)<script", outside_code) is None  # "\<" is Markdown's literal "<"
        for line in text.splitlines():  # a pipe from the input never splits a table cell
            if line.startswith("| ") and "---" not in line:
                assert (
                    len(re.findall(r"(?<!\\)\|", line))
                    == len(re.findall(r"(?<!\\)\|", text.split("| #", 1)[1].split("\n", 1)[0])) + 1
                )


def test_the_presenter_draws_only_its_own_escapes(pgrace_run: RunScenario) -> None:
    loaded = catalog.read_scenario(str(HOSTILE))
    out = io.StringIO()
    presenter = Presenter(loaded, Style(colour=True, width=100), pace=0.0001, out=out, tty=True)
    with presenter:
        run = pgrace_run(
            loaded,
            options=RunOptions(
                before_step=presenter.before_step, on_event=presenter.on_event, on_idle=presenter.on_idle
            ),
        )
        presenter.finish(run)
    own = re.compile(r"\x1b\[[0-9;]*m|\r\x1b\[2K|\r")
    assert_no_raw_control(out.getvalue(), own=own)
    assert "pwned-error" in out.getvalue()


def test_isolation_format_is_raw_in_a_pipe_and_visible_on_a_terminal(
    hostile_runs: tuple[Run, Run], pgrace_server: ServerInfo
) -> None:
    """isolationtester prints server text raw and its expected files hold it so: only a terminal is spared."""
    assert "\x1b]0;pwned-error\x07" in render_isolation(hostile_runs[0])
    piped = CliRunner().invoke(main, ["run", str(HOSTILE), "-f", "isolation", "--dsn", pgrace_server.dsn])
    assert "\x1b]0;pwned-error\x07" in piped.output
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgrace", "run", str(HOSTILE), "-f", "isolation", "--dsn", pgrace_server.dsn],
        stdout=follower,
        stderr=subprocess.DEVNULL,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=60)
    os.close(leader)
    on_terminal = b"".join(chunks).decode()
    assert "pwned-error" in on_terminal
    assert_no_raw_control(on_terminal.replace("\r\n", "\n"))


def test_cli_text_show_list_and_errors_show_control_characters(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    cli = CliRunner()
    for args in (["run", str(HOSTILE)], ["show", str(HOSTILE)], ["show", str(HOSTILE), "--fix"]):
        result = cli.invoke(main, [*args, "--dsn", pgrace_server.dsn] if args[0] == "run" else args)
        assert result.exit_code in (0, 1), result.output
        assert_no_raw_control(result.output)
        assert "pwned" in result.output
    bad_setup = tmp_path / "bad_setup.toml"
    bad_setup.write_text(
        "setup = \"DO $$ BEGIN RAISE EXCEPTION '%', E'\\\\x1b]0;pwned-setup\\\\x07'; END $$\"\n"
        'sessions = ["a"]\n[[step]]\nsession = "a"\nsql = "SELECT 1"\n'
    )
    result = cli.invoke(main, ["run", str(bad_setup), "--dsn", pgrace_server.dsn])
    assert result.exit_code == 1, result.output  # a setup failing on this server is not invalid input
    assert "pwned-setup" in result.stderr
    assert_no_raw_control(result.stderr)


def test_check_output_and_junit_are_clean(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    result = CliRunner().invoke(main, ["check", str(HOSTILE), "--dsn", pgrace_server.dsn, "--junit", str(junit)])
    assert result.exit_code == 1, result.output  # the check expects the wrong row
    assert_no_raw_control(result.output)
    text = junit.read_text()
    assert_no_raw_control(text)
    ET.fromstring(text.split("\n", 1)[1])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('sessions = ["a\\n"]\n[[step]]\nsession = "a\\n"\nsql = "SELECT 1"\n', "session name"),
        ('sessions = ["a"]\n[[step]]\nname = "s\\n"\nsession = "a"\nsql = "SELECT 1"\n', "step name"),
        ('name = "x\\u001b"\nsessions = ["a"]\n[[step]]\nsession = "a"\nsql = "SELECT 1"\n', "scenario name"),
        ('sessions = ["a"]\n[[step]]\nsession = "a"\nsql = "SELECT 1 AS c"\ncapture = { "v\\n" = "c" }\n', "variable"),
        ('[params]\n"n\\u001b" = 1\nsessions = ["a"]\n[[step]]\nsession = "a"\nsql = "SELECT 1"\n', "param name"),
    ],
)
def test_control_characters_in_toml_names_are_refused(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "names.toml"
    path.write_text(text)
    result = CliRunner().invoke(main, ["show", str(path)])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and f"{path}:" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert_no_raw_control(result.stderr)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ('session "a\x1bb"\nstep "s" { SELECT 1; }\n', 1),
        ('session a\nstep "s\x07" { SELECT 1; }\n', 2),
        ("session a\nstep s\u202e { SELECT 1; }\n", 2),
        ('session a\nstep "s\tt" { SELECT 1; }\n', 2),
        ('session a\nstep s { SELECT 1; }\npermutation "s\x9b"\n', 3),
    ],
)
def test_control_characters_in_spec_names_are_refused(text: str, line: int, tmp_path: Path) -> None:
    path = tmp_path / "names.spec"
    path.write_text(text)
    result = CliRunner().invoke(main, ["show", str(path)])
    assert result.exit_code == 2, result.output
    assert f"{path}:{line}: control character" in result.stderr
    assert_no_raw_control(result.stderr)


def test_visible_keeps_layout_and_replaces_the_rest() -> None:
    assert visible("a\tb\nc") == "a\tb\nc"
    assert visible("\x1b[2J\x07\x7f\x9b\u202e\r") == "␛[2J␇␡\\x9b\\u202e␍"
    run_like = {"k\x1b": ("v\x1b", ["\x07"])}
    assert without_controls(run_like) == {"k␛": ("v␛", ["␇"])}
    same = ("clean", ["text"])
    assert without_controls(same) is same
