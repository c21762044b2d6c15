"""Ask the server who is blocked, by whom, on which row, and which rows each session holds.

All queries run on the *observer* connection, never on a session's. It has a short
``lock_timeout`` and checks ``pg_locks`` before it reads a table, so watching can never
queue behind a session's ``ACCESS EXCLUSIVE`` lock and change what it watches.

How a row-lock wait looks in ``pg_locks`` (heapam.c): the first waiter holds a
``tuple`` lock on the row's ctid and waits for the holder's ``transactionid``; later
waiters queue for that ``tuple`` lock. The tuple lock's mode encodes the row-lock
strength the waiter asked for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import namedtuple_row

from pgrace.model import RowRef
from pgrace.timeline import RowLock, Wait

# Heavyweight tuple-lock mode -> the row-lock strength it stands for (heapam.c tupleLockExtraInfo).
TUPLE_LOCK_STRENGTH = {
    "AccessShareLock": "FOR KEY SHARE",
    "RowShareLock": "FOR SHARE",
    "ExclusiveLock": "FOR NO KEY UPDATE",
    "AccessExclusiveLock": "FOR UPDATE",
}

# One line of a deadlock's DETAIL (deadlock.c DeadLockReport).
DEADLOCK_EDGE = re.compile(
    r"Process (?P<waiter>\d+) waits for (?P<mode>\w+) on (?P<what>.+?); blocked by process (?P<blocker>\d+)\."
)

BLOCKED_QUERY = "SELECT pg_catalog.pg_isolation_test_session_is_blocked($1, $2)"

WAITING_LOCKS_QUERY = """
SELECT l.locktype, l.mode, l.granted, l.relation, l.relation::regclass::text AS relname,
       l.page, l.tuple, l.transactionid::text AS xid, l.classid, l.objid, l.objsubid,
       pg_catalog.pg_blocking_pids(l.pid) AS blocking
FROM pg_catalog.pg_locks l
WHERE l.pid = %s AND (NOT l.granted OR l.locktype = 'tuple')
"""

XID_HOLDERS_QUERY = """
SELECT l.transactionid::text, l.pid FROM pg_catalog.pg_locks l
WHERE l.locktype = 'transactionid' AND l.granted AND l.mode = 'ExclusiveLock'
  AND l.transactionid::text = ANY(%s)
"""

TABLES_QUERY = """
SELECT c.oid, c.oid::regclass::text,
       ARRAY(SELECT a.attname FROM pg_catalog.pg_index i
             CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
             JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
             WHERE i.indrelid = c.oid AND i.indisprimary ORDER BY k.n),
       EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
               WHERE l.locktype = 'relation' AND l.relation = c.oid AND l.mode = 'AccessExclusiveLock')
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%%'
  AND (%(schema)s::text IS NULL OR n.nspname = %(schema)s)
