"""Which lock modes and row-lock strengths conflict, and one moment of pg_locks to ask it of."""

from __future__ import annotations

from typing import Any

from pgrace.engine.observe.locks.queries import TUPLE_LOCK_STRENGTH
from pgrace.model.scenario import LOCK_MODES
from pgrace.model.timeline import HeldLock

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


def row_sharers(row_locks: list[HeldLock], ctid: str, wanted: str, waiter: str) -> list[str]:
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


def row_holder_mode(row_locks: list[HeldLock], ctid: str, holder: str) -> str | None:
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


def strength_of(locks: LockTable, sessions: dict[int, str], name: str, like: Any) -> str | None:
    """The row-lock strength session ``name`` queues with for the row of tuple lock ``like``."""
    for r in locks.same_lock(like):
        if sessions.get(r.pid) == name:
            return str(TUPLE_LOCK_STRENGTH.get(r.mode, r.mode))
    return None
