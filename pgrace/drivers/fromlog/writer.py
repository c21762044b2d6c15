"""An incident, written as a pgrace scenario (TOML) that makes it happen again.

Steps come from ``log_statement`` when it logged the incident's transactions; otherwise the
cycle is rebuilt from the report: each process's reported statement, after a statement
that takes the lock its waiter wanted. Every step the log did not show says so in its
note and in a comment; what the log could not say is in the narrative and at the top.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from pgrace.drivers.fromlog.sqlinfo import Touch, analyse, lock_statement, quoted
from pgrace.model.fromlog import Incident, LoggedWait, Planned, Written
from pgrace.text import has_control, json_safe, visible

__all__ = ["write_scenario"]

#: The victim checks for deadlocks first; the others only long after the cycle is there.
VICTIM_TIMEOUT = "100ms"
VICTIM_FIRST_TIMEOUT = "1s"
OTHERS_TIMEOUT = "10s"
_ENDS = ("COMMIT", "ROLLBACK", "END", "ABORT")
_GUESSED = "-- TODO: guessed from the statements; give --dsn to copy the real table"
_MADE_UP_NOTE = "-- TODO: the values the log does not show are made up"
_MADE_UP: dict[str, Any] = {"int": 0, "numeric": 0, "text": ""}
_BEGAN = "inferred: the transaction began"
_BEGAN_UNLOGGED = "inferred: the transaction began before its first logged statement (no BEGIN was logged)"
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")
_COPIED = "# Copied from the database --dsn names (review them before sharing this file):"
_TODO_SETUP = "# TODO: the log does not describe the tables: this setup is guessed from the statements"


def _word(sql: str) -> str:
    words = sql.strip().upper().split()
    return words[0].rstrip(";") if words else ""


def _plan_logged(incident: Incident) -> list[Planned]:
    names = incident.names
    base = os.path.basename(incident.file)
    steps = [Planned(names[s.pid], s.sql, note=f"{base}:{s.line}", pid=s.pid) for s in incident.steps]
    for wait in incident.waits:
        at = _waiting_step(steps, wait, names)
        if at is None:
            continue
        for holder in wait.holders:
            if _holds(steps[:at], holder, wait):
                continue
            # Its locking statement is not in the log (it ran before the log began): inferred, at
            # the start of its transaction, so that it holds the row before anyone waits for it.
            own = [i for i, s in enumerate(steps[:at]) if s.pid == holder]
            began = bool(own) and _word(steps[own[0]].sql) in ("BEGIN", "START")
            place = own[0] + 1 if began else (own[0] if own else at)
            extra = [] if began else [Planned(names[holder], "BEGIN", inferred=True, pid=holder, note=_BEGAN)]
            extra.append(_lock_step(holder, wait, names))
            steps[place:place] = extra
    _begin_transactions(incident, steps)
    return steps


def _begin_transactions(incident: Incident, steps: list[Planned]) -> None:
    """Open the transaction of every session whose logged statements were one, though no BEGIN was logged.

    ``log_statement = 'mod'`` logs no BEGIN: a session of a deadlock, one holding a lock
    another waits for, or one with several statements of one transaction (the log grouped
    them by ``%v``/``%x``) ran them in a transaction; run one at a time, each would commit
    on its own and the incident could not come back.
    """
    holders = {h for w in incident.waits for h in w.holders}
    for pid in incident.pids:
        own = [i for i, s in enumerate(steps) if s.pid == pid]
        if not own or _word(steps[own[0]].sql) in ("BEGIN", "START"):
            continue
        if incident.kind == "deadlock" or pid in holders or len(own) > 1 or pid in incident.open_before:
            steps.insert(own[0], Planned(incident.names[pid], "BEGIN", inferred=True, pid=pid, note=_BEGAN_UNLOGGED))


def _holds(steps: list[Planned], holder: int, wait: LoggedWait) -> bool:
    """Whether one of ``holder``'s steps locks the row ``wait`` wanted (any of its steps, when the row is unknown)."""
    wanted = analyse(wait.sql)
    own = [s for s in steps if s.pid == holder and _word(s.sql) not in ("BEGIN", "START")]
    if wanted.table is None or not wanted.keys:
        return bool(own)
    for step in own:
        touch = analyse(step.sql)
        if touch.table != wanted.table:
            continue
        if not touch.keys:
            return True
        for key in touch.keys:
            for other in wanted.keys:
                shared = set(key) & set(other)
                if shared and all(key[c] == other[c] for c in shared):
                    return True
    return False


