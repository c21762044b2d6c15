"""The observer's SQL, and the patterns of the server's own words it reads back."""

from __future__ import annotations

import re

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
