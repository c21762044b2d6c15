"""Scratch names and their advisory locks: an object is recognisable as pgrace's from its first instant."""

from __future__ import annotations

import hashlib
import re
import secrets

_PREFIX = "pgrace_"
_MAX_NAME_BYTES = 63  # NAMEDATALEN - 1: longer names would be silently truncated
_WATCHER_SUFFIX = "_watch"  # a run's observer role is its role's name with this: it must fit too
_RANDOM_HEX = 8
_TAG_HEX = 4
_NAME = re.compile(rf"{_PREFIX}[a-z0-9_]*_[0-9a-f]{{{_RANDOM_HEX + _TAG_HEX}}}")
_LOCK_CLASS = 0x70677263  # "pgrc": the first key of every scratch lock, apart from the keys apps use
_END_SESSIONS_DEADLINE_S = 5.0
_DROP_LOCK_TIMEOUT = "5s"  # a drop waits this long for locks, then leaves the object to a later sweep


def scratch_name(hint: str) -> str:
    """``pgrace_<sanitised hint>_<random hex><tag>``, at most 63 bytes, safe unquoted.

    The tag is derived from the rest of the name, so a name is recognisable as one pgrace
    made (a user's ``pgrace_something`` is not) without anything stored beside it.
    """
    cleaned = re.sub(r"[^a-z0-9_]+", "_", hint.lower()).strip("_")
    room = _MAX_NAME_BYTES - len(_PREFIX) - 1 - _RANDOM_HEX - _TAG_HEX - len(_WATCHER_SUFFIX)
    cleaned = cleaned[:room].rstrip("_") or "run"
    stem = f"{_PREFIX}{cleaned}_{secrets.token_hex(_RANDOM_HEX // 2)}"
    return stem + _tag(stem)


def _tag(stem: str) -> str:
    return hashlib.sha256(f"pgrace scratch {stem}".encode()).hexdigest()[:_TAG_HEX]


def is_scratch_name(name: str) -> bool:
    """Whether pgrace made this name (see :func:`scratch_name`)."""
    return _NAME.fullmatch(name) is not None and _tag(name[:-_TAG_HEX]) == name[-_TAG_HEX:]


def lock_key(name: str) -> tuple[int, int]:
    """The two int4 keys of the advisory lock that says a scratch object's run is alive."""
    return _LOCK_CLASS, int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) & 0x7FFFFFFF
