"""One self-contained HTML page per run (or per comparison): story, picture, verdict.

Everything is inline (CSS and the SVG timeline from :mod:`pgrace.render.svg`): no
script, no network, no external assets, so the file can be mailed, attached to an
issue or opened from a USB stick in front of an audience. Like the text timeline it
contains no pids, xids or clock times, so the same run gives the same page.
"""

from __future__ import annotations

from html import escape

from pgrace.model.scenario import Scenario
from pgrace.model.timeline import CheckQueried, Run
from pgrace.render.common import ERROR_COLOUR, OK_COLOUR, WAIT_COLOUR, WAIT_DARK, session_colours
from pgrace.render.story import story_facts, variant_flag, verdict_line
from pgrace.render.svg import lane_width_for, timeline_svg
from pgrace.render.wording import locks_heading, outcome_lines
from pgrace.text import without_controls

CSS = f"""
:root {{ color-scheme: light; }}
body {{ margin: 0; background: #ffffff; color: #111827;
  font: 16px/1.5 'DejaVu Sans', 'Helvetica Neue', Arial, sans-serif; }}
main {{ padding: 24px 32px 40px; }}
h1 {{ font-size: 28px; margin: 0 0 4px; }}
h2 {{ font-size: 19px; margin: 24px 0 8px; }}
.title {{ font-size: 19px; color: #374151; margin: 0; }}
.server {{ color: #4b5563; font-size: 14px; margin: 4px 0 0; }}
.variant {{ display: inline-block; font-size: 15px; font-weight: bold; color: #fff; border-radius: 12px;
  padding: 1px 12px; vertical-align: middle; margin-left: 8px; }}
.variant.bug {{ background: {ERROR_COLOUR}; }}
.variant.fix {{ background: {OK_COLOUR}; }}
.story {{ max-width: 60em; font-size: 17px; }}
.legend {{ display: flex; flex-wrap: wrap; gap: 8px 22px; align-items: center; font-size: 14px; color: #374151;
  margin: 14px 0 10px; }}
.legend span {{ display: inline-flex; align-items: center; gap: 6px; }}
.chip {{ display: inline-block; color: #fff; font-weight: bold; border-radius: 5px; padding: 0 10px; }}
.swatch {{ display: inline-block; width: 28px; height: 14px; border-radius: 3px; }}
.swatch.wait {{ background: repeating-linear-gradient(45deg, {WAIT_COLOUR} 0 6px, {WAIT_DARK} 6px 10px); }}
.swatch.error {{ background: #fff; border: 3px solid {ERROR_COLOUR}; height: 8px; }}
figure.timeline {{ margin: 8px 0 0; overflow-x: auto; }}
figure.timeline svg {{ max-width: 100%; height: auto; display: block; }}
.verdict.ok h2 {{ color: {OK_COLOUR}; }}
.verdict.failed h2 {{ color: {ERROR_COLOUR}; }}
ul.checks {{ list-style: none; padding-left: 4px; margin: 0; }}
ul.checks li.ok::before {{ content: "✔ "; color: {OK_COLOUR}; font-weight: bold; }}
ul.checks li.failed::before {{ content: "✘ "; color: {ERROR_COLOUR}; font-weight: bold; }}
ul.facts li {{ margin: 2px 0; }}
table.final {{ border-collapse: collapse; font-size: 14px; }}
table.final td, table.final th {{ border: 1px solid #d1d5db; padding: 4px 10px; text-align: left;
  vertical-align: top; }}
code, .sql {{ font-family: 'DejaVu Sans Mono', Menlo, Consolas, monospace; font-size: 14px; }}
.cure {{ border-left: 6px solid {OK_COLOUR}; padding: 4px 16px; background: #f0fdf4; max-width: 60em; }}
.cure.bug {{ border-left-color: {ERROR_COLOUR}; background: #fef2f2; }}
.compare {{ display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); column-gap: 32px; }}
.compare article {{ min-width: 0; display: grid; grid-template-rows: subgrid; grid-row: span 7; align-content: start; }}
.compare article > * {{ margin-top: 0; }}
@media (max-width: 1100px) {{ .compare {{ grid-template-columns: minmax(0, 1fr); }} }}
.compare h2.variant-title {{ margin-top: 8px; }}
"""


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n<style>{CSS}</style>\n</head>\n"
        f'<body>\n<main class="pgrace">\n{body}</main>\n</body>\n</html>\n'
    )


def _paragraphs(text: str) -> str:
    return "".join(f"<p>{escape(' '.join(p.split()))}</p>" for p in text.split("\n\n") if p.strip())


