"""Bounds on scenario and spec input, checked before any parser sees it.

A parser must answer any text quickly with one located error, and some inputs defeat
that: ``x = [[[[…]]]]`` 500 deep makes ``tomllib`` recurse past Python's limit, and a
100,000-part dotted key keeps it busy for minutes. Real scenarios are far inside these
limits (the largest PostgreSQL isolation spec is 11 kB, its longest line 259 characters;
pgrace's own scenarios nest 3 deep with 3-part keys), so anything beyond them is refused
as invalid input (exit 2) with the file and line where the limit was crossed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pgrace.errors import ScenarioError

MAX_FILE_BYTES = 1024 * 1024
"""A scenario or spec file is at most 1 MiB."""
MAX_LINE_CHARS = 100_000
"""A line is at most 100,000 characters (a generated spec may put 3,000 steps on one line)."""
MAX_NESTING = 32
"""TOML arrays and inline tables nest at most 32 deep."""
MAX_KEY_PARTS = 16
"""A TOML dotted key (or table header) has at most 16 parts: ``a.b.c`` has 3."""
MAX_STEPS = 20_000
"""A scenario has at most 20,000 steps once its retry loops are unrolled (each attempt is a copy of its loop).

Every step is a launch, an event and a line of the timeline, and explore orders them all:
a file of 600 kB can ask for a million attempts with ``max = 10`` loops over long sessions.
"""

LIMITS_TEXT = (
    f"{MAX_FILE_BYTES // 1024 // 1024} MiB per file, {MAX_LINE_CHARS:,} characters per line, "
    f"TOML nested {MAX_NESTING} deep and {MAX_KEY_PARTS} parts per dotted key, "
    f"and {MAX_STEPS:,} steps once retry loops are unrolled"
)


def read_text(path: Path) -> str:
    """The file's text, refused beyond MAX_FILE_BYTES or when it is not UTF-8, without reading it all."""
    source = str(path)
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ScenarioError(f"cannot read: {exc.strerror or exc}", source) from None
    return decode(data, source)


def decode(data: bytes, source: str) -> str:
    """UTF-8 text of a file's bytes, refused (with the line) beyond MAX_FILE_BYTES or when not UTF-8."""
    if len(data) > MAX_FILE_BYTES:
        line = data.count(b"\n", 0, MAX_FILE_BYTES) + 1
        raise ScenarioError(f"file is larger than {MAX_FILE_BYTES // 1024 // 1024} MiB, pgrace's limit", source, line)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        bad = data[exc.start : exc.start + 1].hex()
        raise ScenarioError(f"not UTF-8: byte 0x{bad} at column {column}", source, line) from None


def check_text(text: str, source: str) -> None:
    """Size, line length and NUL: what every format must refuse before parsing."""
    if len(text) > MAX_FILE_BYTES:  # characters: at least as many bytes
        line = text.count("\n", 0, MAX_FILE_BYTES) + 1
        raise ScenarioError(f"file is larger than {MAX_FILE_BYTES // 1024 // 1024} MiB, pgrace's limit", source, line)
    nul = text.find("\0")
    if nul >= 0:  # libpq would silently cut the SQL at a NUL
        raise ScenarioError("NUL character (\\0) in the file", source, text.count("\n", 0, nul) + 1)
    for number, line_text in enumerate(text.split("\n"), 1):
        if len(line_text) > MAX_LINE_CHARS:
            raise ScenarioError(f"line longer than {MAX_LINE_CHARS:,} characters, pgrace's limit", source, number)


# What the TOML scan stops at: string and comment openers, brackets, dots, newlines, and
# any other character that is not part of a bare key or blank (it ends a dotted key).
_TOML_STOP = re.compile(r"""\"\"\"|'''|["'#\[\]{}.\n]|[^ \tA-Za-z0-9_\-"'#\[\]{}.\n]""")
_END_OF = {
    '"""': re.compile(r'(?:[^"\\]|\\.|"(?!""))*"""("{0,2})', re.DOTALL),
    "'''": re.compile(r"(?:[^']|'(?!''))*'''('{0,2})", re.DOTALL),
    '"': re.compile(r'(?:[^"\\\n]|\\.)*"'),
    "'": re.compile(r"[^'\n]*'"),
}


def check_toml(text: str, source: str) -> None:
    """Nesting depth and dotted-key length, found by a scan that skips strings and comments."""
    check_text(text, source)
    depth = 0
    parts = 1
    line = 1
    pos = 0
    while (match := _TOML_STOP.search(text, pos)) is not None:
        token = match.group()
        pos = match.end()
        if token in _END_OF:
            end = _END_OF[token].match(text, pos)
            closed = end.end() if end is not None else len(text)
            line += text.count("\n", pos, closed)
            pos = closed
            continue
        if token == "#":
            newline = text.find("\n", pos)
            pos = len(text) if newline < 0 else newline
            continue
        if token == ".":
            parts += 1
            if parts > MAX_KEY_PARTS:
                raise ScenarioError(f"dotted key with more than {MAX_KEY_PARTS} parts, pgrace's limit", source, line)
            continue
        parts = 1
        if token == "\n":
            line += 1
        elif token in "[{":
            depth += 1
            if depth > MAX_NESTING:
                raise ScenarioError(f"nested more than {MAX_NESTING} deep, pgrace's limit", source, line)
        elif token in "]}":
            depth = max(0, depth - 1)


def nul_in(data: Any, path: tuple[str | int, ...] = ()) -> tuple[str | int, ...] | None:
    """The key path of the first string value holding NUL (TOML's ``\\u0000``), if any."""
    if isinstance(data, str):
        return path if "\0" in data else None
    items: Any = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        if isinstance(key, str) and "\0" in key:
            return (*path, key)
        found = nul_in(value, (*path, key))
        if found is not None:
            return found
    return None