def _lock_step(holder: int, wait: LoggedWait, names: dict[int, str]) -> Planned:
    lock = lock_statement(wait.sql) or wait.sql
    why = f"inferred: {names[holder]} held the row {names[wait.waiter]} waited for ({wait.lock})"
    return Planned(names[holder], lock, note=why, inferred=True, pid=holder)


def _plan_inferred(incident: Incident) -> list[Planned]:
    names = incident.names
    steps: list[Planned] = []
    for pid in incident.pids:
        held = [w for w in incident.waits if pid in w.holders]
        if not held:
            continue
        steps.append(Planned(names[pid], "BEGIN", inferred=True, pid=pid, note=_BEGAN))
        steps += [_lock_step(pid, w, names) for w in held]
    waiters = [w for w in incident.waits if w.waiter != incident.victim]
    waiters += [w for w in incident.waits if w.waiter == incident.victim]
    for wait in waiters:
        where = f"{os.path.basename(incident.file)}:{wait.line or incident.line}"
        steps.append(
            Planned(names[wait.waiter], wait.sql, note=f"{where}: the statement it waited in", pid=wait.waiter)
        )
    return steps


def _waiting_step(steps: list[Planned], wait: LoggedWait, names: dict[int, str]) -> int | None:
    found = [i for i, s in enumerate(steps) if s.pid == wait.waiter and s.sql.strip() == wait.sql.strip()]
    return found[-1] if found else None


def _finish(incident: Incident, steps: list[Planned]) -> None:
    """End every transaction: the victim's rolls back, the others commit (inferred unless logged)."""
    names = incident.names
    by_pid: dict[int, list[Planned]] = {}
    for step in steps:
        by_pid.setdefault(step.pid, []).append(step)
    for pid in _end_order(incident):
        own = by_pid.get(pid, [])
        if not own or _word(own[-1].sql) in _ENDS or not any(_word(s.sql) in ("BEGIN", "START") for s in own):
            continue
        end = "ROLLBACK" if pid == incident.victim else "COMMIT"
        steps.append(Planned(names[pid], end, inferred=True, pid=pid, note=f"inferred: the transaction's {end}"))


def _end_order(incident: Incident) -> list[int]:
    """The order the transactions can end in: the victim first, then each one whose holders have ended.

    In a cycle of three, the victim's rollback frees only the process that waited for it;
    the one waiting for that process goes on when that process commits, and so on.
    """
    import heapq

    waits = {w.waiter: set(w.holders) for w in incident.waits}
    rank = {p: i for i, p in enumerate(incident.pids)}
    waiters: dict[int, list[int]] = {}
    for waiter, holders in waits.items():
        for holder in holders:
            waiters.setdefault(holder, []).append(waiter)
    order: list[int] = []
    ended: set[int] = set()
    free = [rank[p] for p in incident.pids if not waits.get(p)]  # the first free one in pids order ends next
    heapq.heapify(free)
    first = [incident.victim] if incident.victim in rank else []
    while len(order) < len(incident.pids):
        if first:
            pid = first.pop()
        else:
            while free and incident.pids[free[0]] in ended:
                heapq.heappop(free)
            pid = incident.pids[heapq.heappop(free)] if free else next(p for p in incident.pids if p not in ended)
        if pid in ended:
            continue
        order.append(pid)
        ended.add(pid)
        for waiter in waiters.get(pid, ()):
            if waiter not in ended and waits[waiter] <= ended:
                heapq.heappush(free, rank[waiter])
    return order


