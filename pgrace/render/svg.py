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

import textwrap
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

from pgrace.render.common import (
    ERROR_COLOUR,
    OK_COLOUR,
    WAIT_COLOUR,
    WAIT_DARK,
    Entry,
    Section,
    SessionColour,
    WaitSpan,
    locks_heading,
    plural,
    session_colours,
    shorten,
    sql_lines,
    timeline_sections,
    verdict_line,
    wait_badge,
    wait_holder,
    wait_phrase,
    wait_points_at,
    wait_target,
)
from pgrace.text import without_controls
from pgrace.timeline import Run

MONO = "'DejaVu Sans Mono', Menlo, Consolas, 'Liberation Mono', monospace"
SANS = "'DejaVu Sans', 'Helvetica Neue', Arial, sans-serif"
INK = "#111827"
MUTED = "#4b5563"
CHAR_EM = {"mono": 0.61, "sans": 0.58, "bold": 0.63}

DEFAULT_LANE_WIDTH = 300
GUTTER = 48
LANE_GAP = 16
LOCK_COLUMN = 112
MAX_LOCK_COLUMNS = 8  # locked rows drawn as columns; the others are counted in the caption
PAD = 20
HEADER_H = 40
ROW_GAP = 10
RESUME_GAP = 24  # room above a resume for the end of its wait bar
BAND_LINE = 17
BAR_X = 14  # the wait bar's offset inside its lane
BADGE_X = 34  # lock badges sit right of any wait bar in that lane


@dataclass
class Line:
    text: str
    kind: str  # sql, note, result, error, resume, plain


LINE_STYLE = {
    "sql": (MONO, 13.0, "normal", "normal", INK),
    "note": (SANS, 12.5, "normal", "italic", "#374151"),
    "result": (MONO, 13.0, "bold", "normal", INK),
    "error": (SANS, 12.5, "bold", "normal", ERROR_COLOUR),
    "resume": (SANS, 12.5, "bold", "normal", WAIT_DARK),
    "plain": (SANS, 12.0, "normal", "normal", MUTED),
}


def _line_height(kind: str) -> float:
    return LINE_STYLE[kind][1] * 1.38


def _chars(width: float, size: float, kind: str = "sans") -> int:
    return max(8, int(width / (size * CHAR_EM[kind])))


def _wrap(text: str, width: float, size: float, kind: str = "sans") -> list[str]:
    return textwrap.wrap(text, _chars(width, size, kind), break_on_hyphens=False) or [""]


@dataclass
class Geometry:
    """Where things go: lanes, the lock grid, and each entry's row."""

    sessions: list[str]
    lane_width: int
    locked: list[str]
    show_locks: bool
    locks_title: str = "row locks held"
    top: float = 0.0
    rows: list[tuple[float, float]] = field(default_factory=list)  # (y, height) per entry

    def lane_x(self, session: str) -> float:
        index = self.sessions.index(session) if session in self.sessions else 0
        return PAD + GUTTER + index * (self.lane_width + LANE_GAP)

    @property
    def lanes_right(self) -> float:
        return PAD + GUTTER + len(self.sessions) * (self.lane_width + LANE_GAP) - LANE_GAP

    @property
    def grid_x(self) -> float:
        return self.lanes_right + 28

    @property
    def width(self) -> float:
        grid = (len(self.locked) * LOCK_COLUMN + 28) if self.show_locks and self.locked else 0
        return self.lanes_right + grid + PAD


def _block_lines(entry: Entry, inner: float) -> list[Line]:
    lines: list[Line] = []
    if entry.kind == "step":
        lines += [Line(t, "sql") for t in sql_lines(entry.sql, _chars(inner, 13, "mono"), max_lines=5)]
        if entry.note:
            lines += [Line(t, "note") for t in _wrap("» " + entry.note, inner, 12.5)]
    elif entry.kind == "resume":
        after = f"↳ step {entry.seq} {entry.release_text}"
        lines += [Line(t, "resume") for t in _wrap(after, inner, 12.5, "bold")]
    elif entry.kind == "cancel":
        lines += [Line(t, "error") for t in _wrap(f"✗ {entry.step} {entry.text}", inner, 12.5, "bold")]
    elif entry.kind == "lost":
        lines += [Line(t, "error") for t in _wrap(entry.text, inner, 12.5, "bold")]
    else:
        lines += [Line(t, "plain") for t in _wrap(entry.text, inner, 12.0)]
    if entry.outcome is not None:
        for text in entry.outcome_lines():
            if text.startswith("✗"):
                lines += [Line(t, "error") for t in _wrap(text.replace("✗ ERROR ", "✗ "), inner, 12.5, "bold")]
            else:
                lines += [Line(t, "result") for t in _wrap(text, inner, 13, "mono")]
    return lines


