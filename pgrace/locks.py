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
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.rows import namedtuple_row

from pgrace.model import LOCK_MODES, RowRef
from pgrace.timeline import AdvisoryKey, Blocker, RowLock, Wait

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

# Every heavyweight lock on the server at one moment, with what its relation is (a table,
# an index and of which table, whether unique) and its schema. One call of pg_locks, so
# holders and waiters are seen consistently.
ALL_LOCKS_QUERY = """
SELECT l.pid, l.locktype, l.mode, l.granted, l.database, l.relation,
       CASE WHEN c.oid IS NOT NULL THEN l.relation::regclass::text END AS relname,
       c.relkind::text AS relkind, n.nspname, i.indrelid AS index_of,
       coalesce(i.indisunique OR i.indisexclusion, false) AS unique_index,
       l.page, l.tuple, l.virtualxid, l.transactionid::text AS xid, l.classid, l.objid, l.objsubid
FROM pg_catalog.pg_locks l
LEFT JOIN pg_catalog.pg_class c  -- this database's relations, and the shared catalogs (database 0: pg_database)
       ON c.oid = l.relation
      AND (l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
           OR (l.database = 0 AND c.relisshared))
LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_catalog.pg_index i ON i.indexrelid = c.oid
WHERE l.pid IS DISTINCT FROM pg_catalog.pg_backend_pid()
"""

BLOCKING_QUERY = "SELECT p, pg_catalog.pg_blocking_pids(p) FROM pg_catalog.unnest(%s::int[]) AS p"

ACTIVITY_QUERY = """
SELECT pid, xact_start IS NOT NULL AS in_transaction, query
FROM pg_catalog.pg_stat_activity WHERE pid = ANY(%s)
"""

# Where the pgrowlocks extension lives: its function is called by that schema, so that nothing a
# scenario creates on the observer's search_path can stand in for it.
PGROWLOCKS_SCHEMA_QUERY = """
SELECT n.nspname FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
WHERE e.extname = 'pgrowlocks'
"""

PROGRESS_QUERY = "SELECT command, phase FROM pg_catalog.pg_stat_progress_create_index WHERE pid = %s"

TABLES_QUERY = """
SELECT c.oid, c.oid::regclass::text,
       ARRAY(SELECT a.attname FROM pg_catalog.pg_index i
             CROSS JOIN LATERAL pg_catalog.unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
             JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
             WHERE i.indrelid = c.oid AND i.indisprimary ORDER BY k.n),
       EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
               WHERE l.locktype = 'relation' AND l.relation = c.oid AND l.mode = 'AccessExclusiveLock')
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%%'
  AND (%(schema)s::text IS NULL OR n.nspname = %(schema)s)
ORDER BY 2
"""

# The conflict table of the eight lock modes, as PostgreSQL's documentation draws it
# ("Explicit Locking", table "Conflicting Lock Modes"): row = mode requested, column =
# mode held, in the order of model.LOCK_MODES. The lock manager uses the same table for every lock type
# (tables, tuples, transactions, advisory locks); SIReadLock conflicts with nothing.
_CONFLICT_TABLE = """
. . . . . . . X
. . . . . . X X
. . . . X X X X
. . . X X X X X
. . X X . X X X
. . X X X X X X
. X X X X X X X
X X X X X X X X
"""
CONFLICTS: dict[str, frozenset[str]] = {
    wanted: frozenset(held for held, mark in zip(LOCK_MODES, line.split(), strict=True) if mark == "X")
    for wanted, line in zip(LOCK_MODES, _CONFLICT_TABLE.strip().splitlines(), strict=True)
}


#: Row-lock strengths, weakest first (pgrowlocks says "No Key Update" and "Update" for an UPDATE's).
ROW_STRENGTHS = ("FOR KEY SHARE", "FOR SHARE", "FOR NO KEY UPDATE", "FOR UPDATE")

