"""Every lock wait of a load, as the server logged it: counted and attributed exactly, not sampled.

On a server pgrace starts, the load's scratch database runs with ``log_lock_waits = on`` and
``deadlock_timeout = 1ms``, so the server writes a ``still waiting for`` line for every lock
wait of its clients that lasts 1 ms or more, with what was waited for (a transaction, and the
row in CONTEXT; a tuple or a relation by OID) and, when it ends, ``acquired … after N ms``.
This module reads the load's own lines back (the log line prefix names the database) and
counts them. A wait shorter than 1 ms is not logged, and is not counted.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field

from pgrace.model.load import MAX_LOG_BYTES

#: A deadlock check runs after each wait of this length; the server logs the waits that reach it.
DEADLOCK_TIMEOUT = "1ms"

_LINE = re.compile(r"^\S+ \S+ \S+ \[(\d+)\] (.*?): (LOG|DETAIL|CONTEXT|STATEMENT|ERROR|HINT):  (.*)$")
_WAITING = re.compile(r"^process (\d+) still waiting for (\w+) on (.+?) after ([0-9.]+) ms$")
_ACQUIRED = re.compile(r"^process (\d+) acquired (\w+) on (.+?) after ([0-9.]+) ms$")
_TUPLE_CONTEXT = re.compile(r'^while (?:\w+ )+(?:tuple|index tuple) (\(\d+,\d+\)) in relation "((?:[^"]|"")+)"')
_TUPLE = re.compile(r"^tuple (\(\d+,\d+\)) of relation (\d+) of database \d+$")
_RELATION = re.compile(r"^relation (\d+) of database \d+$")


@dataclass
class LoggedWaits:
    """The lock waits one count's clients had, from the server's log."""

    count: int = 0
    waited_ms: float = 0.0  # the waits that ended (acquired), added up
    on: Counter[str] = field(default_factory=Counter)  # "a row of jobs" -> waits
    rows: Counter[tuple[str, str]] = field(default_factory=Counter)  # (relation, ctid) -> waits
    cut: bool = False  # the log was longer than MAX_LOG_BYTES: only its start was read


def log_offset(path: str) -> int:
    """Where the log ends now: a count reads what comes after."""
    return os.path.getsize(path)


def read_waits(path: str, offset: int, database: str, relations: dict[int, str]) -> LoggedWaits:
    """The waits ``database``'s sessions logged after ``offset``; ``relations`` names tables by OID."""
    found = LoggedWaits()
    pending: dict[int, str] = {}  # pid -> what its last wait was said to be for, until CONTEXT names the row
    with open(path, "rb") as log:
        log.seek(offset)
        data = log.read(MAX_LOG_BYTES + 1)
    if len(data) > MAX_LOG_BYTES:
        found.cut, data = True, data[:MAX_LOG_BYTES]
    for raw in data.decode("utf-8", errors="replace").splitlines():
        line = _LINE.match(raw)
        if line is None or line.group(2) != database:
            continue
        pid, kind, text = int(line.group(1)), line.group(3), line.group(4)
        if kind == "LOG" and (waiting := _WAITING.match(text)):
            found.count += 1
            target = waiting.group(3)
            described, row = _describe(target, relations)
            if row is not None:
                found.rows[row] += 1
            found.on[described] += 1
            if target.startswith("transaction "):
                pending[pid] = described
        elif kind == "LOG" and (acquired := _ACQUIRED.match(text)):
            found.waited_ms += float(acquired.group(4))
        elif kind == "CONTEXT" and pid in pending:
            context = _TUPLE_CONTEXT.match(text)
            if context is not None:  # a wait on a transaction, for a row: named by the CONTEXT line
                relation = context.group(2).replace('""', '"')
                found.on[pending[pid]] -= 1
                found.on[f"a row of {relation}"] += 1
                found.rows[(relation, context.group(1))] += 1
            pending.pop(pid)
        elif kind == "LOG":
            pending.pop(pid, None)
    found.on = +found.on  # drop the zero counts a CONTEXT line moved away
    return found


def _describe(target: str, relations: dict[int, str]) -> tuple[str, tuple[str, str] | None]:
    """What a logged wait waited for, in load's words, and the row (relation, ctid) when the line names it."""
    if target.startswith("transaction "):
        return "another transaction", None
    if tuple_ := _TUPLE.match(target):
        relation = relations.get(int(tuple_.group(2)), f"relation {tuple_.group(2)}")
        return f"a row of {relation}", (relation, tuple_.group(1))
    if relation_ := _RELATION.match(target):
        return f"table {relations.get(int(relation_.group(1)), 'relation ' + relation_.group(1))}", None
    if target.startswith("advisory lock"):
        return "an advisory lock", None
    return target.split(" ", 1)[0], None