def _band_lines(entry: Entry, inner: float) -> list[list[str]]:
    if entry.kind != "step" or entry.by_marker:
        return []
    return [_wrap(wait_phrase(w), inner - 18, 12.5, "bold") for w in entry.waits]


def _entry_height(entry: Entry, inner: float) -> float:
    if entry.kind == "notice":
        return 8 + sum(_line_height(line.kind) for line in _block_lines(entry, inner))
    height = 12 + sum(_line_height(line.kind) for line in _block_lines(entry, inner))
    for band in _band_lines(entry, inner):
        height += len(band) * BAND_LINE + 10
    if entry.kind == "step" and entry.by_marker:
        height += BAND_LINE
    return max(height, 34)


class Canvas:
    """SVG elements as strings, with a few drawing helpers."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, text: str) -> None:
        self.parts.append(text)

    def text(
        self,
        x: float,
        y: float,
        content: str,
        *,
        font: str = SANS,
        size: float = 13,
        weight: str = "normal",
        style: str = "normal",
        fill: str = INK,
        anchor: str = "start",
        cls: str = "",
    ) -> None:
        attrs = f'x="{x:.1f}" y="{y:.1f}" font-family={quoteattr(font)} font-size="{size:g}" fill="{fill}"'
        if weight != "normal":
            attrs += f' font-weight="{weight}"'
        if style != "normal":
            attrs += f' font-style="{style}"'
        if anchor != "start":
            attrs += f' text-anchor="{anchor}"'
        if cls:
            attrs += f' class="{cls}"'
        self.add(f'<text {attrs} xml:space="preserve">{escape(content)}</text>')

    def rect(self, x: float, y: float, w: float, h: float, **attrs: str | float) -> None:
        extra = " ".join(f"{k.rstrip('_').replace('_', '-')}={quoteattr(str(v))}" for k, v in attrs.items())
        self.add(f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{max(h, 0):.1f}" {extra}/>')


def _defs(uid: str) -> str:
    return (
        "<defs>"
        f'<pattern id="{uid}-stripes" width="10" height="10" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)">'
        f'<rect width="10" height="10" fill="{WAIT_COLOUR}"/><rect width="4" height="10" fill="{WAIT_DARK}"/>'
        "</pattern>"
        f'<marker id="{uid}-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="5" markerHeight="5" '
        f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{WAIT_DARK}"/></marker>'
        f'<marker id="{uid}-release" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" '
        f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{MUTED}"/></marker>'
        "</defs>"
    )


def _hourglass(canvas: Canvas, x: float, y: float, colour: str) -> None:
    """A small hourglass, 10 by 13 px, top-left at (x, y): fonts rarely have U+29D7."""
    canvas.add(
        f'<path d="M{x:.1f},{y:.1f} h10 l-10,13 h10 z" fill="{colour}" stroke="{colour}" '
        'stroke-width="1.2" stroke-linejoin="round"/>'
    )


def _padlock(canvas: Canvas, x: float, y: float, colour: str) -> None:
    """A small padlock: a shackle arc over a body, 12 by 14 px, top-left at (x, y)."""
    canvas.add(
        f'<path d="M{x + 2.5:.1f},{y + 7:.1f} v-2.5 a3.5,3.5 0 0 1 7,0 v2.5" fill="none" '
        f'stroke="{colour}" stroke-width="2"/>'
    )
    canvas.rect(x, y + 6.5, 12, 8, rx=1.5, fill=colour)


def _draw_section(
    canvas: Canvas, run: Run, section: Section, geo: Geometry, colours: dict[str, SessionColour], uid: str
) -> float:
    """Draw one permutation starting at ``geo.top``; return the y below it."""
    inner = geo.lane_width - 24
    y = geo.top
    if section.heading:
        canvas.text(PAD, y + 16, section.heading, size=14, weight="bold", fill=MUTED)
        y += 28
    # lane headers (and the lock grid's column labels, wrapped: a row's name is never cut)
    labels = [_wrap(row, LOCK_COLUMN - 14, 11, "bold") for row in geo.locked] if geo.show_locks else []
    header_h = max([HEADER_H, *(16 + 13 * len(lines) for lines in labels)])
    for name in geo.sessions:
        x = geo.lane_x(name)
        canvas.add(f'<g class="lane-head" data-session={quoteattr(name)}>')
        canvas.rect(x, y, geo.lane_width, header_h - 6, rx=6, fill=colours[name].strong)
        canvas.text(x + geo.lane_width / 2, y + 23, name, size=16, weight="bold", fill="#ffffff", anchor="middle")
        canvas.add("</g>")
    if geo.show_locks and geo.locked:
        canvas.text(geo.grid_x, y - 6, geo.locks_title, size=11.5, weight="bold", fill=MUTED)
        for i, lines in enumerate(labels):
            cx = geo.grid_x + i * LOCK_COLUMN
            canvas.rect(cx, y, LOCK_COLUMN - 6, header_h - 6, rx=4, fill="#e5e7eb")
            top = y + (header_h - 6) / 2 - 13 * len(lines) / 2 + 10
            for number, line in enumerate(lines):
                canvas.text(
                    cx + (LOCK_COLUMN - 6) / 2, top + 13 * number, line, size=11, weight="bold", anchor="middle"
                )
    y += header_h
    lanes_top = y
    geo.rows = []
    for entry in section.entries:
        if entry.kind == "resume":
            y += RESUME_GAP
        height = _entry_height(entry, inner)
        geo.rows.append((y, height))
        y += height + ROW_GAP
    bottom = y
    # lane backgrounds go first, under everything
    lanes = Canvas()
    for name in geo.sessions:
        x = geo.lane_x(name)
        lanes.add(f'<g class="lane" data-session={quoteattr(name)}>')
        lanes.rect(x, lanes_top - 4, geo.lane_width, bottom - lanes_top - ROW_GAP + 8, rx=4, fill=colours[name].light)
        lanes.add("</g>")
    canvas.parts.extend(lanes.parts)
    _draw_lock_grid(canvas, section, geo, colours)
    for index, entry in enumerate(section.entries):
        _draw_entry(canvas, run, entry, index, geo, colours)
    for span in section.spans:
        _draw_wait(canvas, section, span, geo, colours, uid, bottom)
    return bottom


def _draw_entry(
    canvas: Canvas, run: Run, entry: Entry, index: int, geo: Geometry, colours: dict[str, SessionColour]
) -> None:
    y, height = geo.rows[index]
    x = geo.lane_x(entry.session) + 6
    width = geo.lane_width - 12
    colour = colours.get(entry.session)
    strong = colour.strong if colour else MUTED
    if entry.kind == "step" and entry.seq is not None:
        canvas.text(PAD + GUTTER - 12, y + 19, str(entry.seq), size=16, weight="bold", fill=MUTED, anchor="end")
    sqlstate = entry.error_state
    status = "error" if sqlstate else "waiting" if entry.waits and not entry.by_marker else entry.kind
    cls = "step error" if sqlstate else "step"
    attrs = f'class="{cls}" data-kind="{entry.kind}" data-session={quoteattr(entry.session)} data-status="{status}"'
    if entry.seq is not None:
        attrs += f' data-seq="{entry.seq}"'
    if sqlstate:
        attrs += f' data-sqlstate="{sqlstate}"'
    canvas.add(f"<g {attrs}>")
    tip = f"{entry.step}: {' '.join(entry.sql.split())}" if entry.sql else entry.text
    canvas.add(f"<title>{escape(tip)}</title>")
    if entry.kind == "notice":
        canvas.rect(x, y, 3, height - 4, fill=strong)
    else:
        failed = sqlstate or entry.kind in ("cancel", "lost")
        border = ERROR_COLOUR if failed else WAIT_COLOUR if status == "waiting" else strong
        if entry.kind == "resume":
            border = WAIT_COLOUR
        canvas.rect(x, y, width, height, rx=6, fill="#ffffff", stroke=border, stroke_width=3 if border != strong else 2)
    ty = y + 6
    for line in _block_lines(entry, geo.lane_width - 24):
        font, size, weight, style, fill = LINE_STYLE[line.kind]
        ty += _line_height(line.kind)
        canvas.text(x + 10, ty - 4, line.text, font=font, size=size, weight=weight, style=style, fill=fill)
    if sqlstate:
        badge = f"✗ {sqlstate}"
        bw = len(badge) * 12 * CHAR_EM["bold"] + 12
        canvas.rect(x + width - bw - 6, y - 9, bw, 18, rx=9, fill=ERROR_COLOUR)
        canvas.text(x + width - 6 - bw / 2, y + 4, badge, size=12, weight="bold", fill="#ffffff", anchor="middle")
    if entry.kind == "step" and entry.by_marker:
        canvas.text(x + 10, y + height - 8, "… reported later (completion marker)", size=12, style="italic", fill=MUTED)
    canvas.add("</g>")


def _band_top(entry: Entry, index: int, geo: Geometry) -> float:
    y, height = geo.rows[index]
    bands = _band_lines(entry, geo.lane_width - 24)
    return y + height - sum(len(b) * BAND_LINE + 10 for b in bands)


def _draw_wait(
    canvas: Canvas,
    section: Section,
    span: WaitSpan,
    geo: Geometry,
    colours: dict[str, SessionColour],
    uid: str,
    bottom: float,
) -> None:
    entry = section.entries[span.start]
    y, height = geo.rows[span.start]
    lane = geo.lane_x(span.session)
    x = lane + 6
    width = geo.lane_width - 12
    inner = geo.lane_width - 24
    band_y = _band_top(entry, span.start, geo)
    bar_top = y + height
    bar_bottom = geo.rows[span.end][0] if span.end is not None else bottom - ROW_GAP
    for wait, lines in zip(entry.waits, _band_lines(entry, inner), strict=False):
        holder = wait_holder(wait)
        points_at = wait_points_at(wait)
        target = wait_target(wait)
        band_h = len(lines) * BAND_LINE + 8
        attrs = (
            f'class="wait" data-seq="{span.seq}" data-waiter={quoteattr(span.session)} '
            f"data-holder={quoteattr(holder)} data-row={quoteattr(target)} "
            f"data-blocked-by={quoteattr(' '.join(wait.blocked_by))}"
        )
        canvas.add(f"<g {attrs}>")
        canvas.add(f"<title>{escape(span.session + ' ' + wait_phrase(wait))}</title>")
        canvas.rect(x, band_y, width, band_h, rx=4, fill=WAIT_COLOUR, class_="wait-band")
        _hourglass(canvas, x + 9, band_y + 6, "#ffffff")
        for i, text in enumerate(lines):
            canvas.text(x + 26, band_y + 17 + i * BAND_LINE, text, size=12.5, weight="bold", fill="#ffffff")
        # the bar down the waiting lane, until the step resumes (or the section ends)
        canvas.rect(
            lane + BAR_X, bar_top, 12, max(bar_bottom - bar_top, 6), fill=f"url(#{uid}-stripes)", class_="wait-bar"
        )
        length = bar_bottom - bar_top
        if length >= 26:
            label = f"waiting, {plural(span.steps_waited, 'step')}" if span.steps_waited else "waiting"
            if span.end is None:
                label = "still waiting"
            canvas.text(lane + BAR_X + 20, bar_top + length / 2 + 5, label, size=13, weight="bold", fill=WAIT_DARK)
        if points_at in geo.sessions and points_at != span.session:
            _draw_holder_badge(canvas, wait_badge(wait), points_at, band_y, band_h, span, geo, colours, uid)
        canvas.add("</g>")
    if span.end is not None:
        _draw_release(canvas, section, span, geo, uid)


def _draw_holder_badge(
    canvas: Canvas,
    label: str,
    holder: str,
    band_y: float,
    band_h: float,
    span: WaitSpan,
    geo: Geometry,
    colours: dict[str, SessionColour],
    uid: str,
) -> None:
    hx = geo.lane_x(holder)
    room = geo.lane_width - BADGE_X - 8
    lines = _wrap(label, room - 30, 12, "bold")  # wrapped, never cut: the whole fact is the point
    bw = min(room, max(len(line) for line in lines) * 12 * CHAR_EM["bold"] + 30)
    bh = 26 + 15 * (len(lines) - 1)
    by = band_y + band_h / 2 - bh / 2
    waiter_right = geo.lane_x(span.session) > hx
    bx = hx + BADGE_X if waiter_right else hx + geo.lane_width - 8 - bw
    colour = colours[holder]
    canvas.add(f'<g class="holder" data-session={quoteattr(holder)}>')
    canvas.rect(bx, by, bw, bh, rx=13, fill=colour.light, stroke=colour.strong, stroke_width=2)
    _padlock(canvas, bx + 9, by + 5, colour.strong)
    for number, line in enumerate(lines):
        canvas.text(bx + 26, by + 17.5 + 15 * number, line, size=12, weight="bold", fill=colour.strong)
    canvas.add("</g>")
    start = geo.lane_x(span.session) + (6 if waiter_right else geo.lane_width - 6)
    end = bx + bw + 3 if waiter_right else bx - 3
    mid = band_y + band_h / 2
    canvas.add(
        f'<line class="wait-arrow" x1="{start:.1f}" y1="{mid:.1f}" x2="{end:.1f}" y2="{mid:.1f}" '
        f'stroke="#ffffff" stroke-width="8" stroke-linecap="round"/>'
        f'<line class="wait-arrow" x1="{start:.1f}" y1="{mid:.1f}" x2="{end:.1f}" y2="{mid:.1f}" '
        f'stroke="{WAIT_DARK}" stroke-width="4" marker-end="url(#{uid}-arrow)"/>'
    )


def _draw_release(canvas: Canvas, section: Section, span: WaitSpan, geo: Geometry, uid: str) -> None:
    """A thin dashed arrow from the step that freed the waiter to its resume."""
    assert span.end is not None
    resume = section.entries[span.end]
    trigger = next(
        (
            i
            for i, e in enumerate(section.entries)
            if e.kind == "step" and e.seq == resume.released_by and e.session != resume.session
        ),
        None,
    )
    if trigger is None:
        return
    ty, th = geo.rows[trigger]
    ry, rh = geo.rows[span.end]
    t_lane = geo.lane_x(section.entries[trigger].session)
    r_lane = geo.lane_x(resume.session)
    if t_lane < r_lane:
        x1, x2 = t_lane + geo.lane_width - 6, r_lane + 3
    else:
        x1, x2 = t_lane + 6, r_lane + geo.lane_width - 3
    y1, y2 = ty + th / 2, ry + min(rh / 2, 18)
    canvas.add(
        f'<path class="release" d="M{x1:.1f},{y1:.1f} C{(x1 + x2) / 2:.1f},{y1:.1f} {(x1 + x2) / 2:.1f},{y2:.1f} '
        f'{x2:.1f},{y2:.1f}" fill="none" stroke="{MUTED}" stroke-width="2" stroke-dasharray="5 4" '
        f'marker-end="url(#{uid}-release)"/>'
    )


def _draw_lock_grid(canvas: Canvas, section: Section, geo: Geometry, colours: dict[str, SessionColour]) -> None:
    """One column per locked row; a cell per entry, in the holder's colour, labelled on change."""
    if not (geo.show_locks and geo.locked):
        return
    canvas.add('<g class="locks">')
    cell = LOCK_COLUMN - 6
    tops = [y for y, _ in geo.rows] + [geo.rows[-1][0] + geo.rows[-1][1] + 4 if geo.rows else 0.0]
    tops[0] -= 4
    for column, row in enumerate(geo.locked):
        cx = geo.grid_x + column * LOCK_COLUMN
        runs: list[tuple[int, int, tuple[tuple[str, str], ...] | None]] = []  # first, last entry, holders
        for index, entry in enumerate(section.entries):
            state = (
                None
                if entry.locks is None
                else tuple((lock.session, lock.mode) for lock in entry.locks if lock.describe_row() == row)
            )
            if runs and runs[-1][2] == state:
                runs[-1] = (runs[-1][0], index, state)
            else:
                runs.append((index, index, state))
        for first, last, holders in runs:
            y, height = tops[first], tops[last + 1] - tops[first]
            if holders is None:
                canvas.text(cx + cell / 2, y + 18, "?", size=13, fill=MUTED, anchor="middle")
            elif not holders:
                canvas.rect(cx, y, cell, height, fill="#f3f4f6")
            else:
                _draw_lock_cell(canvas, cx, y, cell, height, row, holders, colours, f"{first}-{last}")
    for span in section.spans:
        end = tops[span.end] if span.end is not None else tops[-1]
        for wait in span.waits:
            target = wait_target(wait)
            if target not in geo.locked:
                continue
            cx = geo.grid_x + geo.locked.index(target) * LOCK_COLUMN
            top = tops[span.start]
            canvas.add(f'<g class="lock-wait" data-row={quoteattr(target)} data-waiter={quoteattr(span.session)}>')
            canvas.rect(
                cx + 2, top + 2, cell - 4, end - top - 4, fill="none", stroke=WAIT_COLOUR, stroke_width=4,
                stroke_dasharray="8 4",
            )  # fmt: skip
            label_y = end - 10
            canvas.rect(cx + 6, label_y - 13, cell - 12, 18, rx=9, fill=WAIT_COLOUR)
            canvas.text(
                cx + cell / 2, label_y, f"{span.session} waits", size=11, weight="bold", fill="#ffffff",
                anchor="middle",
            )  # fmt: skip
            canvas.add("</g>")
    canvas.add("</g>")


