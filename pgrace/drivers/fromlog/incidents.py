"""Incidents in a server log: deadlocks, and lock waits longer than ``deadlock_timeout``.

PostgreSQL says what it knows in a few messages. With ``log_lock_waits``: "process N
still waiting for ShareLock on transaction M after 1000.1 ms" with "Process holding the
lock: X. Wait queue: Y." and the waiter's CONTEXT and STATEMENT. On a deadlock, the
victim's ERROR with one DETAIL line per edge of the cycle ("Process A waits for … blocked
by process B.") and each process's statement. With ``log_statement``, every statement, in
the order the server received them; ``%v`` groups them by transaction.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from pgrace.drivers.fromlog.records import Hit, LogFormat, Record, Scanned
from pgrace.drivers.fromlog.stream import Group, around, groups
from pgrace.errors import ScenarioError
from pgrace.model.fromlog import Incident, Listed, LoggedStatement, LoggedWait
from pgrace.model.timeline import RELEASE_CAUSES

__all__ = ["find_incidents", "reread"]

_WAITING = re.compile(r"process (\d+) still waiting for (.+?) after ([\d.]+) ms")
_HOLDERS = re.compile(r"Process(?:es)? holding the lock: ([\d, ]+)\. Wait queue: ([\d, ]*)\.")
_PID = re.compile(r"[1-9]\d{0,9}\Z")  # a process id: a positive 32-bit number, at most 10 digits
_MS = re.compile(r"\d{1,15}(?:\.\d{1,9})?\Z")
_EDGE = re.compile(r"Process (\d+) waits for (.+?); blocked by process (\d+)\.")
_STATEMENT_OF = re.compile(r"Process (\d+): (.*)", re.S)
_TUPLE = re.compile(r'while (\w+(?: \w+)*?) tuple \((\d+),(\d+)\) in relation "([^"]+)"')
_RELATION = re.compile(r'relation "([^"]+)"')
_ENDS = ("COMMIT", "ROLLBACK", "END", "ABORT")
_BEGINS = ("BEGIN", "START TRANSACTION")
_WRITES = ("INSERT", "UPDATE", "DELETE", "MERGE")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*\Z")

#: What one incident may hold: logs are written by anyone who can connect, and a lock with
#: 10,000 holders, or the same two pids in 20,000 incidents of one stretch, must cost no more
#: than a real incident. Beyond these, the rest is cut and the incident says what was.
MAX_PROCESSES = 32  # sessions of one scenario (a waiter and its holders, a cycle's processes)
BEFORE = 200  # a process's records read before the report (its transaction's statements)
AFTER = 50  # and after it (how its transaction ended)
MAX_STEPS = 1_000  # statements of one incident


@dataclass
class Found:
    """The incidents of the files read, and what could not be read."""

    incidents: list[Listed] = field(default_factory=list)
    skipped: int = 0
    lines: int = 0
    unreadable: list[str] = field(default_factory=list)


class _Unreadable(Exception):
    """A report whose numbers are not the server's (a pid of 5,000 digits, ``after 1.2.3 ms``)."""


def _pid(text: str) -> int:
    if not _PID.match(text) or int(text) > 2**31:
        raise _Unreadable(f"{text[:20]!r}{'...' if len(text) > 20 else ''} is not a process id")
    return int(text)


def _pids(text: str) -> list[int]:
    """``1, 2, 3`` as PostgreSQL lists processes: an empty item or a trailing comma is not its list."""
    return [_pid(item.strip()) for item in text.split(",")]


def _ms(text: str) -> float:
    if not _MS.match(text):
        raise _Unreadable(f"{text[:20]!r} is not a duration in ms")
    return float(text)


@dataclass
class _Stretch:
    """A window's records, indexed once by line and by process: each incident reads its own, not the whole window."""

    records: list[Record]
    by_line: dict[int, list[int]] = field(default_factory=dict)
    by_pid: dict[int, list[int]] = field(default_factory=dict)
    lock_waits: list[int] = field(default_factory=list)  # the "still waiting" reports

    def __post_init__(self) -> None:
        for pos, r in enumerate(self.records):
            self.by_line.setdefault(r.line, []).append(pos)
            if r.pid is not None:
                self.by_pid.setdefault(r.pid, []).append(pos)
            if r.severity == "LOG" and r.message[:8] == "process " and _WAITING.match(r.message):
                self.lock_waits.append(pos)

    def of(self, pids: set[int], index: int) -> list[int]:
        """The positions of the records of ``pids`` near ``index`` (``BEFORE`` and ``AFTER`` each), in log order."""
        near: list[int] = []
        for pid in pids:
            at = self.by_pid.get(pid, [])
            middle = bisect.bisect_right(at, index)
            near += at[max(0, middle - BEFORE) : middle + AFTER]
        return sorted(near)


