"""``log_line_prefix``: compiled into a matcher for the stderr format, or detected from the lines.

A prefix is a template (``%m [%p] %a %v %x ``); every line PostgreSQL writes in the stderr
format is that template expanded, then ``SEVERITY:  message``. The severity word is the
anchor that tells where a lazily matched field (``%a``, ``%u``, ``%d``) ends.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

__all__ = ["COMMON_PREFIXES", "PID", "SEVERITIES", "Prefix", "detect_prefix"]

#: The words a stderr line's message starts with: the primary severities and the
#: secondary fields PostgreSQL writes as lines of their own.
SEVERITIES = (
    "LOG",
    "ERROR",
    "FATAL",
    "PANIC",
    "WARNING",
    "NOTICE",
    "INFO",
    "DEBUG1",
    "DEBUG2",
    "DEBUG3",
    "DEBUG4",
    "DEBUG5",
    "DETAIL",
    "HINT",
    "CONTEXT",
    "STATEMENT",
    "QUERY",
    "LOCATION",
)

#: A process id as a prefix's ``%p`` writes it.
PID = r"\d{1,10}"

#: What each escape looks like in a line. Free-text fields match lazily, up to what follows, and
#: no longer than PostgreSQL writes them: names are at most NAMEDATALEN - 1 = 63 bytes, a host
#: name 255. Unbounded, a line that matches nowhere (a long statement full of spaces and '@'
#: against ``%u@%d %a``) makes the lazy fields backtrack cubically: minutes for 20 kB.
_ESCAPES = {
    "m": r"(?P<m>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}(?: [A-Za-z0-9+:-]+)?)",
    "t": r"(?P<t>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: [A-Za-z0-9+:-]+)?)",
    "n": r"(?P<n>\d+\.\d+)",
    "p": rf"(?P<p>{PID})",
    "P": r"(?:\d*)",
    "a": r"(?P<a>.{0,63}?)",
    "u": r"(?P<u>.{0,63}?)",
    "d": r"(?P<d>.{0,63}?)",
    "r": r"(?:.{0,300}?)",
    "h": r"(?:.{0,300}?)",
    "b": r"(?:.{0,63}?)",
    "i": r"(?:.{0,63}?)",
    "e": r"(?:[0-9A-Z]{5})",
    "c": r"(?:[0-9a-f]+\.[0-9a-f]+)",
    "l": r"(?:\d+)",
    "s": r"(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: [A-Za-z0-9+:-]+)?)",
    "v": r"(?P<v>\d+/\d+|)",
    "x": r"(?P<x>\d+)",
    "Q": r"(?:-?\d+)",
}


def _subsets(items: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Every ordered subset of ``items``, the largest first: a field may be left out, never moved."""
    out = [tuple(x for i, x in enumerate(items) if mask >> i & 1) for mask in range(1 << len(items))]
    return sorted(out, key=len, reverse=True)


def _shapes() -> tuple[str, ...]:
    """The common prefixes, each with and without each of its fields, most specific first.

    PostgreSQL's default since 10 (``%m [%p] ``) and what teams add to it (Debian's
    ``%q%u@%d``, ``%a``, ``%v``, ``%x``); pgBadger's key=value shapes (``user=%u,db=%d,app=%a,
    client=%h``, either order of user and db, with or without ``[%l-1]``), with ``%t`` or
    ``%m``; Amazon RDS's.
    """
    shapes: list[str] = []
    for time in ("%m", "%t"):
        for fields in _subsets(("%q%u@%d ", "%a ", "%v ", "%x ")):
            shapes.append(f"{time} [%p] " + "".join(fields))
        for first in (("user=%u", "db=%d"), ("db=%d", "user=%u")):
            for fields in _subsets((*first, "app=%a", "client=%h")):
                for line in ("[%l-1] ", ""):
                    shapes.append(f"{time} [%p]: {line}" + ",".join(fields) + (" " if fields else ""))
        shapes.append(f"{time} [%p] %q[user=%u,db=%d,app=%a] ")
        shapes.append(f"{time}:%r:%u@%d:[%p]:")
    shapes.append("%m ")
    shapes.append("")
    unique = list(dict.fromkeys(shapes))
    # More fields first; of as many, the one with fewer free-text fields (%x, not %a, for "[12] 0 LOG:").
    return tuple(sorted(unique, key=lambda t: (-t.count("%"), len(re.findall(r"%[audhrbi]", t)))))


#: Shapes seen in the wild, most specific first (see :func:`_shapes`).
COMMON_PREFIXES = _shapes()

_SEVERITY = "(?P<sev>" + "|".join(SEVERITIES) + "):  "


@dataclass(frozen=True)
class Prefix:
    """A compiled ``log_line_prefix``: ``match(line)`` gives the fields and where the message starts."""

    template: str
    pattern: re.Pattern[str]
    fields: frozenset[str]

    @classmethod
    def compile(cls, template: str) -> Prefix:
        """Compile a prefix; an escape PostgreSQL does not know is matched literally, as it prints it."""
        parts: list[str] = []
        fields: set[str] = set()
        optional = False
        i = 0
        while i < len(template):
            ch = template[i]
            if ch == "%" and i + 1 < len(template):
                # A padding width (%-10a) changes the spacing: matched as any run of spaces.
                j = i + 1
                while j < len(template) and (template[j].isdigit() or template[j] == "-"):
                    j += 1
                esc = template[j] if j < len(template) else ""
                padded = j > i + 1
                if esc == "%":
                    parts.append("%")
                elif esc == "q":
                    if not optional:  # the rest is only printed by session processes; a second %q adds nothing
                        parts.append("(?:")
                    optional = True
                elif esc in _ESCAPES:
                    group = _ESCAPES[esc]
                    if esc in fields:  # a field given twice: its second copy is not captured
                        group = re.sub(r"\(\?P<\w+>", "(?:", group)
                    elif "(?P<" in group:
                        fields.add(esc)
                    parts.append(r" *" + group + r" *" if padded else group)
                else:
                    parts.append(re.escape(template[i : j + 1]))
                i = j + 1
                continue
            parts.append(re.escape(ch))
            i += 1
        body = "".join(parts) + (")?" if optional else "")
        return cls(template, re.compile(body + _SEVERITY), frozenset(fields))

    def match(self, line: str) -> re.Match[str] | None:
        return self.pattern.match(line)


@functools.cache
def _compiled() -> list[Prefix]:
    return [Prefix.compile(t) for t in COMMON_PREFIXES]


def detect_prefix(lines: list[str]) -> tuple[Prefix, int] | None:
    """The common prefix that matches most of ``lines`` (ties: the more specific), and how many it matched.

    None when none matches even half of the lines that look like log lines (a timestamp or
    a severity near the start): the caller asks for ``--prefix``.
    """
    candidates = _compiled()
    best: tuple[Prefix, int] | None = None
    for prefix in candidates:
        hits = sum(1 for line in lines if prefix.match(line))
        if hits and (best is None or hits > best[1]):
            best = (prefix, hits)
    if best is None or best[1] * 2 < len(lines):
        return None
    return best
