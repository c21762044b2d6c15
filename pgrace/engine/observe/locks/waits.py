"""What a blocked step waits for, held by whom: a row, a table, a transaction, an advisory key, a unique value."""

from __future__ import annotations

import re
from typing import Any, Literal

from psycopg.rows import namedtuple_row

from pgrace.engine.observe.locks.advisory import advisory_keys, advisory_level_in
from pgrace.engine.observe.locks.conflicts import LockTable, conflicts, row_holder_mode, row_sharers, strength_of
from pgrace.engine.observe.locks.queries import (
    ACTIVITY_QUERY,
    ALL_LOCKS_QUERY,
    BLOCKING_QUERY,
    DEADLOCK_EDGE,
    PROGRESS_QUERY,
    TUPLE_LOCK_STRENGTH,
)
from pgrace.engine.observe.locks.rows import RowLockReader
from pgrace.model.timeline import AdvisoryKey, Wait, WaitLink


class WaitReader(RowLockReader):
    """Turns pg_locks into the waits of a blocked session, and a deadlock's DETAIL into session names."""

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

    def _chain(self, locks: LockTable, pid: int, seen: set[int]) -> tuple[WaitLink, ...]:
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
        holds: list[WaitLink] = []
        queued: list[tuple[int, WaitLink]] = []
        for other in locks.same_lock(lock):
            if not conflicts(lock.mode, other.mode):
                continue
            if other.granted and other.locktype != "tuple":
                holds.append(WaitLink(waiter, self._who(other.pid), "holds", other.mode, lock.mode))
            elif other.pid in ahead:
                # A granted tuple lock is a place in a row's queue, not the row (heapam.c).
                queued.append((other.pid, WaitLink(waiter, self._who(other.pid), "queued", other.mode, lock.mode)))
        links = list(dict.fromkeys(holds))
        for other_pid, link in queued:
            if link.session in {held.session for held in holds}:
                continue
            links.append(link)
            if other_pid not in seen:
                seen.add(other_pid)
                links.extend(self._chain(locks, other_pid, seen))
        return tuple(dict.fromkeys(links))

    def _unique_candidates(self, locks: LockTable, pid: int, end: WaitLink | None) -> tuple[str, ...]:
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
        holder_mode = row_holder_mode(row_locks, ctid, holder) if holder else None
        me = self.name_of(pid)
        if via_xid is not None:  # a row several share: the server waits for each in turn
            sharers = row_sharers(row_locks, ctid, strength, me)
            blocked_by = (*blocked_by, *(s for s in sharers if s not in blocked_by))
        chain = [
            WaitLink(me, ahead, "queued", strength_of(locks, self.sessions, ahead, tuple_lock), strength)
            for ahead in queued_behind
        ]
        if holder is not None:
            last = queued_behind[0] if queued_behind else me
            chain.append(WaitLink(last, holder, "holds", holder_mode, strength if last == me else None))
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