def _expect(incident: Incident, steps: list[Planned], partitioned: set[str]) -> tuple[str | None, dict[str, list[str]]]:
    names = incident.names
    victim_step = None
    waits: dict[str, list[str]] = {}
    for wait in incident.waits:
        at = _waiting_step(steps, wait, names)
        if at is None:
            continue
        step = steps[at]
        holders = [names[h] for h in wait.holders]
        expect: dict[str, Any] = {"waits_for": holders if len(holders) > 1 else holders[0]}
        touch = analyse(wait.sql)
        table = wait.table or touch.table
        # A partitioned table's row is in a partition the server names, which the statement does not.
        if table and table == touch.table and len(touch.keys) == 1 and touch.relation not in partitioned:
            expect["waits_on"] = {"table": table, "key": touch.keys[0]}
        elif len(wait.holders) == 1:  # a row the statement does not name by its key: the holder's transaction
            expect["waits_on"] = {"transaction_of": names[wait.holders[0]]}
        if incident.kind == "deadlock":
            if wait.waiter == incident.victim:
                expect.update(error="40P01", deadlock=sorted(names.values()))
                victim_step = step.name
                expect["released_by"] = "deadlock"
            else:
                expect["error"] = False
                # Only the victim's rollback is the deadlock's doing: a process waiting for another
                # survivor goes on when that one's transaction ends.
                survivor = [h for h in wait.holders if h != incident.victim]
                expect["released_by"] = names[survivor[0]] if survivor else "deadlock"
        else:
            enders = [s for s in steps[at + 1 :] if s.pid in wait.holders and _word(s.sql) in _ENDS]
            if enders:
                expect["released_by"] = enders[0].session
        step.expect = expect
        waits[step.name] = holders
    return victim_step, waits


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        # A TOML basic string: JSON's escapes are TOML's. json_safe escapes what json.dumps leaves raw:
        # DEL, which TOML forbids, and C1 and bidi, which a terminal showing the file would act on.
        return json_safe(json.dumps(value, ensure_ascii=False))
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        # A column's name is the log's text too ("a b" = 1): bare only when TOML allows it.
        keys = (k if _BARE_KEY.match(k) else _toml(k) for k in value)
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in zip(keys, value.values(), strict=True)) + " }"
    raise TypeError(type(value))


def _multiline(text: str) -> str:
    if "'''" not in text and not has_control(text):
        return "'''\n" + text.rstrip("\n") + "\n'''"
    return _toml(text)


def _guessed_setup(incident: Incident, statements: list[str]) -> tuple[list[str], list[str]]:
    """Tables made up from what the statements name: columns, a key, and the rows they name by key.

    A table is the statement's, schema and all (``pgboss.job``, ``"Order Lines"``). An INSERT
    that names no columns gets as many; a wait on a unique index (``while inserting index
    tuple``) says the table has one: its first column, when no WHERE names a key.
    """
    tables: dict[str, dict[str, str]] = {}
    keys: dict[str, list[dict[str, Any]]] = {}
    schemas: dict[str, str] = {}
    indexed: set[str] = set()
    for statement in statements:
        touch = analyse(statement)
        if touch.relation is None or touch.table is None or _catalog(touch.schema, touch.table):
            continue
        relation = touch.relation
        if touch.schema:
            schemas[relation] = touch.schema
        if any(w.index and analyse(w.sql).relation == relation for w in incident.waits):
            indexed.add(relation)
        _guess_columns(touch, tables.setdefault(relation, {}), keys.setdefault(relation, []))
    sql: list[str] = []
    notes = []
    for schema in dict.fromkeys(schemas.values()):
        sql.append(f"CREATE SCHEMA IF NOT EXISTS {quoted(schema)};")
    for table, cols in tables.items():
        key_cols = list(keys.get(table, [{}])[0]) if keys.get(table) else []
        if not key_cols and table in indexed and cols:
            key_cols = [next(iter(cols))]
            notes.append(f"the unique index of {table} a wait went through is guessed: its first column (TODO)")
        pk = f",\n  PRIMARY KEY ({', '.join(quoted(c) for c in key_cols)})" if key_cols else ""
        body = ",\n  ".join(f"{quoted(c)} {t}" for c, t in cols.items())
        sql.append(f"{_GUESSED}\nCREATE TABLE {table} (\n  {body}{pk}\n);")
        rows = []
        for key in keys.get(table, []):
            values = [key.get(c, _MADE_UP.get(t)) for c, t in cols.items()]
            rows.append("(" + ", ".join(_sql_literal(v) for v in values) + ")")
        if rows:
            sql.append(f"{_MADE_UP_NOTE}\nINSERT INTO {table} VALUES {', '.join(rows)};")
        notes.append(f"the table {table} is guessed from the statements (its columns, types and rows): give --dsn")
    if not tables:
        sql.append("-- TODO: the log names no table pgrace could read: create the tables the statements need")
    return sql, notes


