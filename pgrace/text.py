"""Scenario text and server text, made harmless for the medium they are written to.

A scenario file, an SQL error message, a value or a NOTIFY payload may hold control
characters: ``ESC[2J`` clears a terminal, an OSC sequence retitles its window, a C0 byte
makes SVG ill-formed XML (XML 1.0 forbids it even as a character reference), a bidi
override reorders what a reader sees. The policy lives here, once:

* :func:`visible` turns every such character into a visible stand-in of the same width
  where one exists (``␛`` for ESC, U+2400 "control pictures"), ``\\x9b`` or ``\\u202e``
  otherwise. Tab and newline are kept: SQL and narratives are laid out with them.
* :func:`without_controls` applies it to every string of a run or scenario, so a
  renderer works on clean data and adds its own markup (terminal colours included) after.
* each medium's syntax (HTML entities, XML, Mermaid entity codes, Markdown) is escaped
  by that medium's renderer, on text that has been through :func:`visible`.

JSON needs no stand-ins (``json.dumps`` escapes C0; :func:`json_safe` adds C1 and bidi as
``\\uXXXX``, which decode to the same data). The isolation format stays byte-identical to
isolationtester's, which prints server text raw: it is made visible only on a terminal.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, TypeVar

__all__ = ["control_in_name", "has_control", "json_safe", "visible", "without_controls"]

T = TypeVar("T")

#: Characters that act on a terminal or a reader instead of being shown: C0 but tab and
#: newline, DEL, C1, bidi embeddings/overrides/isolates, line/paragraph separators, and the
#: non-characters XML 1.0 forbids.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufffe\uffff]")


def _stand_in(char: str) -> str:
    code = ord(char)
    if code < 0x20:
        return chr(0x2400 + code)  # ␀ … ␟, ␛ for ESC
    if code == 0x7F:
        return "\u2421"  # ␡
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def has_control(text: str) -> bool:
    """Whether ``text`` holds a character :func:`visible` would replace."""
    return _CONTROL.search(text) is not None


def control_in_name(name: str) -> str | None:
    """``"U+001B"`` for the first control character in a name (tab and newline included), else None.

    Names (sessions, steps, scenarios, variables, parameters) label everything pgrace draws
    and are matched exactly, so they are refused at parse time rather than escaped.
    """
    m = re.search(f"[\t\n{_CONTROL.pattern[1:-1]}]", name)
    return f"U+{ord(m.group(0)):04X}" if m else None


def visible(text: str) -> str:
    """``text`` with every control character (but tab and newline) replaced by a visible stand-in."""
    return _CONTROL.sub(lambda m: _stand_in(m.group(0)), text)


def json_safe(text: str) -> str:
    """JSON text with the characters ``json.dumps`` leaves raw (C1, bidi, DEL) as ``\\uXXXX`` escapes.

    Only valid on ``json.dumps`` output: there such characters can only be inside strings.
    """
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


def without_controls(value: T) -> T:
    """A copy of ``value`` (a run, a scenario, an event …) with :func:`visible` applied to every string.

    Walks dataclasses, tuples, lists and dicts; returns the very same objects when there is
    nothing to replace, so the common case costs one walk and no copies.
    """
    memo: dict[int, Any] = {}

    def walk(obj: Any) -> Any:
        if isinstance(obj, str):
            return visible(obj) if _CONTROL.search(obj) else obj
        if obj is None or isinstance(obj, (int, float, bytes, bool)):
            return obj
        key = id(obj)
        if key in memo:
            return memo[key]
        memo[key] = obj  # a cycle ends at the original object
        result: Any = obj
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            changes = {}
            for f in dataclasses.fields(obj):
                if not f.init:
                    continue
                old = getattr(obj, f.name)
                new = walk(old)
                if new is not old:
                    changes[f.name] = new
            if changes:
                result = dataclasses.replace(obj, **changes)
        elif isinstance(obj, tuple) and not hasattr(obj, "_fields"):
            items = tuple(walk(x) for x in obj)
            if any(a is not b for a, b in zip(items, obj, strict=True)):
                result = items
        elif isinstance(obj, list):
            items_list = [walk(x) for x in obj]
            if any(a is not b for a, b in zip(items_list, obj, strict=True)):
                result = items_list
        elif isinstance(obj, dict):
            pairs = [(walk(k), walk(v)) for k, v in obj.items()]
            if any(a is not k or b is not v for (a, b), (k, v) in zip(pairs, obj.items(), strict=True)):
                result = dict(pairs)
        memo[key] = result
        return result

    out: T = walk(value)
    return out
