"""Drawing one section of the picture: steps, wait bands, arrows and bars, holder badges, releases, the lock grid."""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from pgrace.model.timeline import Run
from pgrace.render.common import ERROR_COLOUR, WAIT_COLOUR, WAIT_DARK, SessionColour
from pgrace.render.sections import LaneEntry, Section, WaitSpan
from pgrace.render.svg.layout import (
    BADGE_X,
    BAND_LINE,
    BAR_X,
    CHAR_EM,
    GUTTER,
    HEADER_H,
    LINE_STYLE,
    LOCK_COLUMN,
    MUTED,
    PAD,
    RESUME_GAP,
    ROW_GAP,
    Canvas,
    Geometry,
    band_lines,
    block_lines,
    entry_height,
    line_height,
    wrap_text,
)
from pgrace.render.wording import plural, wait_badge, wait_holder, wait_phrase, wait_points_at, wait_target


def svg_defs(uid: str) -> str:
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


def draw_section(
    canvas: Canvas, run: Run, section: Section, geo: Geometry, colours: dict[str, SessionColour], uid: str
) -> float:
    """Draw one permutation starting at ``geo.top``; return the y below it."""
    inner = geo.lane_width - 24
    y = geo.top
    if section.heading:
        canvas.text(PAD, y + 16, section.heading, size=14, weight="bold", fill=MUTED)
        y += 28
    # lane headers (and the lock grid's column labels, wrapped: a row's name is never cut)
    labels = [wrap_text(row, LOCK_COLUMN - 14, 11, "bold") for row in geo.locked] if geo.show_locks else []
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
        height = entry_height(entry, inner)
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
    canvas: Canvas, run: Run, entry: LaneEntry, index: int, geo: Geometry, colours: dict[str, SessionColour]
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
    for line in block_lines(entry, geo.lane_width - 24):
        font, size, weight, style, fill = LINE_STYLE[line.kind]
        ty += line_height(line.kind)
        canvas.text(x + 10, ty - 4, line.text, font=font, size=size, weight=weight, style=style, fill=fill)
    if sqlstate:
        badge = f"✗ {sqlstate}"
        bw = len(badge) * 12 * CHAR_EM["bold"] + 12
        canvas.rect(x + width - bw - 6, y - 9, bw, 18, rx=9, fill=ERROR_COLOUR)
        canvas.text(x + width - 6 - bw / 2, y + 4, badge, size=12, weight="bold", fill="#ffffff", anchor="middle")
    if entry.kind == "step" and entry.by_marker:
        canvas.text(x + 10, y + height - 8, "… reported later (completion marker)", size=12, style="italic", fill=MUTED)
    canvas.add("</g>")


def _band_top(entry: LaneEntry, index: int, geo: Geometry) -> float:
    y, height = geo.rows[index]
    bands = band_lines(entry, geo.lane_width - 24)
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
    for wait, lines in zip(entry.waits, band_lines(entry, inner), strict=False):
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
    lines = wrap_text(label, room - 30, 12, "bold")  # wrapped, never cut: the whole fact is the point
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