ORDER BY 2
"""


@dataclass(frozen=True)
class Table:
    oid: int
    name: str
    key_columns: tuple[str, ...]
    exclusively_locked: bool


@dataclass(frozen=True)
class LockSnapshot:
    """Row locks of every table (None: pgrowlocks is missing), and tables that could not be read."""

    locks: tuple[RowLock, ...] | None
    skipped: tuple[str, ...]


class LockInspector:
    """Answers "blocked?", "on what?" and "who holds which rows?" for one scenario."""

    def __init__(self, observer: psycopg.Connection[Any], sessions: dict[int, str], schema: str | None = None) -> None:
        self.schema = schema  # only this schema's tables are read (a scratch schema in a user's database)
        self.observer = observer
        self.set_sessions(sessions)
        self.pgconn = observer.pgconn
        self.pgconn.prepare(b"pgrace_is_blocked", BLOCKED_QUERY.encode())

    def set_sessions(self, sessions: dict[int, str]) -> None:
        """Backend pid -> session name; replaced when a lost session is reconnected.

        A terminated session's pid may stay in the list meanwhile: the blocking probe
        and ``pg_blocking_pids`` simply find no process for it.
        """
        self.sessions = sessions
        self.pid_array = "{" + ",".join(str(pid) for pid in sessions) + "}"

    def name_of(self, pid: int) -> str:
        return self.sessions.get(pid, f"pid {pid}")

    def states(self, pids: list[int]) -> dict[int, str]:
        """``pg_stat_activity.state`` of these backends ("idle in transaction", "active", ...)."""
        if not pids:
            return {}
        rows = self.observer.execute(
            "SELECT pid, state FROM pg_catalog.pg_stat_activity WHERE pid = ANY(%s)", (pids,)
        ).fetchall()
        return {pid: state or "" for pid, state in rows}

    def deadlock_cycle(self, detail: str) -> tuple[str, ...]:
        """A deadlock's DETAIL in session names: ``b waits for ShareLock on a's transaction``.

        The server names processes and transactions by pid and xid, which change from run
        to run; the edge list, victim first (the server lists the detecting process
        first), reads the same every time.
        """
        edges = []
        for match in DEADLOCK_EDGE.finditer(detail):
            waiter = self._who(int(match["waiter"]))
            blocker = self._who(int(match["blocker"]))
            edges.append(f"{waiter} waits for {match['mode']} on {self._lock_object(match['what'], blocker)}")
        return tuple(edges)

    def _who(self, pid: int) -> str:
        return self.sessions.get(pid, "another backend")

    def _lock_object(self, what: str, blocker: str) -> str:
        """DescribeLockTag's words (lmgr.c) without oids, xids or pids."""
        if re.fullmatch(r"transaction \d+", what):
            return f"{blocker}'s transaction"
        if what.startswith("virtual transaction "):
            return f"{blocker}'s virtual transaction"
        if match := re.fullmatch(r"tuple \((\d+),(\d+)\) of relation (\d+) of database \d+", what):
            ctid = f"({match[1]},{match[2]})"
            table = self._table(int(match[3]))
            row = self._resolve_keys(table, [ctid]).get(ctid) if table else None
            name = table.name if table else "a table"
            return f"row {row}" if row else f"row {ctid} of {name}"
        if match := re.fullmatch(r"relation (\d+) of database \d+", what):
            return f"table {self._relation_name(int(match[1]))}"
        if match := re.fullmatch(r"page \d+ of relation (\d+) of database \d+", what):
            return f"a page of table {self._relation_name(int(match[1]))}"
        if match := re.fullmatch(r"extension of relation (\d+) of database \d+", what):
            return f"the extension of table {self._relation_name(int(match[1]))}"
        if match := re.fullmatch(r"advisory lock \[\d+,(\d+),(\d+),(\d+)\]", what):
            high, low, kind = int(match[1]), int(match[2]), int(match[3])
            return f"advisory lock {(high << 32) | low if kind == 1 else f'{high}, {low}'}"
        return f"a {what.split(' ', 1)[0]} lock"

    def _relation_name(self, oid: int) -> str:
        """The table's name (an oid, unlike a name, changes from run to run)."""
        row = self.observer.execute("SELECT %s::oid::regclass::text", (oid,)).fetchone()
        return str(row[0]) if row else "an unknown table"

    def is_blocked(self, pid: int) -> bool:
        """The server's own verdict, restricted to this scenario's sessions (as isolationtester)."""
        result = self.pgconn.exec_prepared(b"pgrace_is_blocked", [str(pid).encode(), self.pid_array.encode()])
        value = result.get_value(0, 0) if result.ntuples else None
        if value is None:
            message = result.get_error_message() or "probe returned nothing"
            raise psycopg.OperationalError(message)
        return value == b"t"

    def blocking_graph(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Who waits on whom right now, among the sessions (for timeout diagnoses)."""
        rows = self.observer.execute(
            "SELECT p, pg_catalog.pg_blocking_pids(p) FROM unnest(%s::int[]) AS p",
            (list(self.sessions),),
        ).fetchall()
        return tuple(
            (self.name_of(pid), tuple(self.name_of(b) for b in blockers)) for pid, blockers in rows if blockers
        )

    # -- which row, held by whom ------------------------------------------------------

    def describe_waits(self, pid: int) -> tuple[Wait, ...]:
        """Turn the waiter's entries in ``pg_locks`` into named waits."""
        with self.observer.cursor(row_factory=namedtuple_row) as cursor:
            rows: list[Any] = cursor.execute(WAITING_LOCKS_QUERY, (pid,)).fetchall()
        held_tuple = next((r for r in rows if r.locktype == "tuple" and r.granted), None)
        waits = []
        for lock in (r for r in rows if not r.granted):
            blocked_by = tuple(self.name_of(b) for b in lock.blocking if b in self.sessions)
            if lock.locktype == "transactionid" and held_tuple is not None:
                waits.append(self._row_wait(held_tuple, blocked_by, via_xid=lock.xid))
            elif lock.locktype == "tuple":
                waits.append(self._row_wait(lock, blocked_by, via_xid=None))
            elif lock.locktype == "transactionid":
                holder = self._xid_holder(lock.xid)
                waits.append(Wait("transaction", blocked_by, mode=lock.mode, holder=holder, lock_type=lock.locktype))
            elif lock.locktype == "relation":
                waits.append(Wait("relation", blocked_by, mode=lock.mode, table=lock.relname, lock_type="relation"))
            elif lock.locktype == "advisory":
                # pg_advisory_lock(bigint) splits its key over classid/objid (objsubid 1).
                key = f"{(lock.classid << 32) | lock.objid}" if lock.objsubid == 1 else f"{lock.classid}, {lock.objid}"
                waits.append(Wait("advisory", blocked_by, mode=lock.mode, lock_type="advisory", detail=key))
            else:
                waits.append(Wait("other", blocked_by, mode=lock.mode, lock_type=lock.locktype))
        return tuple(waits)

    def _xid_holder(self, xid: str | None) -> str | None:
        if xid is None:
            return None
        row = self.observer.execute(XID_HOLDERS_QUERY, ([xid],)).fetchone()
        return self.name_of(row[1]) if row else None

    def _row_wait(self, tuple_lock: Any, blocked_by: tuple[str, ...], via_xid: str | None) -> Wait:
        """A row wait: ``tuple_lock`` is the waiter's tuple lock (held, or queued for)."""
        mode, reloid, relname = tuple_lock.mode, tuple_lock.relation, tuple_lock.relname
        ctid = f"({tuple_lock.page},{tuple_lock.tuple})"
        table = self._table(reloid)
        row = self._resolve_keys(table, [ctid]).get(ctid) if table else None
        if via_xid is not None:
            holder = self._xid_holder(via_xid)
            queued_behind: tuple[str, ...] = ()
        else:
            # Queued for the tuple lock: the row itself is held by whoever the waiters
            # ahead of us are waiting for.
            holder = self._row_holder(blocked_by)
            queued_behind = tuple(b for b in blocked_by if b != holder)
        holder_mode = self._holder_mode(table, ctid, holder) if table and holder else None
        return Wait(
            "row",
            blocked_by,
            mode=TUPLE_LOCK_STRENGTH.get(mode, mode),
            row=row,
            ctid=ctid,
            table=relname,
            holder=holder,
            holder_mode=holder_mode,
            queued_behind=queued_behind,
            lock_type="transactionid" if via_xid else "tuple",
        )

    def _row_holder(self, ahead: tuple[str, ...]) -> str | None:
        pids = [pid for pid, name in self.sessions.items() if name in ahead]
        for pid in pids:
            rows = self.observer.execute(
                "SELECT transactionid::text FROM pg_catalog.pg_locks"
                " WHERE pid = %s AND locktype = 'transactionid' AND NOT granted",
                (pid,),
            ).fetchall()
            for (xid,) in rows:
                holder = self._xid_holder(xid)
                if holder is not None:
                    return holder
        return ahead[0] if ahead else None

    def _holder_mode(self, table: Table, ctid: str, holder: str) -> str | None:
        snapshot = self._table_locks(table)
        if snapshot is None:
            return None
        modes = [lock.mode for lock in snapshot if lock.ctid == ctid and lock.session == holder]
        return modes[0] if modes else None

    # -- rows held, per session ---------------------------------------------------------

    def tables(self) -> list[Table]:
        return [
            Table(oid, name, tuple(keys), locked)
            for oid, name, keys, locked in self.observer.execute(TABLES_QUERY, {"schema": self.schema}).fetchall()
        ]

    def _table(self, oid: int | None) -> Table | None:
        return next((t for t in self.tables() if t.oid == oid), None)

    def row_locks(self) -> LockSnapshot:
        """Every row lock held in the scratch database, via pgrowlocks, sorted stably."""
        if self.observer.execute("SELECT to_regproc('pgrowlocks') IS NULL").fetchone() != (False,):
            return LockSnapshot(None, ())
        locks: list[RowLock] = []
        skipped: list[str] = []
        for table in self.tables():
            table_locks = self._table_locks(table)
            if table_locks is None:
                skipped.append(table.name)
            else:
                locks.extend(table_locks)
        order = {name: i for i, name in enumerate(self.sessions.values())}
        locks.sort(key=lambda lk: (order.get(lk.session, len(order)), lk.table, _sort_key(lk)))
        return LockSnapshot(tuple(locks), tuple(skipped))

    def _table_locks(self, table: Table) -> list[RowLock] | None:
        if table.exclusively_locked:
            return None
        try:
            rows = self.observer.execute(
                "SELECT locked_row::text, modes, pids FROM pgrowlocks(%s)",
                (table.name,),
            ).fetchall()
        except psycopg.Error:
            return None
        ctids = [r[0] for r in rows]
        keys = self._resolve_keys(table, ctids) if ctids else {}
        out = []
        for ctid, modes, pids in rows:
            for mode, pid in zip(modes, pids, strict=False):
                out.append(
                    RowLock(
                        keys.get(ctid),
                        ctid,
                        table.name,
                        self.name_of(pid),
                        mode.upper(),
                    )
                )
        return out

    def _resolve_keys(self, table: Table, ctids: list[str]) -> dict[str, RowRef]:
        """ctid -> primary key, read at this moment (the row version the lock is on)."""
        if table.exclusively_locked or not table.key_columns:
            return {}
        query = sql.SQL("SELECT ctid::text, {cols} FROM {table} WHERE ctid = ANY(%s::tid[])").format(
            cols=sql.SQL(", ").join(sql.Identifier(c) for c in table.key_columns),
            table=sql.SQL(table.name),  # already a quoted regclass name
        )
        try:
            rows = self.observer.execute(query, (ctids,)).fetchall()
        except psycopg.Error:
            return {}
        return {r[0]: RowRef(table.name, tuple(zip(table.key_columns, r[1:], strict=True))) for r in rows}


def _sort_key(lock: RowLock) -> tuple[Any, ...]:
    if lock.row is None:
        return (1, lock.ctid)
    return (
        0,
        tuple(str(v).rjust(20) if isinstance(v, int) else str(v) for _, v in lock.row.key),
    )
