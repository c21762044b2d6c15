"""The one object a run asks about locks."""

from __future__ import annotations

from typing import Any, Literal

from pgrace.engine.observe.locks.rows import Table
from pgrace.engine.observe.locks.waits import WaitReader
from pgrace.model.timeline import HeldLock


class LockInspector(WaitReader):
    """Answers "blocked?", "on what?" and "who holds which rows?" for one scenario.

    Besides the rows and the waits of its bases, it reads the other locks each session holds.
    """

    def other_locks(self) -> tuple[HeldLock, ...]:
        """Table, advisory and SIRead locks held by the sessions (pgrowlocks has the rows).

        Only tables of this scenario's schemas; indexes only for SIRead locks (a
        serializable index scan locks index pages). A committed serializable
        transaction's SIRead locks outlive it and stay listed under its session.
        """
        locks = self.snapshot(blocking=False)
        tables: dict[int, Table] | None = None  # read only for an SIRead lock on a tuple
        out: list[HeldLock] = []
        seen_advisory: set[tuple[int, tuple[int, ...], bool]] = set()
        for lock in locks.rows:
            if not lock.granted or lock.pid not in self.sessions:
                continue
            session = self.sessions[lock.pid]
            if lock.locktype == "advisory" and lock.database is not None:
                key = self._advisory_key(lock.pid, lock)
                seen_advisory.add((lock.pid, key.keys, key.shared))
                out.append(HeldLock(None, "", "", session, lock.mode, kind="advisory", advisory=key))
            elif lock.relname is None or not self._watched(lock.nspname):
                continue
            elif lock.mode == "SIReadLock":
                if tables is None and lock.locktype == "tuple":
                    tables = {t.oid: t for t in self.tables()}
                out.append(self._predicate_lock(lock, session, (tables or {}).get(lock.relation)))
            elif lock.locktype == "relation" and lock.relkind in ("r", "p", "m", "f"):
                out.append(HeldLock(None, "", lock.relname, session, lock.mode, kind="relation"))
        self._advisory_levels = {k: v for k, v in self._advisory_levels.items() if k in seen_advisory}
        order = {name: i for i, name in enumerate(self.sessions.values())}
        kinds = {"relation": 0, "advisory": 1, "predicate": 2}
        out.sort(key=lambda lk: (order.get(lk.session, len(order)), kinds.get(lk.kind, 3), lk.describe_row(), lk.mode))
        return tuple(dict.fromkeys(out))

    def _watched(self, schema: str | None) -> bool:
        if schema is None or schema == "information_schema" or schema.startswith("pg_"):
            return False
        return self.schema is None or schema == self.schema

    def _predicate_lock(self, lock: Any, session: str, table: Table | None) -> HeldLock:
        granularity: Literal["relation", "page", "tuple"] = (
            "tuple" if lock.locktype == "tuple" else "page" if lock.locktype == "page" else "relation"
        )
        ctid = f"({lock.page},{lock.tuple})" if granularity == "tuple" else ""
        row = self._resolve_keys(table, [ctid]).get(ctid) if table and ctid else None
        return HeldLock(
            row, ctid, lock.relname, session, lock.mode, kind="predicate", granularity=granularity, page=lock.page
        )
