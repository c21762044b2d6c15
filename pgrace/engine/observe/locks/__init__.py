"""Ask the server who is blocked, by whom, on which row, and which rows each session holds.

All queries run on the *observer* connection, never on a session's. It has a short
``lock_timeout`` and checks ``pg_locks`` before it reads a table, so watching can never
queue behind a session's ``ACCESS EXCLUSIVE`` lock and change what it watches.

How a row-lock wait looks in ``pg_locks`` (heapam.c): the first waiter holds a
``tuple`` lock on the row's ctid and waits for the holder's ``transactionid``; later
waiters queue for that ``tuple`` lock. The tuple lock's mode encodes the row-lock
strength the waiter asked for.
"""

from pgrace.engine.observe.locks.advisory import advisory_keys, advisory_level_in
from pgrace.engine.observe.locks.conflicts import CONFLICTS, ROW_CONFLICTS, ROW_STRENGTHS, conflicts
from pgrace.engine.observe.locks.inspector import LockInspector
from pgrace.engine.observe.locks.rows import LockSnapshot, Table

__all__ = [
    "CONFLICTS",
    "ROW_CONFLICTS",
    "ROW_STRENGTHS",
    "LockInspector",
    "LockSnapshot",
    "Table",
    "advisory_keys",
    "advisory_level_in",
    "conflicts",
]