#: The manual's Table 13.3: a requested row-lock strength -> the held ones it waits for (pgrace's one copy).
ROW_CONFLICTS: dict[str, frozenset[str]] = {
    "FOR KEY SHARE": frozenset({"FOR UPDATE"}),
    "FOR SHARE": frozenset({"FOR NO KEY UPDATE", "FOR UPDATE"}),
    "FOR NO KEY UPDATE": frozenset({"FOR SHARE", "FOR NO KEY UPDATE", "FOR UPDATE"}),
    "FOR UPDATE": frozenset(ROW_STRENGTHS),
}


def _rows_conflict(wanted: str, held: str) -> bool:
    strength = {"NO KEY UPDATE": "FOR NO KEY UPDATE", "UPDATE": "FOR UPDATE"}.get(held, held)
    return strength in ROW_CONFLICTS.get(wanted, frozenset(ROW_STRENGTHS))


def _row_sharers(row_locks: list[RowLock], ctid: str, wanted: str, waiter: str) -> list[str]:
    """The sessions holding the row in a mode that conflicts with ``wanted``: all of them must end.

    A row that several transactions lock together (FOR SHARE by four readers: a multixact)
    keeps an UPDATE waiting for each member in turn, while ``pg_blocking_pids`` names only
    the one it waits for now.
    """
    found: list[str] = []
    for lock in row_locks:
        if lock.ctid == ctid and lock.session not in (waiter, *found) and _rows_conflict(wanted, lock.mode):
            found.append(lock.session)
    return found


def _holder_mode(row_locks: list[RowLock], ctid: str, holder: str) -> str | None:
    modes = [lock.mode for lock in row_locks if lock.ctid == ctid and lock.session == holder]
    return modes[0] if modes else None


def conflicts(wanted: str, held: str) -> bool:
    """Whether a lock requested in mode ``wanted`` must wait for one held (or queued) in ``held``."""
    return held in CONFLICTS.get(wanted, frozenset())


class LockTable:
    """One reading of ``pg_locks`` (named rows of :data:`ALL_LOCKS_QUERY`) and of
    ``pg_blocking_pids`` for each session: the facts every wait is described from."""

    def __init__(self, rows: list[Any], blocking: dict[int, list[int]]) -> None:
        self.rows = rows
        self.blocking = blocking

    def waiting(self, pid: int) -> Any | None:
        """The lock ``pid`` waits for (a backend waits for one lock at a time)."""
        return next((r for r in self.rows if r.pid == pid and not r.granted), None)

    def same_lock(self, lock: Any) -> list[Any]:
        """Other backends' entries for the same lockable object (its lock tag)."""
        tag = _tag(lock)
        return [r for r in self.rows if r.pid != lock.pid and _tag(r) == tag]

    def xid_holder(self, xid: str | None, sessions: dict[int, str]) -> str | None:
        """The session whose transaction has this id (it holds its ExclusiveLock)."""
        for r in self.rows:
            if r.locktype == "transactionid" and r.granted and r.mode == "ExclusiveLock" and r.xid == xid:
                return str(sessions.get(r.pid, f"pid {r.pid}"))
        return None


def _tag(lock: Any) -> tuple[Any, ...]:
    return (
        lock.locktype,
        lock.database,
        lock.relation,
        lock.page,
        lock.tuple,
        lock.virtualxid,
        lock.xid,
        lock.classid,
        lock.objid,
        lock.objsubid,
    )


