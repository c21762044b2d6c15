"""The rows each session holds locked, read with pgrowlocks, each named by its key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgrace.engine.observe.locks.observer import SessionObserver
from pgrace.engine.observe.locks.queries import PGROWLOCKS_SCHEMA_QUERY, TABLES_QUERY
from pgrace.model.scenario import RowRef
from pgrace.model.timeline import HeldLock


@dataclass(frozen=True)
class Table:
    oid: int
    name: str
    key_columns: tuple[str, ...]
    exclusively_locked: bool


@dataclass(frozen=True)
class LockSnapshot:
    """Row locks of every table (None: pgrowlocks is missing), and tables that could not be read."""

    locks: tuple[HeldLock, ...] | None
    skipped: tuple[str, ...]


class RowLockReader(SessionObserver):
    """Reads the row locks of the watched tables, naming each row by its key and each holder by its session."""

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
        locks: list[HeldLock] = []
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

    def _table_locks(self, table: Table, pgrowlocks: sql.Identifier | None = None) -> list[HeldLock] | None:
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
                    HeldLock(
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


def _sort_key(lock: HeldLock) -> tuple[Any, ...]:
    if lock.row is None:
        return (1, lock.ctid)
    return (
        0,
        tuple(str(v).rjust(20) if isinstance(v, int) else str(v) for _, v in lock.row.key),
    )
