"""The timeline as a Mermaid ``sequenceDiagram``: GitHub renders it inside a ```mermaid block.

Each session is a participant in its own coloured box (the colours of the other
formats), PostgreSQL is the last one. A step is a message to PostgreSQL numbered like
the text timeline; its result comes back as a reply, an error as a crossed reply. A step
that waits sends an async arrow to the session holding what it wants and stays
activated (a bar on its lifeline) until it resumes.

Message text is escaped with Mermaid's entity codes (``#59;`` for ``;``, which would end
the statement; ``#35;`` for ``#``; ``#lt;``/``#gt;`` so SQL comparisons are not HTML).
"""

from __future__ import annotations

import json
import textwrap

from pgrace.model.timeline import Run
from pgrace.render.common import one_line, session_colours, shorten
from pgrace.render.sections import LaneEntry, timeline_sections
from pgrace.render.story import verdict_line
from pgrace.render.wording import wait_phrase, wait_points_at
from pgrace.text import without_controls

MAX_MESSAGE = 90
ENTITIES = {"#": "#35;", ";": "#59;", "<": "#lt;", ">": "#gt;"}  # one pass: no escaping the escapes
SERVER = "pg"


def escape_text(text: str) -> str:
    """Text safe after a Mermaid ``:``: entity codes for the characters that mean syntax."""
    return "".join(ENTITIES.get(char, char) for char in " ".join(text.split()))


def wrapped_text(text: str) -> str:
    """A fact as Mermaid shows it in full: escaped, broken into lines of MAX_MESSAGE (``<br/>``), never cut."""
    lines = textwrap.wrap(" ".join(text.split()), MAX_MESSAGE, break_on_hyphens=False) or [""]
    return "<br/>".join(escape_text(line) for line in lines)


def _rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r},{g},{b})"


def render_mermaid(run: Run) -> str:
    run = without_controls(run)
    scenario = run.scenario
    sessions = scenario.session_names
    ids = {name: f"s{i + 1}" for i, name in enumerate(sessions)}
    colours = session_colours(sessions)
    title = f"{scenario.name} ({scenario.variant}): {scenario.title}"
    # The front matter's title takes no entity codes: angle brackets become look-alikes, never markup.
    title = title.translate({ord("<"): "‹", ord(">"): "›"})
    out = ["---", f"title: {json.dumps(title, ensure_ascii=False)}", "---", "sequenceDiagram"]
    for name in sessions:
        out.append(f"    box {_rgb(colours[name].light)}")
        out.append(f"        participant {ids[name]} as {escape_text(name)}")
        out.append("    end")
    out.append(f"    participant {SERVER} as PostgreSQL")
    active: set[str] = set()
    for section in timeline_sections(run):
        if section.heading:
            out.append(f"    Note over {ids[sessions[0]]},{SERVER}: {escape_text(section.heading)}")
        for entry in section.entries:
            out.extend("    " + line for line in _entry_lines(entry, ids, active))
    for who in sorted(active):  # a step still waiting when the run ended
        out.append(f"    deactivate {who}")
    out.append(f"    Note over {ids[sessions[0]]},{SERVER}: {escape_text(verdict_line(run))}")
    return "\n".join(out) + "\n"


def _entry_lines(entry: LaneEntry, ids: dict[str, str], active: set[str]) -> list[str]:
    who = ids.get(entry.session)
    if who is None:
        return []
    lines: list[str] = []
    if entry.kind == "step":
        lines.append(f"{who}->>{SERVER}: {escape_text(shorten(f'{entry.seq}. {one_line(entry.sql)}', MAX_MESSAGE))}")
        if entry.note:
            lines.append(f"Note over {who}: {escape_text(shorten('» ' + entry.note, MAX_MESSAGE))}")
        for wait in entry.waits if not entry.by_marker else ():
            holder = ids.get(wait_points_at(wait))
            text = escape_text("⏳ " + wait_phrase(wait))
            if holder is not None and holder != who:
                lines.append(f"{who}--){holder}: {text}")
            else:
                lines.append(f"Note over {who}: {text}")
        if entry.waits and not entry.by_marker and who not in active:
            lines.append(f"activate {who}")
            active.add(who)
    elif entry.kind in ("resume", "cancel"):
        if who in active:
            lines.append(f"deactivate {who}")
            active.discard(who)
        if entry.kind == "cancel":
            lines.append(f"{SERVER}--x{who}: {escape_text(f'⌛ {entry.step} {entry.text}')}")
        else:
            lines.append(f"{SERVER}-->>{who}: {wrapped_text(f'↳ step {entry.seq} {entry.release_text}')}")
    elif entry.kind == "chosen":
        lines.append(f"Note over {who}: {wrapped_text(entry.text)}")
    elif entry.kind == "lost":
        lines.append(f"{SERVER}--x{who}: {wrapped_text(entry.text)}")
    else:
        lines.append(f"{SERVER}--){who}: {escape_text(shorten(entry.text, MAX_MESSAGE))}")
    if entry.outcome is not None:
        for text in entry.outcome_lines():
            if text.startswith("✗"):
                lines.append(f"{SERVER}--x{who}: {wrapped_text(text.replace('ERROR ', ''))}")
            else:
                lines.append(f"{SERVER}-->>{who}: {escape_text(shorten(text.removeprefix('→ '), MAX_MESSAGE))}")
    return lines