def _strength_of(locks: LockTable, sessions: dict[int, str], name: str, like: Any) -> str | None:
    """The row-lock strength session ``name`` queues with for the row of tuple lock ``like``."""
    for r in locks.same_lock(like):
        if sessions.get(r.pid) == name:
            return str(TUPLE_LOCK_STRENGTH.get(r.mode, r.mode))
    return None


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
        self._advisory_levels: dict[tuple[int, tuple[int, ...], bool], Literal["session", "transaction"]] = {}
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
            keys = advisory_keys(int(match[1]), int(match[2]), int(match[3]))
            return f"advisory lock {', '.join(str(k) for k in keys)}"
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
            BLOCKING_QUERY,
            (list(self.sessions),),
        ).fetchall()
        return tuple(
            (self.name_of(pid), tuple(self.name_of(b) for b in blockers)) for pid, blockers in rows if blockers
        )

    # -- what a step waits for, held by whom ----------------------------------------------

    def snapshot(self, blocking: bool = True) -> LockTable:
        """Every lock on the server and (``blocking``) who blocks each session, read once."""
        with self.observer.cursor(row_factory=namedtuple_row) as cursor:
            rows: list[Any] = cursor.execute(ALL_LOCKS_QUERY).fetchall()
        blockers: dict[int, list[int]] = {}
        if blocking:
            query = self.observer.execute(BLOCKING_QUERY, (list(self.sessions),))
            blockers = {pid: list(pids or ()) for pid, pids in query.fetchall()}
        return LockTable(rows, blockers)

    def describe_waits(self, pid: int) -> tuple[Wait, ...]:
        """Turn the waiter's entries in ``pg_locks`` into named waits, with their chains."""
        locks = self.snapshot()
        mine = [r for r in locks.rows if r.pid == pid]
        held_tuple = next((r for r in mine if r.locktype == "tuple" and r.granted), None)
        waits = []
        for lock in (r for r in mine if not r.granted):
            blocked_by = tuple(self.name_of(b) for b in locks.blocking.get(pid, ()) if b in self.sessions)
            if lock.locktype == "transactionid" and held_tuple is not None:
                waits.append(self._row_wait(locks, pid, held_tuple, blocked_by, via_xid=lock.xid))
            elif lock.locktype == "tuple":
                waits.append(self._row_wait(locks, pid, lock, blocked_by, via_xid=None))
            else:
                waits.append(self._lock_wait(locks, pid, lock, blocked_by))
        return tuple(waits)

    def _lock_wait(self, locks: LockTable, pid: int, lock: Any, blocked_by: tuple[str, ...]) -> Wait:
        """Any wait but a row's: the chain from the conflict table, then what the lock is."""
        chain = self._chain(locks, pid, {pid})
        holds = [link for link in chain if link.how == "holds"]
        direct = [link for link in holds if link.waiter == self.name_of(pid)]
        end = direct[0] if direct else holds[-1] if holds else None  # a holder of ours, else the queue's
        queued = tuple(link.session for link in chain if link.how == "queued" and link.waiter == self.name_of(pid))
        common: dict[str, Any] = {
            "mode": lock.mode,
            "holder": end.session if end else None,
            "holder_mode": end.mode if end else None,
            "queued_behind": queued,
            "lock_type": lock.locktype,
            "chain": chain,
        }
        if lock.locktype == "relation":
            return Wait("relation", blocked_by, table=lock.relname, **common)
        if lock.locktype == "advisory":
            key = self._advisory_key(pid, lock)
            return Wait("advisory", blocked_by, detail=str(key), advisory=key, **common)
        if lock.locktype == "transactionid":
            indexes = self._unique_candidates(locks, pid, end)
            return Wait("transaction", blocked_by, unique_indexes=indexes, **common)
        if lock.locktype == "virtualxid":
            return Wait("virtualxid", blocked_by, reason=self._progress(pid), **common)
        if lock.locktype == "spectoken":
            indexes = self._unique_candidates(locks, pid, end)
            return Wait("speculative", blocked_by, unique_indexes=indexes, **common)
        return Wait("other", blocked_by, table=lock.relname, **common)

    def _chain(self, locks: LockTable, pid: int, seen: set[int]) -> tuple[Blocker, ...]:
        """Who holds up ``pid``, link by link: holders of a conflicting granted lock
        (hard), then waiters queued ahead for a conflicting mode (soft) and, after each
        of those, what *it* waits for. ``pg_blocking_pids`` mixes the two; the lock's
        entries in ``pg_locks`` (granted or not, which modes) tell them apart.
        """
        lock = locks.waiting(pid)
        if lock is None:
            return ()
        waiter = self.name_of(pid)
        ahead = set(locks.blocking.get(pid, ()))
        holds: list[Blocker] = []
        queued: list[tuple[int, Blocker]] = []
        for other in locks.same_lock(lock):
            if not conflicts(lock.mode, other.mode):
                continue
            if other.granted and other.locktype != "tuple":
                holds.append(Blocker(waiter, self._who(other.pid), "holds", other.mode, lock.mode))
            elif other.pid in ahead:
                # A granted tuple lock is a place in a row's queue, not the row (heapam.c).
                queued.append((other.pid, Blocker(waiter, self._who(other.pid), "queued", other.mode, lock.mode)))
        links = list(dict.fromkeys(holds))
        for other_pid, link in queued:
            if link.session in {held.session for held in holds}:
                continue
            links.append(link)
            if other_pid not in seen:
                seen.add(other_pid)
                links.extend(self._chain(locks, other_pid, seen))
        return tuple(dict.fromkeys(links))

    def _unique_candidates(self, locks: LockTable, pid: int, end: Blocker | None) -> tuple[str, ...]:
        """The unique indexes an insert may be waiting on (see :attr:`Wait.unique_indexes`).

        An insert that meets an uncommitted equal key in a unique index waits for that
        transaction, holding no tuple lock; it holds RowExclusiveLock on every index of
        its table, and the other transaction wrote to the same table. Which of the
        table's unique indexes has the equal key, the server does not say.
        """
        if end is None:
            return ()
        holder_pids = [p for p, name in self.sessions.items() if name == end.session]
        written = {r.relation for r in locks.rows if r.pid in holder_pids and r.granted and r.locktype == "relation"}
        return tuple(
            sorted(
                {
                    r.relname
                    for r in locks.rows
                    if r.pid == pid
                    and r.granted
                    and r.unique_index
                    and r.mode == "RowExclusiveLock"
                    and r.index_of in written
                }
            )
        )

    def _progress(self, pid: int) -> str:
        """What the server says a waiting CREATE INDEX CONCURRENTLY (or REINDEX) is doing."""
        row = self.observer.execute(PROGRESS_QUERY, (pid,)).fetchone()
        return f"{row[0]}: {row[1]}" if row else ""

    def _advisory_key(self, pid: int, lock: Any) -> AdvisoryKey:
        """The key as the caller wrote it, shared or not, and at which level, when known."""
        keys = advisory_keys(lock.classid, lock.objid, lock.objsubid)
        shared = lock.mode == "ShareLock"
        return AdvisoryKey(keys, shared, self._advisory_level(pid, keys, shared, lock.granted))

    def _advisory_level(
        self, pid: int, keys: tuple[int, ...], shared: bool, granted: bool
    ) -> Literal["session", "transaction"] | None:
        """Session or transaction level: pg_locks does not say, so ask what the server does say.

        A lock held by a session outside any transaction is session-level. Otherwise the
        statement the server reports for the session (``pg_stat_activity.query``: the
        waiter's running statement, or the one that ran when the lock was first seen)
        names the function that took it; a level once learned is remembered while the
        lock is held. Unknown stays unknown.
        """
        memo = (pid, keys, shared)
        if granted and memo in self._advisory_levels:
            return self._advisory_levels[memo]
        row = self.observer.execute(ACTIVITY_QUERY, ([pid],)).fetchone()
        if row is None:
            return None
        _, in_transaction, query = row
        level: Literal["session", "transaction"] | None
        level = "session" if granted and not in_transaction else advisory_level_in(query or "", keys, shared)
        if granted and level is not None:
            self._advisory_levels[memo] = level
        return level

    def _row_wait(
        self, locks: LockTable, pid: int, tuple_lock: Any, blocked_by: tuple[str, ...], via_xid: str | None
    ) -> Wait:
        """A row wait: ``tuple_lock`` is the waiter's tuple lock (held, or queued for)."""
        mode, reloid, relname = tuple_lock.mode, tuple_lock.relation, tuple_lock.relname
        ctid = f"({tuple_lock.page},{tuple_lock.tuple})"
        table = self._table(reloid)
        row = self._resolve_keys(table, [ctid]).get(ctid) if table else None
        strength = TUPLE_LOCK_STRENGTH.get(mode, mode)
        if via_xid is not None:
            holder = locks.xid_holder(via_xid, self.sessions)
            queued_behind: tuple[str, ...] = ()
        else:
            # Queued for the tuple lock: the row itself is held by whoever the waiters
            # ahead of us are waiting for.
            holder = self._row_holder(locks, blocked_by)
            queued_behind = tuple(b for b in blocked_by if b != holder)
        row_locks = (self._table_locks(table) or []) if table else []  # one pgrowlocks scan for this wait
        holder_mode = _holder_mode(row_locks, ctid, holder) if holder else None
        me = self.name_of(pid)
        if via_xid is not None:  # a row several share: the server waits for each in turn
            sharers = _row_sharers(row_locks, ctid, strength, me)
            blocked_by = (*blocked_by, *(s for s in sharers if s not in blocked_by))
        chain = [
            Blocker(me, ahead, "queued", _strength_of(locks, self.sessions, ahead, tuple_lock), strength)
            for ahead in queued_behind
        ]
        if holder is not None:
            last = queued_behind[0] if queued_behind else me
            chain.append(Blocker(last, holder, "holds", holder_mode, strength if last == me else None))
        return Wait(
            "row",
            blocked_by,
            mode=strength,
            row=row,
            ctid=ctid,
            table=relname,
            holder=holder,
            holder_mode=holder_mode,
            queued_behind=queued_behind,
            lock_type="transactionid" if via_xid else "tuple",
            chain=tuple(chain),
        )

    def _row_holder(self, locks: LockTable, ahead: tuple[str, ...]) -> str | None:
        for pid in (pid for pid, name in self.sessions.items() if name in ahead):
            for lock in locks.rows:
                if lock.pid == pid and lock.locktype == "transactionid" and not lock.granted:
                    holder = locks.xid_holder(lock.xid, self.sessions)
                    if holder is not None:
                        return holder
        return ahead[0] if ahead else None

    # -- other locks held, per session ------------------------------------------------------

    def other_locks(self) -> tuple[RowLock, ...]:
        """Table, advisory and SIRead locks held by the sessions (pgrowlocks has the rows).

        Only tables of this scenario's schemas; indexes only for SIRead locks (a
        serializable index scan locks index pages). A committed serializable
        transaction's SIRead locks outlive it and stay listed under its session.
        """
        locks = self.snapshot(blocking=False)
        tables: dict[int, Table] | None = None  # read only for an SIRead lock on a tuple
        out: list[RowLock] = []
        seen_advisory: set[tuple[int, tuple[int, ...], bool]] = set()
        for lock in locks.rows:
            if not lock.granted or lock.pid not in self.sessions:
                continue
            session = self.sessions[lock.pid]
            if lock.locktype == "advisory" and lock.database is not None:
                key = self._advisory_key(lock.pid, lock)
                seen_advisory.add((lock.pid, key.keys, key.shared))
                out.append(RowLock(None, "", "", session, lock.mode, kind="advisory", advisory=key))
            elif lock.relname is None or not self._watched(lock.nspname):
                continue
            elif lock.mode == "SIReadLock":
                if tables is None and lock.locktype == "tuple":
                    tables = {t.oid: t for t in self.tables()}
                out.append(self._predicate_lock(lock, session, (tables or {}).get(lock.relation)))
            elif lock.locktype == "relation" and lock.relkind in ("r", "p", "m", "f"):
                out.append(RowLock(None, "", lock.relname, session, lock.mode, kind="relation"))
        self._advisory_levels = {k: v for k, v in self._advisory_levels.items() if k in seen_advisory}
        order = {name: i for i, name in enumerate(self.sessions.values())}
        kinds = {"relation": 0, "advisory": 1, "predicate": 2}
        out.sort(key=lambda lk: (order.get(lk.session, len(order)), kinds.get(lk.kind, 3), lk.describe_row(), lk.mode))
        return tuple(dict.fromkeys(out))

    def _watched(self, schema: str | None) -> bool:
        if schema is None or schema == "information_schema" or schema.startswith("pg_"):
            return False
        return self.schema is None or schema == self.schema

    def _predicate_lock(self, lock: Any, session: str, table: Table | None) -> RowLock:
        granularity: Literal["relation", "page", "tuple"] = (
            "tuple" if lock.locktype == "tuple" else "page" if lock.locktype == "page" else "relation"
        )
        ctid = f"({lock.page},{lock.tuple})" if granularity == "tuple" else ""
        row = self._resolve_keys(table, [ctid]).get(ctid) if table and ctid else None
        return RowLock(
            row, ctid, lock.relname, session, lock.mode, kind="predicate", granularity=granularity, page=lock.page
        )

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
        pgrowlocks = self._pgrowlocks()
        if pgrowlocks is None:
            return LockSnapshot(None, ())
        locks: list[RowLock] = []
        skipped: list[str] = []
        for table in self.tables():
            table_locks = self._table_locks(table, pgrowlocks)
            if table_locks is None:
                skipped.append(table.name)
            else:
                locks.extend(table_locks)
        order = {name: i for i, name in enumerate(self.sessions.values())}
        locks.sort(key=lambda lk: (order.get(lk.session, len(order)), lk.table, _sort_key(lk)))
        return LockSnapshot(tuple(locks), tuple(skipped))

    def _pgrowlocks(self) -> sql.Identifier | None:
        found = self.observer.execute(PGROWLOCKS_SCHEMA_QUERY).fetchone()
        return sql.Identifier(found[0], "pgrowlocks") if found is not None else None

    def _table_locks(self, table: Table, pgrowlocks: sql.Identifier | None = None) -> list[RowLock] | None:
        if table.exclusively_locked:
            return None
        pgrowlocks = pgrowlocks or self._pgrowlocks()
        if pgrowlocks is None:
            return None
        query = sql.SQL("SELECT locked_row::text, modes, pids, xids::text[] FROM {}(%s::pg_catalog.text)")
        try:
            rows = self.observer.execute(query.format(pgrowlocks), (table.name,)).fetchall()
            owners = self._owners_without_pid(
                [x for _, _, pids, xids in rows for p, x in zip(pids, xids, strict=False) if not p]
            )
        except psycopg.Error:
            return None
        ctids = [r[0] for r in rows]
        keys = self._resolve_keys(table, ctids) if ctids else {}
        out = []
        for ctid, modes, pids, xids in rows:
            for mode, pid, xid in zip(modes, pids, xids, strict=False):
                if not pid and xid not in owners:
                    continue  # a multixact member whose transaction has ended holds nothing
                out.append(
                    RowLock(
                        keys.get(ctid),
                        ctid,
                        table.name,
                        owners[xid] if not pid else self.name_of(pid),
                        mode.upper(),
                    )
                )
        return out

    def _owners_without_pid(self, xids: list[str]) -> dict[str, str]:
        """Who holds a row lock that pgrowlocks gives no pid for (pid 0), by xid; ended transactions are absent.

        pgrowlocks finds a locker's pid from its top-level xid only, and lists every member of
        a multixact, finished or not: a committed foreign-key check's FOR KEY SHARE stays in
        the multixact beside the lock of the transaction still running. A transaction still
        holds its own xid's lock (a subtransaction too, under its backend's pid; a prepared
        transaction with no pid at all), so pg_locks tells the three apart.
        """
        if not xids:
            return {}
        rows = self.observer.execute(
            "SELECT transactionid::text, pid FROM pg_catalog.pg_locks"
            " WHERE locktype = 'transactionid' AND mode = 'ExclusiveLock' AND granted"
            " AND transactionid::text = ANY(%s)",
            (xids,),
        ).fetchall()
        return {xid: self.name_of(pid) if pid else "a prepared transaction" for xid, pid in rows}

    def _resolve_keys(self, table: Table, ctids: list[str]) -> dict[str, RowRef]:
        """ctid -> primary key, read at this moment (the row version the lock is on)."""
        if table.exclusively_locked or not table.key_columns:
            return {}
        query = sql.SQL("SELECT ctid::text, {cols} FROM {table} WHERE ctid = ANY(%s::tid[])").format(
            cols=sql.SQL(", ").join(sql.Identifier(c) for c in table.key_columns),
            table=sql.SQL(table.name),  # already a quoted regclass name
        )
        try:
            # Never prepared: the scenario may change the key's type, and a prepared plan would then fail.
            rows = self.observer.execute(query, (ctids,), prepare=False).fetchall()
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
