"""Bug and fix side by side in the terminal: the steps lined up by launch order.

A ``[fix.step.NAME]`` changes a step, not the order, so step N of one variant is step N
of the other, sent by the same session: each row shows the session, then what that step
did in each variant (its SQL, its wait, its result). A fix with a step list of its own
(``[[fix.step]]``) may send step N from another session: then each cell names its own
session, and there is no shared session column. Then each variant's verdict and what
happened.
"""

from __future__ import annotations

import textwrap

import click
from tabulate import tabulate

from pgrace.model.timeline import CheckQueried, Run
from pgrace.render.columns import StepSummary, rows, same_sessions, step_summaries
from pgrace.render.common import SESSION_COLOURS, one_line
from pgrace.render.story import story_facts
from pgrace.render.text import Style, render_verdict
from pgrace.render.wording import outcome_lines
from pgrace.text import without_controls


def _cell(summary: StepSummary | None, width: int, session: str | None = None) -> str:
    if summary is None:
        return ""
    lines = [one_line(summary.sql) if session is None else f"{session}: {one_line(summary.sql)}"]
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
    shared = same_sessions(columns)

    def coloured(session: str) -> str:
        return click.style(session, fg=colours[session]) if style.colour and session in colours else session

    table = []
    for i in range(rows(columns)):
        row = [c[i] if i < len(c) else None for c in columns]
        if shared:
            session = next(r.session for r in row if r is not None)
            table.append([str(i + 1), coloured(session), *[_cell(r, column) for r in row]])
        else:
            table.append([str(i + 1), *[_cell(r, column, coloured(r.session) if r else None) for r in row]])
    headers = ["#", *(["session"] if shared else []), *[f"{r.scenario.variant}" for r in runs]]
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
