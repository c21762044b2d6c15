"""Bug and fix side by side in the terminal: the same steps, lined up by launch order.

A ``[fix]`` changes a scenario's steps, not their order, so step N of one variant is
step N of the other: each row shows the session, then what that step did in each
variant (its SQL, its wait, its result). Then each variant's verdict and what happened.
"""

from __future__ import annotations

import textwrap

import click
from tabulate import tabulate

from pgrace.render.common import (
    SESSION_COLOURS,
    StepSummary,
    one_line,
    outcome_lines,
    step_summaries,
    story_facts,
)
from pgrace.render.escape import without_controls
from pgrace.render.text import Style, render_verdict
from pgrace.timeline import CheckQueried, Run


def _cell(summary: StepSummary | None, width: int) -> str:
    if summary is None:
        return ""
    lines = [one_line(summary.sql)]
    if summary.note:
        lines.append(f"» {summary.note}")
    lines += summary.lines
    return "\n".join(w for line in lines for w in textwrap.wrap(line, width, subsequent_indent="  ") or [""])


def render_text_compare(runs: list[Run], style: Style | None = None) -> str:
    style = style or Style()
    runs = without_controls(runs)
    first = runs[0].scenario
    sessions = first.session_names
    colours = {name: SESSION_COLOURS[i % len(SESSION_COLOURS)] for i, name in enumerate(sessions)}
    heading = f"{first.name}: {' and '.join(r.scenario.variant for r in runs)} side by side"
    out = [click.style(heading, bold=True) if style.colour else heading]
    out.append(f"server: {runs[0].server_label or 'PostgreSQL ' + runs[0].server_version}")
    out.append("")
    for run in runs:
        out.append(f"{run.scenario.variant}: {run.scenario.title}")
    session_width = max(len(s) for s in sessions) if sessions else 7
    column = max(24, (style.width - 6 - session_width - 2 - 2 * len(runs)) // max(1, len(runs)))
    columns = [step_summaries(run) for run in runs]
    table = []
    for i in range(max((len(c) for c in columns), default=0)):
        row = [c[i] if i < len(c) else None for c in columns]
        session = next(r.session for r in row if r is not None)
        name = click.style(session, fg=colours[session]) if style.colour and session in colours else session
        table.append([str(i + 1), name, *[_cell(r, column) for r in row]])
    headers = ["#", "session", *[f"{r.scenario.variant}" for r in runs]]
    out += ["", tabulate(table, headers=headers, tablefmt="simple", disable_numparse=True)]
    for run in runs:
        lines = render_verdict(run.checks, style)
        lines[1] = lines[1].replace("verdict:", f"{run.scenario.variant}:", 1)
        out += lines
        for event in (e for e in run.events if isinstance(e, CheckQueried)):
            got = "; ".join(outcome_lines(event.outcome)) or "→ nothing"
            out.append(f"  final: {one_line(event.sql)}  {got}")
        out += [f"  · {fact}" for fact in story_facts(run)]
    out.append("")
    held = all(run.ok for run in runs)
    summary = "both variants behaved as their expectations say" if held else "an expectation did not hold"
    out.append(f"{'✔' if held else '✘'} {summary}")
    return "\n".join(out) + "\n"