def find_incidents(paths: list[str], formats: list[LogFormat]) -> Found:
    """Every incident of ``paths``, listed in log order; the line counts and the reports that were cut short.

    Each is kept as its :class:`Listed` line only, and read without its statements, which
    only the written incident needs (:func:`reread` gives it whole).
    """
    found = Found()
    for path, fmt in zip(paths, formats, strict=True):
        scanned = Scanned()
        waits: list[tuple[Listed, tuple[int, str]]] = []
        in_cycles: set[tuple[int, str]] = set()
        for group in groups(path, fmt, scanned):
            for incident, hit in _incidents_of(path, fmt, group, found, whole=False):
                listed = Listed(incident.kind, incident.file, incident.line, hit.offset, incident.summary)
                if incident.kind == "lock wait":
                    waits.append((listed, (incident.waits[0].waiter, incident.waits[0].lock)))
                else:
                    found.incidents.append(listed)
                    in_cycles.update((w.waiter, w.lock) for w in incident.waits)
            del group  # its records go before the next group's are read
        found.lines += scanned.lines
        # A wait that was one edge of a deadlock is told with the deadlock, not again on its own.
        found.incidents += [listed for listed, edge in waits if edge not in in_cycles]
    found.incidents.sort(key=lambda i: (paths.index(i.file), i.line))
    return found


def _incidents_of(
    path: str, fmt: LogFormat, group: Group, found: Found, *, whole: bool
) -> Iterator[tuple[Incident, Hit]]:
    """The incidents a group's hits report: the processes each report names are read around them, then each hit.

    ``whole``: with the statements of their transactions (``steps``), which only the incident written needs.
    """
    named: set[int] = set()
    for hit in group.hits:
        report = group.report(hit)
        named |= _named(report, hit.line) if report is not None else set()
    current = group.window(named, BEFORE + 1, AFTER + 1)
    found.skipped += current.skipped
    stretch = _Stretch(current.records)
    for hit in group.hits:
        for incident in _incidents_at(path, fmt, stretch, hit.line, found.unreadable, whole):
            yield incident, hit


def _named(report: list[Record], line: int) -> set[int]:
    """The processes the report at ``line`` names (a superset: its pid, a cycle's, a lock's first holders)."""
    named: set[int] = set()
    for record in report:
        if record.line != line or record.pid is None:
            continue
        named.add(record.pid)
        if m := _WAITING.match(record.message):
            named.update(int(p) for p in [m.group(1)] if _PID.match(p))
        holders = _HOLDERS.match(record.detail)
        for part in holders.group(1).split(",") if holders else []:
            if len(named) > MAX_PROCESSES:  # the waiter and the first 31 others are the incident's
                break
            if _PID.match(part.strip()):
                named.add(int(part.strip()))
        for edge in record.detail.split("\n")[: MAX_PROCESSES + 1]:
            if m := _EDGE.match(edge):
                named.update(int(p) for p in (m.group(1), m.group(3)) if _PID.match(p))
    return named


def reread(listed: Listed, fmt: LogFormat) -> Incident:
    """The incident ``listed`` found again, whole (its statements too), from the stretch of log around its report."""
    hit = Hit(listed.offset, listed.line)
    for again, _ in _incidents_of(listed.file, fmt, around(listed.file, fmt, hit), Found(), whole=True):
        if again.kind == listed.kind:
            return again
    raise ScenarioError(
        f"the {listed.kind} listed here is not found again: a bug in pgrace, please report it", listed.file, listed.line
    )


def _incidents_at(
    path: str, fmt: LogFormat, stretch: _Stretch, line: int, unreadable: list[str], whole: bool
) -> Iterator[Incident]:
    for index in stretch.by_line.get(line, []):
        record = stretch.records[index]
        try:
            incident = _incident(path, fmt, stretch, index, whole)
        except _Unreadable as exc:
            unreadable.append(f"{path}:{record.line}: a report pgrace cannot read: {exc}")
            continue
        if isinstance(incident, str):
            unreadable.append(f"{path}:{record.line}: {incident}")
        elif incident is not None:
            yield incident