def _catalog(schema: str | None, table: str) -> bool:
    """A name PostgreSQL resolves to one of its catalogs (``pg_catalog`` comes first on every search_path)."""
    return schema in ("pg_catalog", "information_schema") or (schema is None and table.startswith("pg_"))


def _guess_columns(touch: Touch, cols: dict[str, str], keys: list[dict[str, Any]]) -> None:
    """Add the columns and keys one statement shows of its table to ``cols`` and ``keys``."""
    for key in touch.keys:
        for col in key:
            cols.setdefault(col, touch.columns.get(col, "int"))
        if key not in keys:
            keys.append(key)
    for col, type_ in touch.columns.items():
        cols.setdefault(col, type_)
    for n, type_ in enumerate(touch.positional[len(cols) :], len(cols) + 1):
        cols[f"column{n}"] = type_


def _sql_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def _setup(
    incident: Incident, steps: list[Planned], dsn: str | None
) -> tuple[list[str], list[str], list[str], set[str]]:
    """The setup SQL, what it could not say, which rows it copied from ``dsn``'s database, and which of its
    tables are partitioned."""
    statements = [s.sql for s in steps]
    if dsn is None:
        return (*_guessed_setup(incident, statements), [], set())
    from pgrace.drivers.fromlog.database import describe

    # Tables as SQL names, with the schema the log's statements give them.
    tables: list[str] = []
    keys: dict[str, list[dict[str, Any]]] = {}
    for sql in statements:
        touch = analyse(sql)
        if touch.relation is None:
            continue
        if touch.relation not in tables:
            tables.append(touch.relation)
        own = keys.setdefault(touch.relation, [])
        own.extend(k for k in touch.keys if k not in own)
    ctids: dict[str, list[str]] = {}
    for wait in incident.waits:
        if wait.table and wait.ctid:
            table = quoted(wait.table)
            ctids.setdefault(table, []).append(wait.ctid)
            if table not in tables:
                tables.append(table)
    described = describe(dsn, tables, keys, ctids)
    setup = described.setup or ["-- TODO: nothing of the incident's tables could be copied"]
    return setup, described.notes, described.copied, described.partitioned


def _comment(text: str) -> str:
    """A TOML comment line of log text (a file name, an application name): one line, nothing a terminal acts on."""
    return visible(" ".join(text.splitlines()))


def _name(incident: Incident) -> str:
    stem = os.path.splitext(os.path.basename(incident.file))[0]
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-.") or "log"
    return f"from-log-{stem}-{incident.line}"


