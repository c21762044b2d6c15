"""What every renderer shares, so the text, presenter, HTML, SVG, Mermaid and Markdown
outputs say the same things in the same words and paint each session the same colour.

* :data:`PALETTE`: one colour per session position, as a terminal colour name, a strong
  and a light hex colour, and a coloured square for Markdown.
* layout: :func:`shorten`, :func:`shorten_sql`, :func:`wrap_cell` and :func:`sql_lines`
  (SQL broken at its clauses), text fitted to a width.

The rest of the shared vocabulary lies beside it: :mod:`pgrace.render.wording` (waits,
outcomes, releases and locks in words), :mod:`pgrace.render.sections` (the run folded into
drawable rows), :mod:`pgrace.render.story` (what happened, in sentences) and
:mod:`pgrace.render.columns` (steps side by side). All of it is pure: a
:class:`~pgrace.model.timeline.Run` in, values out.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

MAX_ROWS_SHOWN = 4
QUIET_TAGS = {"BEGIN", "COMMIT", "SET", "START TRANSACTION"}  # a COMMIT that rolled back still shows


@dataclass(frozen=True)
class SessionColour:
    """One session's colour in every format: terminal name, strong and light hex, square."""

    terminal: str
    strong: str
    light: str
    square: str


PALETTE = (
    SessionColour("cyan", "#0e7490", "#cffafe", "🟦"),
    SessionColour("magenta", "#a21caf", "#fae8ff", "🟪"),
    SessionColour("yellow", "#a16207", "#fef9c3", "🟨"),
    SessionColour("green", "#15803d", "#dcfce7", "🟩"),
    SessionColour("blue", "#1d4ed8", "#dbeafe", "🔷"),
    SessionColour("red", "#b91c1c", "#fee2e2", "🟥"),
    SessionColour("bright_cyan", "#0891b2", "#ecfeff", "🔹"),
    SessionColour("bright_magenta", "#c026d3", "#fdf4ff", "🟣"),
)
SESSION_COLOURS = tuple(c.terminal for c in PALETTE)

WAIT_COLOUR = "#ea580c"  # the wait bars and arrows: orange, no session has it
WAIT_DARK = "#9a3412"
ERROR_COLOUR = "#dc2626"
OK_COLOUR = "#15803d"


def session_colours(sessions: list[str]) -> dict[str, SessionColour]:
    """A session's colour follows its position in the scenario, in every format."""
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(sessions)}


def one_line(sql: str) -> str:
    return " ".join(sql.split()) or "(empty step)"


def shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(1, limit - 1)].rstrip() + "…"


def shorten_sql(sql: str, limit: int) -> str:
    """SQL cut to ``limit`` characters at a clause boundary, else a word boundary, never mid-word.

    ``UPDATE accounts SET balance = balance + 10 WHERE id = 2`` at 24 becomes
    ``UPDATE accounts …``; a first word longer than the limit is kept whole.
    """
    text = one_line(sql)
    if len(text) <= limit:
        return text
    statements = _statements(text)
    clauses = _clauses(statements[0]) if statements else [text]
    kept = clauses[0]
    for clause in clauses[1:]:
        if len(kept) + 1 + len(clause) + 2 > limit:
            break
        kept += " " + clause
    if len(kept) + 2 > limit:  # even the first clause is too long: cut it between words
        words = kept.split(" ")
        kept = words[0]
        for word in words[1:]:
            if len(kept) + 1 + len(word) + 2 > limit:
                break
            kept += " " + word
    return kept if kept == text else kept + " …"


_TOKEN_BREAK = re.compile(r"(?<=[(,])(?=.)")  # after an opening parenthesis or a comma: between tokens


_JOINT = "\x01 "


def wrap_cell(text: str, width: int, indent: str = "  ") -> list[str]:
    """Wrap at spaces, never inside a token.

    A word longer than the line stays whole, except that a long call may break after its
    ``(`` or a ``,`` (``current_setting(`` / ``'application_name')``) when both sides are
    substantial: ``pg_advisory_xact_lock(42)`` and ``(AccessExclusiveLock)`` stay whole.
    """
    room = max(1, width - len(indent))
    words = [word if len(word) <= room else _JOINT.join(_token_pieces(word, room)) for word in text.split(" ")]
    wrapped = textwrap.wrap(
        " ".join(words), width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )
    return [line.replace(_JOINT, "").replace(_JOINT[0], "") for line in wrapped] or [""]


def _token_pieces(word: str, room: int) -> list[str]:
    """A long token cut after ``(`` or ``,``: as late as fits, each side at least a few characters."""
    if len(word) <= room:
        return [word]
    cuts = [m.start() for m in _TOKEN_BREAK.finditer(word) if m.start() >= 8 and len(word) - m.start() >= 4]
    if not cuts:
        return [word]
    fitting = [cut for cut in cuts if cut <= room]
    cut = fitting[-1] if fitting else cuts[0]
    return [word[:cut], *_token_pieces(word[cut:], room)]


_CLAUSE = re.compile(
    r"\s+(?=(?:FROM|WHERE|ORDER\s+BY|GROUP\s+BY|HAVING|LIMIT|OFFSET|FOR\s+(?:NO\s+KEY\s+)?UPDATE"
    r"|FOR\s+(?:KEY\s+)?SHARE|SET|VALUES|RETURNING|ON\s+CONFLICT)\b)",
    re.IGNORECASE,
)


def _statements(sql: str) -> list[str]:
    """Split on semicolons outside quotes, each statement keeping its semicolon."""
    out: list[str] = []
    quote = ""
    current = ""
    for char in sql:
        current += char
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == ";":
            out.append(current.strip())
            current = ""
    if current.strip():
        out.append(current.strip())
    return out


def _clauses(statement: str) -> list[str]:
    pieces: list[str] = []
    start = 0
    for match in _CLAUSE.finditer(statement):
        before = statement[: match.start()]
        if before.count("'") % 2 == 0 and before.count('"') % 2 == 0:
            pieces.append(statement[start : match.start()])
            start = match.end()
    pieces.append(statement[start:])
    return [p for p in pieces if p]


def sql_lines(sql: str, width: int, max_lines: int | None = None) -> list[str]:
    """SQL on lines of at most ``width`` characters, broken before its clauses.

    Short statements stay on one line; a long one breaks before FROM, WHERE, ORDER BY,
    FOR UPDATE, SET and so on, continuation lines indented, so a projector or a picture
    shows its shape. Beyond ``max_lines`` the last line ends with an ellipsis.
    """
    width = max(12, width)
    lines: list[str] = []
    for statement in _statements(one_line(sql)):
        chunks: list[str] = []
        for piece in _clauses(statement):
            room = width - (2 if chunks else 0)
            if chunks and len(chunks[-1]) + 1 + len(piece) <= room:
                chunks[-1] += " " + piece
            else:
                chunks.append(piece)
        for i, chunk in enumerate(chunks):
            indent = "  " if i else ""
            lines += [indent + line for line in wrap_cell(chunk, width - len(indent))]
    if max_lines is not None and len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][: width - 2].rstrip() + " …"
    return lines or ["(empty step)"]