def _draw_lock_cell(
    canvas: Canvas,
    x: float,
    y: float,
    width: float,
    height: float,
    row: str,
    holders: tuple[tuple[str, str], ...],
    colours: dict[str, SessionColour],
    entries: str,
) -> None:
    """A stripe per holder in its session's colour; as many labels as fit, then "+N more", never a fact cut.

    Every holder is in the cell's tooltip (``<title>``), which a browser shows on hover.
    """
    stripe = width / len(holders)
    listed = "; ".join(f"{session} {mode}" for session, mode in holders)
    canvas.add(f"<g class={quoteattr('lock-cell')} data-row={quoteattr(row)} data-holders={quoteattr(listed)}>")
    canvas.add(f"<title>{escape(f'{row}: {listed}')}</title>")
    for number, (session, mode) in enumerate(holders):
        colour = colours.get(session)
        canvas.rect(
            x + number * stripe,
            y + 1,
            stripe,
            height - 1,
            fill=colour.strong if colour else MUTED,
            class_="lock",
            data_row=row,
            data_session=session,
            data_mode=mode,
            data_entries=entries,
        )
    room = max(1, int((height - 6) // 30))
    shown = holders if len(holders) <= room else holders[: room - 1]
    ty = y + 17
    for session, mode in shown:
        for text, size, weight in ((session, 12.0, "bold"), (mode, 11.0, "normal")):
            fits = (width - 12) / max(1, len(text) * CHAR_EM["bold" if weight == "bold" else "sans"])
            canvas.text(x + 6, ty, text, size=min(size, max(7.0, fits)), weight=weight, fill="#ffffff")
            ty += 14
        ty += 2
    if len(shown) < len(holders):
        canvas.text(x + 6, ty, f"+{len(holders) - len(shown)} more", size=11, weight="bold", fill="#ffffff")
    canvas.add("</g>")


def _geometry(run: Run, section: Section, lane_width: int) -> Geometry:
    locked = section.locked_rows()
    title = locks_heading(run)
    if len(locked) > MAX_LOCK_COLUMNS:  # said, not dropped in silence
        title += f" (+{len(locked) - MAX_LOCK_COLUMNS} more rows: the JSON lists every lock)"
    return Geometry(run.scenario.session_names, lane_width, locked[:MAX_LOCK_COLUMNS], run.row_locks_available, title)


def lane_width_for(sessions: int, compact: bool = False) -> int:
    """Narrower lanes for more sessions, so three or four still fit a slide or a page."""
    width = DEFAULT_LANE_WIDTH if sessions <= 2 else 260 if sessions == 3 else 220
    return width - 40 if compact else width


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
        geo = _geometry(run, section, lane_width)
        geo.top = y
        y = _draw_section(canvas, run, section, geo, colours, uid) + 8
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
    return head + _defs(uid) + background + "".join(canvas.parts) + "</svg>"


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
