"""The timeline as a picture: swim lanes per session, time flowing down, one row per event.

The same drawing serves the standalone SVG (``--format svg``, for slides) and the HTML
page, which inlines it. Time is the step order (rows, numbered like the text timeline),
so the picture is as deterministic as the text. What must be seen at a glance:

* a step that waits gets an orange band (``waits for worker1 on jobs id=1``), an arrow
  to the session holding what it wants (a padlock badge in that session's lane), and an
  orange striped bar down its lane until it resumes;
* an error is outlined in red with its SQLSTATE;
* the grid on the right shows, after every row, which session holds which row lock.

Elements carry classes and ``data-`` attributes (``g.wait[data-holder]``, ``g.step``,
``rect.lock``) so tests and browsers can find them. Text widths are estimated from the
font size: DejaVu-like fonts, no measuring, no external assets.
"""

from __future__ import annotations

from xml.sax.saxutils import quoteattr

from pgrace.model.timeline import Run
from pgrace.render.common import ERROR_COLOUR, OK_COLOUR, session_colours, shorten
from pgrace.render.sections import timeline_sections
from pgrace.render.story import verdict_line
from pgrace.render.svg.draw import draw_section, svg_defs
from pgrace.render.svg.layout import MUTED, PAD, Canvas, geometry, lane_width_for
from pgrace.text import without_controls

__all__ = ["lane_width_for", "render_svg", "render_svg_compare", "timeline_svg"]


def timeline_svg(run: Run, *, lane_width: int | None = None, standalone: bool = False, uid: str = "pg") -> str:
    """The picture as one ``<svg>`` element; ``standalone`` adds a title and the verdict."""
    run = without_controls(run)  # XML 1.0 forbids most control characters, even as references
    lane_width = lane_width or lane_width_for(len(run.scenario.session_names))
    colours = session_colours(run.scenario.session_names)
    sections = timeline_sections(run)
    canvas = Canvas()
    y = float(PAD)
    width = 0.0
    if standalone:
        scenario = run.scenario
        canvas.text(PAD, y + 22, f"{scenario.name} ({scenario.variant})", size=22, weight="bold")
        canvas.text(PAD, y + 46, scenario.title, size=15, fill=MUTED)
        y += 64
    y += 16  # room for the lock grid's caption
    for section in sections:
        geo = geometry(run, section, lane_width)
        geo.top = y
        y = draw_section(canvas, run, section, geo, colours, uid) + 8
        width = max(width, geo.width)
    if not run.row_locks_available:
        canvas.text(PAD, y + 14, "row locks: unknown (pgrowlocks is not installed)", size=12, fill=MUTED)
        y += 22
    if standalone:
        ok = run.ok
        canvas.text(
            PAD, y + 24, verdict_line(run), size=17, weight="bold", fill=OK_COLOUR if ok else ERROR_COLOUR,
            cls="verdict",
        )  # fmt: skip
        y += 34
        for check in [c for c in run.checks if not c.ok][:6]:
            text = shorten(f"✘ {check.description}: expected {check.expected}, got {check.actual}", 120)
            canvas.text(PAD + 8, y + 14, text, size=12.5, fill=ERROR_COLOUR)
            y += 20
    height = y + PAD
    width = max(width, 560.0)
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="pgrace-timeline" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
        f"aria-label={quoteattr(f'{run.scenario.name} ({run.scenario.variant}) timeline')}>"
    )
    background = f'<rect width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>'
    return head + svg_defs(uid) + background + "".join(canvas.parts) + "</svg>"


def render_svg(run: Run) -> str:
    """A standalone SVG document for slides: title, lanes, waits, lock grid, verdict."""
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + timeline_svg(run, standalone=True) + "\n"


def render_svg_compare(runs: list[Run]) -> str:
    """The variants' pictures next to each other in one SVG document."""
    parts: list[str] = []
    x = 0.0
    height = 0.0
    for i, run in enumerate(runs):
        lanes = lane_width_for(len(run.scenario.session_names), compact=True)
        svg = timeline_svg(run, lane_width=lanes, standalone=True, uid=f"pg{i}")
        width = float(svg.split('width="', 1)[1].split('"', 1)[0])
        h = float(svg.split('height="', 1)[1].split('"', 1)[0])
        parts.append(svg.replace("<svg ", f'<svg x="{x:.0f}" y="0" ', 1))
        x += width + 24
        height = max(height, h)
    width = x - 24 if parts else 0
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}"><rect width="100%" height="100%" fill="#ffffff"/>'
        + "".join(parts)
        + "</svg>\n"
    )