def write_scenario(incident: Incident, dsn: str | None = None, order: list[str] | None = None) -> Written:
    """The scenario of ``incident``: sessions, steps, expectations that pin it, and the setup.

    ``order`` (step names) launches the same steps in another order: an interleaving
    exploration found to reproduce the incident when the log's own order did not.
    """
    steps = _plan_logged(incident) if incident.logged else _plan_inferred(incident)
    _finish(incident, steps)
    counts: dict[str, int] = {}
    for s in steps:
        counts[s.session] = counts.get(s.session, 0) + 1
        s.name = f"{s.session}-{counts[s.session]}"
    if order is not None:
        rank = {name: i for i, name in enumerate(order)}
        steps.sort(key=lambda s: rank.get(s.name, len(rank)))
    setup, setup_notes, copied, partitioned = _setup(incident, steps, dsn)
    victim_step, waits = _expect(incident, steps, partitioned)
    unsaid = list(dict.fromkeys(incident.unsaid + setup_notes + _general_unsaid(incident, steps)))
    name = _name(incident)
    who = ", ".join(incident.names[p] for p in incident.pids)
    said = "its statements were logged (log_statement)" if incident.logged else "only the report was logged"
    narrative = [
        f"A {incident.kind} of {who}, found at {incident.file}:{incident.line}"
        + (f" ({incident.time})" if incident.time else "")
        + (f" in database {incident.database}" if incident.database else "")
        + f"; {said}.",
    ]
    if incident.kind == "deadlock" and incident.victim is not None:
        narrative.append(
            f"The server chose {incident.names[incident.victim]} as the victim; each session's "
            "deadlock_timeout is pinned so that it is chosen on every run."
        )
    narrative.append("What the log did not say: " + "; ".join(unsaid) + ".")
    out = [
        _comment(f"# Written by pgrace from-log from {incident.file}:{incident.line}."),
        "# Steps whose note starts with 'inferred' were not in the log: pgrace rebuilt them from the report.",
        "# What the log did not say:",
        *[_comment(f"#   - {u}") for u in unsaid],
        *([_COPIED] if copied else []),
        *[_comment(f"#   - {c}") for c in copied],
        "",
        f"name = {_toml(name)}",
        f"title = {_toml(f'{incident.kind.capitalize()} of {who}, from the server log')}",
        f"narrative = {_multiline(chr(10).join(narrative))}",
        "",
        *([_TODO_SETUP] if dsn is None else []),
        f"setup = {_multiline(chr(10).join(setup))}",
        "",
    ]
    for pid in sorted(incident.pids, key=lambda p: next((i for i, s in enumerate(steps) if s.pid == p), 0)):
        out += ["[[sessions]]", f"name = {_toml(incident.names[pid])}"]
        if incident.kind == "deadlock":
            out.append(f"setup = {_toml(_pin(incident, pid, steps))}")
        out.append("")
    for step in steps:
        if step.inferred:
            out.append("# inferred: not in the log")
        out += ["[[step]]", f"name = {_toml(step.name)}", f"session = {_toml(step.session)}"]
        out.append(f"sql = {_multiline(step.sql) if chr(10) in step.sql else _toml(step.sql)}")
        if step.note:
            out.append(f"note = {_toml(step.note)}")
        if step.expect:
            out.append(f"expect = {_toml(step.expect)}")
        out.append("")
    return Written("\n".join(out), name, steps, unsaid, victim_step, waits, copied)


def _pin(incident: Incident, pid: int, steps: list[Planned]) -> str:
    """The victim's deadlock_timeout: short when its wait closes the cycle, longer when it waited first."""
    if pid != incident.victim:
        return f"SET deadlock_timeout = '{OTHERS_TIMEOUT}'"
    waiting = [s for s in steps if "waits_for" in s.expect]
    last = bool(waiting) and waiting[-1].pid == pid
    return f"SET deadlock_timeout = '{VICTIM_TIMEOUT if last else VICTIM_FIRST_TIMEOUT}'"


def _general_unsaid(incident: Incident, steps: list[Planned]) -> list[str]:
    out = [
        f"the BEGIN of {s.session}'s transaction was not logged (log_statement = 'mod' logs none, or the log "
        "began after it): inferred before its first logged statement"
        for s in steps
        if s.note == _BEGAN_UNLOGGED
    ]
    if not incident.logged:
        out.append(
            "the statements before each process's last one (log_statement was off): the steps that take "
            "the locks are inferred from the waiters' statements"
        )
    if not any("ISOLATION LEVEL" in s.sql.upper() for s in steps):
        out.append("the isolation level: the scenario runs at the server's default (read committed)")
    out.append(
        "locks taken implicitly (foreign keys, triggers, unique indexes) are not logged: "
        "a wait on a table no statement writes was one of them"
    )
    out.append("a pid is one server connection: behind a pooler one pid may have served several clients")
    return out