def _incident(path: str, fmt: LogFormat, stretch: _Stretch, index: int, whole: bool) -> Incident | str | None:
    """The incident the record at ``index`` reports, what is missing from its report, or None (not a report)."""
    record = stretch.records[index]
    if record.message == "deadlock detected" and record.severity == "ERROR":
        return _deadlock(path, fmt, stretch, index, whole) or "a deadlock report without its cycle (cut short?)"
    if record.severity == "LOG" and (m := _WAITING.match(record.message)):
        holders = _HOLDERS.match(record.detail)
        if holders is None or record.pid is None:
            return "a lock wait report without its holders (cut short?)"
        listed = _pids(holders.group(1))
        waiter = _pid(m.group(1))
        others = list(dict.fromkeys(p for p in listed if p != waiter))
        kept = others[: MAX_PROCESSES - 1]
        wait = _wait_from(record, waiter, m.group(2), [p for p in listed if p in set(kept) or p == waiter])
        wait.after_ms = _ms(m.group(3))
        incident = Incident("lock wait", path, record.line, record.time, record.database, [waiter, *kept], {}, [wait])
        if len(others) > len(kept):
            incident.unsaid.append(
                f"the lock had {len(others):,} holders: the scenario has the first {len(kept)} "
                f"(at most {MAX_PROCESSES} sessions)"
            )
        _recover(incident, fmt, stretch, index, whole)
        return incident
    return None


def _wait_from(record: Record, waiter: int, lock: str, holders: list[int]) -> LoggedWait:
    wait = LoggedWait(waiter, holders, lock, sql=record.statement, line=record.line)
    if t := _TUPLE.search(record.context):
        wait.ctid = f"({t.group(2)},{t.group(3)})"
        if t.group(1) == "inserting index":  # the relation is the unique index, not a table
            wait.index = t.group(4)
        else:
            wait.table = t.group(4)
    elif r := _RELATION.search(record.context):
        wait.table = r.group(1)
    return wait


def _deadlock(path: str, fmt: LogFormat, stretch: _Stretch, index: int, whole: bool) -> Incident | None:
    record = stretch.records[index]
    edges: list[tuple[int, str, int]] = []
    statements: dict[int, str] = {}
    current: int | None = None
    waiters: set[int] = set()
    for part in record.detail.split("\n"):
        if m := _EDGE.match(part):
            edges.append((_pid(m.group(1)), m.group(2), _pid(m.group(3))))
            waiters.add(edges[-1][0])
        elif (m := _STATEMENT_OF.match(part)) and _PID.match(m.group(1)) and int(m.group(1)) in waiters:
            current = int(m.group(1))
            statements[current] = m.group(2)
        elif current is not None:
            statements[current] += "\n" + part
    if len(edges) < 2:
        return None
    if len(edges) > MAX_PROCESSES:
        raise _Unreadable(f"a deadlock of {len(edges):,} processes: a scenario has at most {MAX_PROCESSES} sessions")
    victim = record.pid if record.pid is not None else edges[0][0]
    pids = [e[0] for e in edges]
    waits = []
    for waiter, lock, holder in edges:
        wait = LoggedWait(waiter, [holder], lock, sql=statements.get(waiter, ""))
        if waiter == victim:
            wait = _wait_from(record, waiter, lock, [holder])
            wait.sql = wait.sql or statements.get(waiter, "")
        waits.append(wait)
    incident = Incident("deadlock", path, record.line, record.time, record.database, pids, {}, waits, victim)
    # The other waiters' own "still waiting" reports (log_lock_waits) name their tuples.
    for pos in stretch.lock_waits:
        if pos >= index:
            break
        r = stretch.records[pos]
        if m := _WAITING.match(r.message):
            for wait in waits:
                if wait.waiter == _pid(m.group(1)) and wait.lock == m.group(2) and wait.waiter != victim:
                    told = _wait_from(r, wait.waiter, wait.lock, wait.holders)
                    wait.table, wait.ctid, wait.line, wait.index = told.table, told.ctid, told.line, told.index
                    wait.after_ms = _ms(m.group(3))
    _recover(incident, fmt, stretch, index, whole)
    return incident


