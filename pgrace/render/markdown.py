"""The timeline as GitHub-flavoured Markdown, for pull requests and issues.

One table per permutation, a column per session (headed by the session's coloured
square, the same colour as everywhere else), the row locks on the right, then the
verdict and what happened. Cells use ``<br>`` for line breaks and escape ``|``, which
GitHub would otherwise take for a column border, even inside code.
"""

from __future__ import annotations

from pgrace.model.scenario import Scenario
from pgrace.model.timeline import CheckQueried, Run
from pgrace.render.columns import StepSummary, same_sessions, step_summaries
from pgrace.render.common import one_line, session_colours
from pgrace.render.sections import LaneEntry, timeline_sections
from pgrace.render.story import story_facts, variant_flag, verdict_line
from pgrace.render.wording import describe_wait, lock_label, locks_heading, outcome_lines
from pgrace.text import without_controls

SPECIAL = "\\`*_[]<>|#"


def escape_md(text: str) -> str:
    """Plain text that Markdown shows as typed, on one line."""
    text = " ".join(text.split())
    return "".join("\\" + c if c in SPECIAL else c for c in text)


def code(text: str) -> str:
    """An inline code span; pipes escaped because GitHub splits table cells on them first."""
    text = " ".join(text.split()).replace("|", "\\|")
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _cell_lines(entry: LaneEntry) -> list[str]:
    lines: list[str] = []
    if entry.kind == "step":
        lines.append(code(one_line(entry.sql)))
        if entry.note:
            lines.append("*» " + escape_md(entry.note) + "*")
        if not entry.by_marker:
            lines += ["**" + escape_md(describe_wait(w)) + "**" for w in entry.waits]
        else:
            lines.append("… reported later (completion marker)")
    elif entry.kind == "resume":
        lines.append(escape_md(f"↳ step {entry.seq} {entry.release_text}"))
    elif entry.kind == "cancel":
        lines.append("**" + escape_md(f"⌛ {entry.step} {entry.text}") + "**")
    elif entry.kind == "lost":
        lines.append("**" + escape_md(entry.text) + "**")
    else:
        lines.append(escape_md(entry.text))
    if entry.outcome is not None:
        for text in entry.outcome_lines():
            lines.append("**" + escape_md(text) + "**" if text.startswith("✗") else escape_md(text))
    return lines


def _verdict(run: Run) -> list[str]:
    out = [f"**{escape_md(verdict_line(run))}**", ""]
    for check in run.checks:
        line = f"- {'✔' if check.ok else '✘'} {escape_md(check.description)}"
        if not check.ok:
            line += f": expected {escape_md(check.expected)}, got {escape_md(check.actual)}"
        out.append(line)
    return out


def _final(run: Run) -> list[str]:
    queried = [e for e in run.events if isinstance(e, CheckQueried)]
    if not queried:
        return []
    out = ["", "Final state:", ""]
    for event in queried:
        got = "; ".join(outcome_lines(event.outcome)) or "→ nothing"
        out.append(f"- {code(event.sql)} {escape_md(got)}")
    return out


def render_markdown(run: Run, level: int = 2, counterpart: Scenario | None = None) -> str:
    """Heading, story, one table per permutation, final state, verdict, facts, the other variant."""
    run, counterpart = without_controls((run, counterpart))
    scenario = run.scenario
    sessions = scenario.session_names
    colours = session_colours(sessions)
    out = [f"{'#' * level} {escape_md(f'{scenario.name} ({scenario.variant}): {scenario.title}')}", ""]
    out.append(f"server: {escape_md(run.server_label or 'PostgreSQL ' + run.server_version)}")
    if scenario.narrative:
        out += ["", *[escape_md(p) for p in scenario.narrative.split("\n\n") if p.strip()]]
    with_locks = run.row_locks_available
    for section in timeline_sections(run):
        out.append("")
        if section.heading:
            out += [f"**{escape_md(section.heading)}**", ""]
        header = ["#", *[f"{colours[s].square} {escape_md(s)}" for s in sessions]]
        header += [locks_heading(run)] if with_locks else []
        out.append("| " + " | ".join(header) + " |")
        out.append("| ---: | " + " | ".join(":--" for _ in header[1:]) + " |")
        last: object = ()
        for entry in section.entries:
            number = str(entry.seq) if entry.kind == "step" and entry.seq is not None else ""
            cells = [number] + ["<br>".join(_cell_lines(entry)) if s == entry.session else "" for s in sessions]
            if with_locks:
                locks = entry.locks
                if locks != last:
                    held = [escape_md(lock_label(lock)) for lock in locks] if locks is not None else ["unknown"]
                    cells.append("<br>".join(held) or "none")
                    last = locks
                else:
                    cells.append("")
            out.append("| " + " | ".join(cells) + " |")
    out += _final(run)
    out += ["", *_verdict(run)]
    out += ["", "What happened:", "", *[f"- {escape_md(fact)}" for fact in story_facts(run)]]
    other = counterpart or scenario.other
    if other is not None:
        out += [
            "",
            f"The {'cure' if other.variant == 'fix' else 'bug it avoids'} ({code(variant_flag(other.variant))}): "
            f"{escape_md(other.title)}",
        ]
    return "\n".join(out) + "\n"


def _summary_cell(summary: StepSummary | None) -> str:
    if summary is None:
        return ""
    lines = [code(one_line(summary.sql))]
    lines += [
        "**" + escape_md(line) + "**" if line.startswith(("⏳", "✗", "⌛")) else escape_md(line)
        for line in summary.lines
    ]
    return "<br>".join(lines)


def render_markdown_compare(runs: list[Run]) -> str:
    """Both variants, step by step in one table, then each variant's verdict."""
    runs = without_controls(runs)
    first = runs[0].scenario
    out = [f"## {escape_md(first.name)}: " + " vs ".join(escape_md(r.scenario.variant) for r in runs), ""]
    for run in runs:
        out.append(f"- **{escape_md(run.scenario.variant)}**: {escape_md(run.scenario.title)}")
    colours = session_colours(first.session_names)
    columns = [step_summaries(run) for run in runs]
    shared = same_sessions(columns)  # else each cell names its own session: the fix has steps of its own

    def who(session: str) -> str:
        return f"{colours[session].square if session in colours else ''} {escape_md(session)}"

    variants = " | ".join(escape_md(r.scenario.variant) for r in runs)
    out += ["", f"| # | session | {variants} |" if shared else f"| # | {variants} |"]
    out.append("| ---: | " + (":-- | " if shared else "") + " | ".join(":--" for _ in runs) + " |")
    for i in range(max(len(c) for c in columns)):
        row = [c[i] if i < len(c) else None for c in columns]
        if shared:
            session = next(r.session for r in row if r is not None)
            cells = [str(i + 1), who(session)] + [_summary_cell(r) for r in row]
        else:
            cells = [str(i + 1)] + [f"{who(r.session)}: {_summary_cell(r)}" if r else "" for r in row]
        out.append("| " + " | ".join(cells) + " |")
    for run in runs:
        out += ["", f"### {escape_md(run.scenario.variant)}", "", *_verdict(run)]
        out += ["", "What happened:", "", *[f"- {escape_md(fact)}" for fact in story_facts(run)]]
    return "\n".join(out) + "\n"
