"""Advisory locks: their keys back from pg_locks' columns, and their level read from the SQL that took them."""

from __future__ import annotations

import re
from typing import Literal


def advisory_keys(classid: int, objid: int, objsubid: int) -> tuple[int, ...]:
    """pg_locks' oid columns back to the caller's key: one bigint (objsubid 1) or two int4."""
    if objsubid == 1:
        value = (classid << 32) | objid
        return (value - (1 << 64) if value >= 1 << 63 else value,)
    return tuple(v - (1 << 32) if v >= 1 << 31 else v for v in (classid, objid))


# The advisory-lock functions (functions-admin), by level; shared-ness is in the name.
_ADVISORY_CALL = re.compile(r"\bpg_(?:try_)?advisory_(?P<xact>xact_)?lock(?P<shared>_shared)?\s*\(", re.IGNORECASE)
_QUOTED = re.compile(r"'(?:[^']|'')*'|--[^\n]*|/\*.*?\*/", re.DOTALL)
_INTEGER = re.compile(r"\s*-?\d+\s*")


def advisory_level_in(query: str, keys: tuple[int, ...], shared: bool) -> Literal["session", "transaction"] | None:
    """The level of the advisory lock ``keys`` taken by this statement text, if it says.

    A call with these constant keys decides; without one, the level of every call of
    the right shared-ness whose keys are not constants, when they agree. Literals and
    comments are skipped.
    """
    text = _QUOTED.sub("''", query)
    levels: set[Literal["session", "transaction"]] = set()
    for call in _ADVISORY_CALL.finditer(text):
        if bool(call["shared"]) != shared:
            continue
        level: Literal["session", "transaction"] = "transaction" if call["xact"] else "session"
        args = _call_arguments(text, call.end())
        if all(_INTEGER.fullmatch(a) for a in args):
            if tuple(int(a) for a in args) == keys:
                return level
        else:
            levels.add(level)
    return levels.pop() if len(levels) == 1 else None


def _call_arguments(text: str, start: int) -> list[str]:
    """The top-level arguments of the call whose "(" ends just before ``start``."""
    depth, args, current = 0, [], ""
    for char in text[start:]:
        if char == ")" and depth == 0:
            break
        if char == "," and depth == 0:
            args.append(current)
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current += char
    return [*args, current]
