"""Where everything goes in the picture: fonts and sizes, lanes, the lock grid, each entry's height.

Text widths are estimated from the font size (DejaVu-like fonts): no measuring, no external assets.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

from pgrace.model.timeline import Run
from pgrace.render.common import ERROR_COLOUR, WAIT_DARK, sql_lines
from pgrace.render.sections import LaneEntry, Section
from pgrace.render.wording import locks_heading, wait_phrase

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


def line_height(kind: str) -> float:
    return LINE_STYLE[kind][1] * 1.38


def _chars(width: float, size: float, kind: str = "sans") -> int:
    return max(8, int(width / (size * CHAR_EM[kind])))


def wrap_text(text: str, width: float, size: float, kind: str = "sans") -> list[str]:
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


def block_lines(entry: LaneEntry, inner: float) -> list[Line]:
    lines: list[Line] = []
    if entry.kind == "step":
        lines += [Line(t, "sql") for t in sql_lines(entry.sql, _chars(inner, 13, "mono"), max_lines=5)]
        if entry.note:
            lines += [Line(t, "note") for t in wrap_text("» " + entry.note, inner, 12.5)]
    elif entry.kind == "resume":
        after = f"↳ step {entry.seq} {entry.release_text}"
        lines += [Line(t, "resume") for t in wrap_text(after, inner, 12.5, "bold")]
    elif entry.kind == "cancel":
        lines += [Line(t, "error") for t in wrap_text(f"✗ {entry.step} {entry.text}", inner, 12.5, "bold")]
    elif entry.kind == "lost":
        lines += [Line(t, "error") for t in wrap_text(entry.text, inner, 12.5, "bold")]
    else:
        lines += [Line(t, "plain") for t in wrap_text(entry.text, inner, 12.0)]
    if entry.outcome is not None:
        for text in entry.outcome_lines():
            if text.startswith("✗"):
                lines += [Line(t, "error") for t in wrap_text(text.replace("✗ ERROR ", "✗ "), inner, 12.5, "bold")]
            else:
                lines += [Line(t, "result") for t in wrap_text(text, inner, 13, "mono")]
    return lines


def band_lines(entry: LaneEntry, inner: float) -> list[list[str]]:
    if entry.kind != "step" or entry.by_marker:
        return []
    return [wrap_text(wait_phrase(w), inner - 18, 12.5, "bold") for w in entry.waits]


def entry_height(entry: LaneEntry, inner: float) -> float:
    if entry.kind == "notice":
        return 8 + sum(line_height(line.kind) for line in block_lines(entry, inner))
    height = 12 + sum(line_height(line.kind) for line in block_lines(entry, inner))
    for band in band_lines(entry, inner):
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


def geometry(run: Run, section: Section, lane_width: int) -> Geometry:
    locked = section.locked_rows()
    title = locks_heading(run)
    if len(locked) > MAX_LOCK_COLUMNS:  # said, not dropped in silence
        title += f" (+{len(locked) - MAX_LOCK_COLUMNS} more rows: the JSON lists every lock)"
    return Geometry(run.scenario.session_names, lane_width, locked[:MAX_LOCK_COLUMNS], run.row_locks_available, title)


def lane_width_for(sessions: int, compact: bool = False) -> int:
    """Narrower lanes for more sessions, so three or four still fit a slide or a page."""
    width = DEFAULT_LANE_WIDTH if sessions <= 2 else 260 if sessions == 3 else 220
    return width - 40 if compact else width