def _statement(record: Record) -> tuple[str, str] | None:
    """The SQL of a ``log_statement`` line as the server ran it and as the log wrote it.

    The extended protocol (psycopg's parameters and ``prepare=True``, node-postgres,
    asyncpg) logs ``execute NAME: text with $1`` and the values in a DETAIL line:
    ``Parameters:`` since PostgreSQL 16, ``parameters:`` before. They are put in where
    the log gave them; the text as written is what a deadlock report quotes.
    """
    message = record.message
    if message.startswith("duration: ") and "  " in message:
        message = message.split("  ", 1)[1]  # log_min_duration_statement: the same, after the time
    if message.startswith("statement: "):
        return message[11:], message[11:]
    if message.startswith("execute ") and ": " in message:
        sql = message.split(": ", 1)[1]
        return _bound(sql, record.detail), sql
    return None


_PARAMETERS = re.compile(r"[Pp]arameters: ")
_VALUE = re.compile(r"\$(\d+) = ('(?:[^']|'')*'|NULL)")
_PLACEHOLDER = re.compile(r"\$(\d+)\b")


def _bound(sql: str, detail: str) -> str:
    """``sql`` with each ``$N`` the DETAIL line gave a value for replaced by that value, quoted as the log quotes it."""
    if _PARAMETERS.match(detail) is None:
        return sql
    return _put(sql, dict(_VALUE.findall(detail)))