def _legend(run: Run) -> str:
    colours = session_colours(run.scenario.session_names)
    chips = "".join(
        f'<span class="chip" style="background:{colour.strong}">{escape(name)}</span>'
        for name, colour in colours.items()
    )
    return (
        f'<div class="legend"><span>{chips}</span>'
        '<span><i class="swatch wait"></i>a step waits: the arrow points at the session it waits for</span>'
        '<span><i class="swatch error"></i>a step failed (SQLSTATE)</span>'
        + (f"<span>right: {locks_heading(run)} after each step</span>" if run.row_locks_available else "")
        + "</div>"
    )


def _verdict(run: Run) -> str:
    state = "ok" if run.ok else "failed"
    items = "".join(
        f'<li class="{"ok" if c.ok else "failed"}">{escape(c.description)}'
        + ("" if c.ok else f": expected {escape(c.expected)}, got {escape(c.actual)}")
        + "</li>"
        for c in run.checks
    )
    head = f"<h2>{escape(verdict_line(run))}</h2>"
    return f'<section class="verdict {state}">{head}<ul class="checks">{items}</ul></section>'


def _final_state(run: Run) -> str:
    queried = [e for e in run.events if isinstance(e, CheckQueried)]
    if not queried:
        return '<section class="final"></section>'
    rows = "".join(
        f'<tr><td class="sql">{escape(" ".join(e.sql.split()))}</td>'
        f'<td class="sql">{"<br>".join(escape(line) for line in outcome_lines(e.outcome)) or "→ nothing"}</td></tr>'
        for e in queried
    )
    return f'<section class="final"><h2>Final state</h2><table class="final">{rows}</table></section>'


def _facts(run: Run) -> str:
    items = "".join(f"<li>{escape(fact)}</li>" for fact in story_facts(run))
    return f'<section class="what"><h2>What happened</h2><ul class="facts">{items}</ul></section>'


def _other(run: Run, counterpart: Scenario | None) -> str:
    other = counterpart or run.scenario.other
    if other is None:
        return ""
    heading = "The cure" if other.variant == "fix" else "Without the cure"
    command = f"pgrace run {run.scenario.name} {variant_flag(other.variant)}"
    return (
        f'<section class="cure {other.variant}"><h2>{heading}: {escape(other.title)}</h2>'
        f"{_paragraphs(other.narrative)}<p>Run it: <code>{escape(command)}</code></p></section>"
    )


def _header(run: Run, level: str = "h1") -> str:
    scenario = run.scenario
    return (
        f'<header><{level}>{escape(scenario.name)}<span class="variant {escape(scenario.variant)}">'
        f"{escape(scenario.variant)}</span></{level}>"
        f'<p class="title">{escape(scenario.title)}</p>'
        f'<p class="server">server: {escape(run.server_label or "PostgreSQL " + run.server_version)}</p></header>'
    )


def render_html(run: Run, counterpart: Scenario | None = None) -> str:
    """The page for one run: header, story, legend, picture, verdict, facts, the other variant.

    ``counterpart`` is the other variant when ``run.scenario`` cannot name it (a fix
    variant does not link back to its bug).
    """
    run, counterpart = without_controls((run, counterpart))
    scenario = run.scenario
    body = (
        _header(run)
        + f'<section class="story">{_paragraphs(scenario.narrative)}</section>'
        + _legend(run)
        + f'<figure class="timeline">{timeline_svg(run)}</figure>'
        + _verdict(run)
        + _facts(run)
        + _final_state(run)
        + _other(run, counterpart)
    )
    return _page(f"pgrace: {scenario.name} ({scenario.variant})", body)


def render_html_compare(runs: list[Run]) -> str:
    """The variants next to each other (bug left, fix right), then what changed."""
    runs = without_controls(runs)
    first = runs[0].scenario
    articles = ""
    for i, run in enumerate(runs):
        scenario = run.scenario
        lanes = lane_width_for(len(scenario.session_names), compact=True)
        articles += (
            f'<article class="variant-{escape(scenario.variant)}" data-variant="{escape(scenario.variant)}">'
            f'<h2 class="variant-title">{escape(scenario.variant)}<span class="variant {escape(scenario.variant)}">'
            f"{escape(variant_flag(scenario.variant))}</span></h2>"
            f'<p class="title">{escape(scenario.title)}</p>'
            f'<section class="story">{_paragraphs(scenario.narrative)}</section>'
            f'<figure class="timeline">{timeline_svg(run, lane_width=lanes, uid=f"pg{i}")}</figure>'
            + _verdict(run)
            + _facts(run)
            + _final_state(run)
            + "</article>"
        )
    all_ok = all(run.ok for run in runs)
    summary = "both variants behaved as their expectations say" if all_ok else "an expectation did not hold"
    body = (
        f"<header><h1>{escape(first.name)}: bug and fix side by side</h1>"
        f'<p class="server">server: {escape(runs[0].server_label or "PostgreSQL " + runs[0].server_version)}'
        f" · {escape(summary)}</p></header>" + _legend(runs[0]) + f'<div class="compare">{articles}</div>'
    )
    return _page(f"pgrace: {first.name} (bug and fix)", body)
