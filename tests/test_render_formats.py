"""The picture formats say what happened: SVG is valid XML with the wait drawn and named,
Mermaid parses as a sequenceDiagram, Markdown tables keep their shape, HTML is
self-contained, colours follow the session everywhere, and --compare shows both variants.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner
from fix_recorded import Recorded

from pgrace import api
from pgrace.cli import main
from pgrace.frontends import catalog
from pgrace.render.common import PALETTE, sql_lines
from pgrace.render.html import render_html, render_html_compare
from pgrace.render.markdown import render_markdown, render_markdown_compare
from pgrace.render.mermaid import render_mermaid
from pgrace.render.svg import render_svg, render_svg_compare
from pgrace.render.text import Style, render_text
from pgrace.servers import ServerInfo

SVG = "{http://www.w3.org/2000/svg}"
VARIANTS = [(name, variant) for name in catalog.shipped_names() for variant in catalog.read_scenario(name).variants]

# -- SVG -----------------------------------------------------------------------------------


def svg_root(text: str) -> ET.Element:
    assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>\n')
    return ET.fromstring(text.encode("utf-8"))


def groups(root: ET.Element, cls: str) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if cls in (g.get("class") or "").split()]


def all_text(element: ET.Element) -> str:
    return " ".join(t.text or "" for t in element.iter(f"{SVG}text"))


@pytest.mark.parametrize(("name", "variant"), VARIANTS)
def test_every_shipped_svg_is_valid_xml_with_a_lane_per_session(recorded: Recorded, name: str, variant: str) -> None:
    run = recorded(name, variant)
    root = svg_root(render_svg(run))
    assert root.tag == f"{SVG}svg" and float(root.get("width", 0)) > 400
    assert [g.get("data-session") for g in groups(root, "lane")] == run.scenario.session_names
    launched = {s.seq for s in run.step_runs()}
    assert {int(g.get("data-seq", 0)) for g in groups(root, "step") if g.get("data-kind") == "step"} == launched
    waited = [s for s in run.step_runs() if s.waited]
    assert len(groups(root, "wait")) == sum(len(s.waits) for s in waited)


def test_svg_draws_worker2s_wait_on_job_1_with_an_arrow_to_worker1(recorded: Recorded) -> None:
    root = svg_root(render_svg(recorded("head-of-line-blocking", "bug")))
    [wait] = groups(root, "wait")
    assert (wait.get("data-waiter"), wait.get("data-holder"), wait.get("data-row")) == (
        "worker2",
        "worker1",
        "jobs id=1",
    )
    assert "waits for worker1 on jobs id=1" in all_text(wait)
    assert [line.get("x2") for line in wait.iter(f"{SVG}line") if line.get("marker-end")], "no arrow"
    [badge] = groups(wait, "holder")
    assert badge.get("data-session") == "worker1" and "worker1 holds jobs id=1" in all_text(badge)
    bar = [r for r in wait.iter(f"{SVG}rect") if r.get("class") == "wait-bar"]
    assert bar and float(bar[0].get("height", 0)) > 40, "the wait bar should run down to the resume"
    held = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "lock" and r.get("data-row") == "jobs id=1"]
    assert [r.get("data-session") for r in held][:1] == ["worker1"]


def test_svg_marks_errors_with_their_sqlstate(recorded: Recorded) -> None:
    root = svg_root(render_svg(recorded("nowait", "bug")))
    errors = {g.get("data-sqlstate"): all_text(g) for g in groups(root, "error")}
    assert set(errors) == {"55P03", "25P02"}
    assert "✗ 55P03" in errors["55P03"]


def test_pictures_are_deterministic(pgrace_server: ServerInfo) -> None:
    """Two runs of one variant, whose timings differ, draw the same pictures."""
    first, again = (
        api.run(catalog.read_scenario("lost-update").variant_named("fix"), server=pgrace_server) for _ in "12"
    )
    assert render_svg(first) == render_svg(again)
    assert render_html(first) == render_html(again)
    assert render_mermaid(first) == render_mermaid(again)


# -- Mermaid ------------------------------------------------------------------------------


@dataclass
class Diagram:
    title: str
    participants: dict[str, str] = field(default_factory=dict)  # id -> label
    boxes: list[str] = field(default_factory=list)
    messages: list[tuple[str, str, str, str]] = field(default_factory=list)  # from, arrow, to, text
    notes: list[tuple[str, str]] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # "message N", "activate s2", ...


MESSAGE = re.compile(r"(\w+)(->>|-->>|--x|--\)|->|-->|-x|-\))(\w+): (.+)")
NOTE = re.compile(r"Note (?:over|right of|left of) (\w+(?:,\w+)?): (.+)")


def parse_mermaid(text: str) -> Diagram:
    """A small parser for the subset pgrace writes; it fails on any line it does not know."""
    lines = text.splitlines()
    assert lines[0] == "---" and lines[2] == "---" and lines[3] == "sequenceDiagram", lines[:4]
    assert lines[1].startswith("title: ")
    diagram = Diagram(json.loads(lines[1].removeprefix("title: ")))
    depth = 0
    active: dict[str, int] = {}
    for raw in lines[4:]:
        assert raw.startswith("    "), f"not indented: {raw!r}"
        line = raw.strip()
        if m := re.fullmatch(r"box (rgb\(\d+,\d+,\d+\))", line):
            diagram.boxes.append(m[1])
            depth += 1
        elif line == "end":
            depth -= 1
            assert depth >= 0
        elif m := re.fullmatch(r"participant (\w+) as (.+)", line):
            diagram.participants[m[1]] = m[2]
        elif m := re.fullmatch(r"(activate|deactivate) (\w+)", line):
            active[m[2]] = active.get(m[2], 0) + (1 if m[1] == "activate" else -1)
            assert active[m[2]] >= 0, f"{line} without activate"
            diagram.order.append(line)
        elif m := MESSAGE.fullmatch(line):
            diagram.messages.append((m[1], m[2], m[3], m[4]))
            diagram.order.append(f"{m[1]}{m[2]}{m[3]}: {m[4]}")
        elif m := NOTE.fullmatch(line):
            diagram.notes.append((m[1], m[2]))
        else:
            pytest.fail(f"unparsed Mermaid line: {line!r}")
        for text_part in [line.split(": ", 1)[1]] if ": " in line else []:
            assert ";" not in text_part.replace("#59;", "").replace("#35;", "").replace("#lt;", "").replace("#gt;", "")
    assert depth == 0, "unbalanced box/end"
    assert all(v == 0 for v in active.values()), f"activations left open: {active}"
    actors = set(diagram.participants)
    for source, _, target, _ in diagram.messages:
        assert {source, target} <= actors, (source, target)
    for where, _ in diagram.notes:
        assert set(where.split(",")) <= actors, where
    return diagram


@pytest.mark.parametrize(("name", "variant"), VARIANTS)
def test_every_shipped_mermaid_parses(recorded: Recorded, name: str, variant: str) -> None:
    run = recorded(name, variant)
    diagram = parse_mermaid(render_mermaid(run))
    assert list(diagram.participants.values()) == [*run.scenario.session_names, "PostgreSQL"]
    numbered = [
        int(text.split(".")[0]) for _, arrow, target, text in diagram.messages if arrow == "->>" and target == "pg"
    ]
    assert numbered == [s.seq for s in run.step_runs()]


def test_mermaid_shows_the_wait_as_an_arrow_to_the_holder_and_an_activation(recorded: Recorded) -> None:
    diagram = parse_mermaid(render_mermaid(recorded("head-of-line-blocking", "bug")))
    assert diagram.participants == {"s1": "worker1", "s2": "worker2", "pg": "PostgreSQL"}
    [wait] = [m for m in diagram.messages if m[1] == "--)"]
    assert wait[0] == "s2" and wait[2] == "s1" and "waits for worker1 on jobs id=1" in wait[3]
    order = diagram.order
    commit = next(i for i, line in enumerate(order) if line.startswith("s1->>pg: 6. COMMIT"))
    assert order.index("activate s2") < commit < order.index("deactivate s2")
    assert any("resumes" in line for line in order[order.index("deactivate s2") :])


def test_mermaid_marks_errors_and_escapes_syntax(recorded: Recorded) -> None:
    diagram = parse_mermaid(render_mermaid(recorded("nowait", "bug")))
    assert any(arrow == "--x" and "55P03" in text for _, arrow, _, text in diagram.messages)
    text = render_mermaid(recorded("escapes", "bug"))
    parse_mermaid(text)
    assert "1 #lt; 2 AS lt#59; SELECT '#35;x#59;' AS hash" in text


# -- Markdown ------------------------------------------------------------------------------


def table_rows(markdown: str) -> list[list[str]]:
    rows = []
    for line in markdown.splitlines():
        if line.startswith("| "):
            cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
            rows.append([c.strip() for c in cells])
    return rows


@pytest.mark.parametrize(("name", "variant"), VARIANTS)
def test_every_shipped_markdown_table_keeps_its_shape(recorded: Recorded, name: str, variant: str) -> None:
    run = recorded(name, variant)
    rows = table_rows(render_markdown(run))
    width = len(rows[0])
    assert width == 1 + len(run.scenario.session_names) + (1 if run.row_locks_available else 0)
    assert all(len(row) == width for row in rows), [row for row in rows if len(row) != width]
    assert [r[0] for r in rows[2:] if r[0]] == [str(s.seq) for s in run.step_runs()]


def test_markdown_names_the_wait_and_escapes_pipes(recorded: Recorded) -> None:
    text = render_markdown(recorded("head-of-line-blocking", "bug"))
    assert "**⏳ waits for worker1 on row jobs id=1 (wants FOR UPDATE; worker1 holds FOR UPDATE)**" in text
    assert f"| # | {PALETTE[0].square} worker1 | {PALETTE[1].square} worker2 | row locks held |" in text
    assert "`SELECT 'a' \\|\\| 'b' AS ab`" in render_markdown(recorded("escapes", "bug"))


# -- HTML ----------------------------------------------------------------------------------


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def test_html_is_one_self_contained_file(recorded: Recorded) -> None:
    html = render_html(recorded("head-of-line-blocking", "bug"))
    parser = Tags()
    parser.feed(html)
    names = [tag for tag, _ in parser.tags]
    assert "script" not in names and "link" not in names and "img" not in names
    assert not any("src" in attrs or "href" in attrs for _, attrs in parser.tags)
    assert re.findall(r"https?://[^\"' )]+", html) == ["http://www.w3.org/2000/svg"]
    assert names.count("svg") == 1 and "style" in names
    assert "Two workers take jobs from the same queue" in html  # the story
    assert "Head-of-line blocking, cured: FOR UPDATE SKIP LOCKED" in html  # and the cure
    assert 'class="wait" data-seq="4" data-waiter="worker2" data-holder="worker1" data-row="jobs id=1"' in html


def test_compare_html_and_svg_put_both_variants_side_by_side(recorded: Recorded) -> None:
    runs = [recorded("lost-update", "bug"), recorded("lost-update", "fix")]
    html = render_html_compare(runs)
    assert html.count("<article") == 2 and html.count("<svg") == 2
    assert html.index('data-variant="bug"') < html.index('data-variant="fix"')
    assert 'id="pg0-stripes"' in html and 'id="pg1-stripes"' in html  # no clashing ids
    root = svg_root(render_svg_compare(runs))
    inner = root.findall(f"{SVG}svg")
    assert len(inner) == 2 and float(inner[1].get("x", 0)) > float(inner[0].get("width", 0))
    assert len(groups(inner[0], "wait")) == 0 and len(groups(inner[1], "wait")) == 1
    rows = table_rows(render_markdown_compare(runs))
    assert rows[0] == ["#", "session", "bug", "fix"]
    step4 = rows[2 + 3]
    assert "waits for alice" not in step4[2] and "waits for alice on row accounts id=1" in step4[3]


# -- colours -------------------------------------------------------------------------------


def test_a_session_has_the_same_colour_in_every_format(recorded: Recorded) -> None:
    run = recorded("head-of-line-blocking", "bug")
    for index, session in enumerate(run.scenario.session_names):
        colour = PALETTE[index]
        root = svg_root(render_svg(run))
        head = next(g for g in groups(root, "lane-head") if g.get("data-session") == session)
        assert head.find(f"{SVG}rect") is not None and head.find(f"{SVG}rect").get("fill") == colour.strong  # type: ignore[union-attr]
        lane = next(g for g in groups(root, "lane") if g.get("data-session") == session)
        assert lane.find(f"{SVG}rect").get("fill") == colour.light  # type: ignore[union-attr]
        assert f'background:{colour.strong}">{session}<' in render_html(run)
        r, g, b = (int(colour.light[i : i + 2], 16) for i in (1, 3, 5))
        assert f"box rgb({r},{g},{b})\n        participant s{index + 1} as {session}" in render_mermaid(run)
        ansi = {"cyan": "\x1b[36m", "magenta": "\x1b[35m"}[colour.terminal]
        assert ansi + session in render_text(run, Style(colour=True))


# -- SQL on narrow lines ---------------------------------------------------------------------


def test_sql_breaks_before_clauses_and_never_inside_quotes() -> None:
    sql = "SELECT id FROM jobs WHERE status = 'queued FROM here' ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1"
    lines = sql_lines(sql, 40)
    assert lines == [
        "SELECT id FROM jobs",
        "  WHERE status = 'queued FROM here'",
        "  ORDER BY id FOR UPDATE SKIP LOCKED",
        "  LIMIT 1",
    ]
    assert all(len(line) <= 40 for line in sql_lines(sql, 24))
    assert sql_lines("BEGIN", 40) == ["BEGIN"]
    assert sql_lines("UPDATE t SET v = 1 WHERE id = 1; COMMIT", 60) == ["UPDATE t SET v = 1 WHERE id = 1;", "COMMIT"]
    short = sql_lines(sql, 30, max_lines=2)
    assert len(short) == 2 and short[-1].endswith("…")


# -- the command line ------------------------------------------------------------------------


def test_run_writes_every_picture_format(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    cli = CliRunner()
    base = ["run", "head-of-line-blocking", "--dsn", pgrace_server.dsn]
    result = cli.invoke(main, [*base, "--format", "html", "-o", str(tmp_path / "hol.html")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "hol.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    svg = cli.invoke(main, [*base, "--format", "svg"])
    assert svg.exit_code == 0 and groups(svg_root(svg.stdout), "wait")
    mermaid = cli.invoke(main, [*base, "--format", "mermaid"])
    assert mermaid.exit_code == 0 and parse_mermaid(mermaid.stdout).messages
    markdown = cli.invoke(main, [*base, "--format", "markdown"])
    assert markdown.exit_code == 0 and markdown.stdout.startswith("## head-of-line-blocking (bug)")


def test_compare_runs_both_variants_and_exits_by_both_verdicts(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    cli = CliRunner()
    result = cli.invoke(main, ["run", "lost-update", "--compare", "--dsn", pgrace_server.dsn, "--width", "140"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "lost-update: bug and fix side by side"
    header = next(line for line in lines if line.startswith("#"))
    assert header.split() == ["#", "session", "bug", "fix"]
    step4 = next(i for i, line in enumerate(lines) if line.startswith("4 "))
    block = "\n".join(lines[step4 : step4 + 6])
    bug_column = header.index("bug")
    fix_column = header.index("fix")
    assert "⏳ waits for alice" in block
    assert all(line.find("⏳") in (-1,) or line.find("⏳") >= fix_column for line in lines[step4 : step4 + 6])
    assert bug_column < fix_column
    assert "bug: ✔ all 5 expectations held" in result.stdout and "fix: ✔ all 7 expectations held" in result.stdout
    # a fix whose expectation fails makes the comparison fail
    broken = tmp_path / "broken.toml"
    source = (catalog.shipped_dir() / "lost-update.toml").read_text(encoding="utf-8")
    broken.write_text(source.replace("rows = [[300]]", "rows = [[299]]"), encoding="utf-8")
    failed = cli.invoke(main, ["run", str(broken), "--compare", "--format", "markdown", "--dsn", pgrace_server.dsn])
    assert failed.exit_code == 1, failed.output
    assert "✘ 1 of 7 expectations did not hold" in failed.stdout


def test_compare_refuses_what_it_cannot_show(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    cli = CliRunner()
    dsn = ["--dsn", pgrace_server.dsn]
    for extra in (["--fix"], ["--format", "json"], ["--format", "mermaid"], ["--step"]):
        result = cli.invoke(main, ["run", "lost-update", "--compare", *extra, *dsn])
        assert result.exit_code == 2, (extra, result.output)
    single = tmp_path / "single.toml"
    single.write_text('sessions = ["a"]\n[[step]]\nsession = "a"\nsql = "SELECT 1"\n', encoding="utf-8")
    result = cli.invoke(main, ["run", str(single), "--compare", *dsn])
    assert result.exit_code == 2 and "one variant only" in result.stderr