def _put(sql: str, values: dict[str, str]) -> str:
    """``sql`` with ``$N`` replaced by ``values[N]`` where there is one."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), sql)


def _began_anew(record: Record, before: list[LoggedStatement]) -> bool:
    """With ``%x`` and no ``%v``: no xid yet, though this process's previous statement wrote, is a new transaction.

    ``log_statement = 'mod'`` logs no BEGIN and no COMMIT: a write gives its transaction an
    xid, so the next statement of the same transaction is logged with it.
    """
    if record.xid != "0" or not before:
        return False
    return _first_word(before[-1].sql) in _WRITES


def _first_word(sql: str) -> str:
    words = sql.lstrip().upper().split(None, 2)
    two = " ".join(words[:2]).rstrip(";")
    return two if two in _BEGINS else (words[0].rstrip(";") if words else "")


def _recover(incident: Incident, fmt: LogFormat, stretch: _Stretch, index: int, whole: bool) -> None:
    """Name the sessions, and (``whole``) gather each process's logged statements of the incident's transaction."""
    records = stretch.records
    pids = set(incident.pids)
    theirs = stretch.of(pids, index)
    apps: dict[int, str] = {}
    vxids: dict[int, str] = {}
    for pos in theirs:
        if pos > index:
            break
        r = records[pos]
        if r.pid in pids:
            if r.app and r.app != "[unknown]":
                apps[r.pid] = r.app
            if r.vxid and not r.vxid.endswith("/0"):
                vxids[r.pid] = r.vxid
    _name(incident, apps)
    if not whole:
        return
    per_pid: dict[int, list[LoggedStatement]] = {p: [] for p in pids}
    logged: list[tuple[int, LoggedStatement]] = []
    waiting = {w.waiter: w for w in incident.waits}
    unsaid = incident.unsaid
    closed: set[int] = set()

    def drop(pid: int) -> None:
        per_pid[pid].clear()  # its steps leave ``logged`` too, below

    for pos in theirs:
        r = records[pos]
        if r.pid is None or r.pid not in pids or r.pid in closed:
            continue
        said = _statement(r)
        if said is None:
            continue
        sql, as_logged = said
        word = _first_word(sql)
        after = pos > index
        if _PLACEHOLDER.search(sql):
            unsaid.append(f"line {r.line}: the parameters of {incident.names[r.pid]}'s statement were not logged")
        vx = vxids.get(r.pid)
        if vx is not None and "v" in fmt.fields:
            ours = r.vxid == vx
        else:  # no %v: the transaction is what follows the last BEGIN before the incident
            ours = True
            if not after and (word in _BEGINS or word in _ENDS or _began_anew(r, per_pid[r.pid])):
                drop(r.pid)
                if word in _ENDS:
                    continue
        if not ours:
            if after:
                if word in _ENDS and per_pid[r.pid]:  # the aborted victim's ROLLBACK has a vxid of its own
                    per_pid[r.pid].append(LoggedStatement(r.pid, sql, r.line, logged_as=as_logged))
                    logged.append((r.pid, per_pid[r.pid][-1]))
                closed.add(r.pid)
            continue
        step = LoggedStatement(r.pid, sql, r.line, xid=r.xid, logged_as=as_logged)
        per_pid[r.pid].append(step)
        logged.append((r.pid, step))
        if after and word in _ENDS:
            closed.add(r.pid)
    kept = {id(step) for steps in per_pid.values() for step in steps}
    logged = [(p, step) for p, step in logged if id(step) in kept]
    for p, w in waiting.items():  # a report quotes a statement as logged, $1 and all: the step has its values
        bound = [
            s.sql
            for s in per_pid[p]
            if s.logged_as.strip() == w.sql.strip() and w.sql.strip() and (s.line or 0) <= incident.line
        ]
        if bound:
            w.sql = bound[-1]
    incident.logged = all(
        any(s.sql.strip() == w.sql.strip() for s in per_pid[p]) for p, w in waiting.items() if w.sql
    ) and any(per_pid.values())
    if incident.logged:
        incident.steps = [s for _, s in logged]
        if len(incident.steps) > MAX_STEPS:
            unsaid.append(
                f"{len(incident.steps):,} statements of its transactions were logged: the scenario has the last "
                f"{MAX_STEPS:,}, from line {incident.steps[-MAX_STEPS].line}"
            )
            incident.steps = incident.steps[-MAX_STEPS:]
        for p in incident.pids:
            first = next(iter(per_pid[p]), None)
            if first is None or _first_word(first.sql) in _BEGINS:
                continue
            if first.xid not in (None, "", "0"):  # it had written already: it held locks the log does not show
                incident.open_before.add(p)
                unsaid.append(
                    f"{incident.names[p]} had written before its first logged statement (line {first.line} "
                    f"already had xid {first.xid}): statements before the log began"
                )
            elif p not in waiting:
                unsaid.append(f"{incident.names[p]}'s transaction began before the log's first statement of it")
    _made_up_parameters(incident)
    _pooled(incident, stretch, index)


def _made_up_parameters(incident: Incident) -> None:
    """Values for the ``$N`` of a waiting statement whose parameters the log does not hold (log_statement none).

    The report quotes the statement as the client sent it, ``$1`` and all. A key
    (``id = $2``) gets a value of its own for each wait, quoted as the log quotes
    parameters, so that each wait is on a row of its own as in the cycle; any other gets '0'.
    """
    from pgrace.drivers.fromlog.sqlinfo import key_parameters

    for n, wait in enumerate(incident.waits, 1):
        if not _PLACEHOLDER.search(wait.sql):
            continue
        keys = key_parameters(wait.sql)
        numbers = {m.group(1) for m in _PLACEHOLDER.finditer(wait.sql)}
        wait.sql = _put(wait.sql, {number: f"'{n}'" if int(number) in keys else "'0'" for number in numbers})
        incident.unsaid.append(
            f"the parameters of {incident.names[wait.waiter]}'s statement were not logged: made up "
            f"(the row's key '{n}', other values '0')"
        )


def _name(incident: Incident, apps: dict[int, str]) -> None:
    """Each process's session name: its application_name when that is a usable, unique name, else ``pid<N>``.

    Anyone can set application_name, to another process's ``pid<N>`` too: a fallback name
    is never given up, and an application_name that takes one, or another's, or a word the
    expectations use, is refused.
    """
    fallbacks = {f"pid{pid}" for pid in incident.pids}
    wanted = [apps.get(pid, "") for pid in incident.pids]
    for pid, app in zip(incident.pids, wanted, strict=True):
        # A cause of release (deadlock, step, cancel ...) is a word of the expectations: a session
        # named so would make "released_by" mean the cause, and the verdict read the name as one.
        usable = _NAME.match(app) and app not in fallbacks and wanted.count(app) == 1 and app not in RELEASE_CAUSES
        name = app if usable else f"pid{pid}"
        if app and name != app:
            incident.unsaid.append(f"pid {pid}'s application_name {app!r} is not a session name pgrace can use")
        incident.names[pid] = name


def _pooled(incident: Incident, stretch: _Stretch, index: int) -> None:
    """One pid with several applications or users in the window: a pooler shares the connection."""
    for pid in incident.pids:
        at = stretch.by_pid.get(pid, [])
        middle = bisect.bisect_right(at, index)
        seen = {
            (stretch.records[pos].app, stretch.records[pos].user, stretch.records[pos].database)
            for pos in at[max(0, middle - BEFORE) : middle]
        }
        if len(seen) > 1:
            incident.unsaid.append(
                f"pid {pid} served several clients ({len(seen)} application/user/database names): "
                "a pooled connection; its statements may be more than one client's"
            )
