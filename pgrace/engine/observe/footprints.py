"""What every session holds at one moment, for explore's reduction: its locks, its snapshot, its rows.

One round trip reads ``pg_locks`` and ``pg_stat_activity`` (``snapshot``: the session keeps one between
statements; ``snapshot-in-prefix``: it keeps one after a Flush-ended prefix, a parse in REPEATABLE READ
or a suspended portal's), the shape of every table locked
(``table|[name, schema, relname, relkind, narrowable, keyed, primary key columns]``: narrowable
without row-level security or inheritance children; keyed when the primary key is its only unique
index or exclusion constraint; each key column ``[name, int|text|other, position]``) and ``closed``,
given to every session, when the database has no trigger, rule, function (but pgrowlocks') nor a
foreign key action that may change a key (ON UPDATE CASCADE, SET NULL or SET DEFAULT, ON DELETE SET
DEFAULT): then a statement runs no SQL its text does not show. A second, only when a session holds a
table's row-level lock (a write or a ``FOR ... SHARE/UPDATE``), reads ``pgrowlocks`` on those tables
alone and names each locked row by its primary key, read at its ctid by the observer: a ctid changes
with every update, a key names the same row in every run. A session's rows of a table are reported
(``rows|table``) only when all of them could be named; otherwise the reduction takes the session to
touch every row of it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql

__all__ = ["ROW_ACTING", "footprints"]

ROW_ACTING = frozenset({"RowShareLock", "RowExclusiveLock"})  # a table lock taken to lock or write rows

# Sent after every step with ``$1`` for the pids, through a raw cursor: psycopg keeps the conversion of
# a ``%s`` query only when it is short (4096 characters), and would convert this one at every step.
_QUERY = """
WITH l AS MATERIALIZED (
  SELECT l.pid, l.locktype, l.database, l.classid, l.objid, l.objsubid, l.virtualxid, l.mode, l.granted,
         l.page, l.tuple, l.transactionid, coalesce(i.indrelid, l.relation) AS relation  -- an index's is its table's
  FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_index i ON i.indexrelid = l.relation
  WHERE l.pid = ANY($1)
)
SELECT l.pid, format('%s|%s|%s|%s|%s|%s|%s|%s|%s|%s', l.locktype, l.database,
       CASE WHEN l.relation IS NULL THEN NULL WHEN c.oid IS NULL THEN '?'
            ELSE format('%I.%I', n.nspname, c.relname) END,
       l.classid, l.objid, l.objsubid, l.virtualxid, l.mode, CASE WHEN l.granted THEN 't' ELSE 'f' END,
       c.relkind), NULL::text[]
FROM l
LEFT JOIN pg_catalog.pg_class c ON c.oid = l.relation
LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE l.locktype <> 'transactionid'
UNION ALL
SELECT pid, CASE WHEN state = 'active' THEN 'snapshot-in-prefix' ELSE 'snapshot' END, NULL
FROM pg_catalog.pg_stat_activity  -- after a Flush the backend reads the rest of the cycle, 'active'
WHERE pid = ANY($1) AND backend_xmin IS NOT NULL
  AND (state LIKE 'idle in transaction%' OR state = 'active')  -- not yet waiting for the client, maybe
UNION ALL
SELECT l.pid, 'tuple', ARRAY[format('%I.%I', n.nspname, c.relname), format('(%s,%s)', l.page, l.tuple)]
FROM l JOIN pg_catalog.pg_class c ON c.oid = l.relation JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE l.locktype = 'tuple'
UNION ALL
SELECT pid, 'xid', ARRAY[transactionid::text] FROM l
WHERE locktype = 'transactionid' AND mode = 'ExclusiveLock' AND granted
UNION ALL
SELECT 0, 'table',
       ARRAY[format('%I.%I', n.nspname, c.relname),
             (SELECT e.nspname FROM pg_catalog.pg_extension x
              JOIN pg_catalog.pg_namespace e ON e.oid = x.extnamespace WHERE x.extname = 'pgrowlocks'),
             EXISTS (SELECT 1 FROM l a  -- the observer's read would queue behind it (another's: lock_timeout)
                     WHERE a.locktype = 'relation' AND a.relation = c.oid AND a.mode = 'AccessExclusiveLock')::text]
       || ARRAY(SELECT a.attname::text FROM pg_catalog.pg_index i
                CROSS JOIN LATERAL pg_catalog.unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
                JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                WHERE i.indrelid = c.oid AND i.indisprimary ORDER BY k.n)
FROM (SELECT DISTINCT relation FROM l
      WHERE locktype = 'relation' AND granted AND mode IN ('RowShareLock', 'RowExclusiveLock')) r
JOIN pg_catalog.pg_class c  -- a temporary table is its session's alone, and no other session can read it
  ON c.oid = r.relation AND c.relkind = 'r' AND c.relpersistence <> 't'
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
UNION ALL
SELECT 0, 'info', ARRAY[pg_catalog.json_build_array(
         format('%I.%I', n.nspname, c.relname), n.nspname, c.relname, c.relkind::text,
         NOT (c.relrowsecurity OR c.relhassubclass),
         NOT (EXISTS (SELECT 1 FROM pg_catalog.pg_index u WHERE u.indrelid = c.oid AND u.indisunique
                      AND (NOT u.indisprimary OR u.indpred IS NOT NULL OR 0 = ANY(u.indkey::int2[])))
           OR EXISTS (SELECT 1 FROM pg_catalog.pg_constraint x WHERE x.conrelid = c.oid AND x.contype = 'x')),
         ARRAY(SELECT pg_catalog.json_build_array(a.attname,
                 CASE WHEN a.atttypid IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype) THEN 'int'
                      WHEN a.atttypid IN ('text'::regtype, 'varchar'::regtype) AND EXISTS (
                        SELECT 1 FROM pg_catalog.pg_collation o WHERE o.oid = a.attcollation AND o.collisdeterministic)
                      THEN 'text' ELSE 'other' END,
                 (SELECT count(*) FROM pg_catalog.pg_attribute b
                  WHERE b.attrelid = c.oid AND b.attnum > 0 AND b.attnum <= a.attnum AND NOT b.attisdropped))
               FROM pg_catalog.pg_index i
               CROSS JOIN LATERAL pg_catalog.unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
               JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
               WHERE i.indrelid = c.oid AND i.indisprimary ORDER BY k.n))::text]
FROM (SELECT DISTINCT relation FROM l WHERE locktype = 'relation' AND granted) r
JOIN pg_catalog.pg_class c ON c.oid = r.relation AND c.relkind IN ('r', 'p')
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
UNION ALL
SELECT 0, 'closed', NULL WHERE NOT EXISTS (  -- no SQL runs that a statement's text does not show
    SELECT 1 FROM pg_catalog.pg_trigger t WHERE t.oid >= 16384 AND NOT t.tgisinternal)
  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_rewrite w JOIN pg_catalog.pg_class v ON v.oid = w.ev_class
                  WHERE w.oid >= 16384 AND v.relkind <> 'v')
  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p WHERE p.oid >= 16384 AND NOT EXISTS (
                    SELECT 1 FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
                    WHERE d.classid = 'pg_catalog.pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
                      AND e.extname = 'pgrowlocks'))
  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint f WHERE f.oid >= 16384 AND f.contype = 'f'
                  AND (f.confupdtype IN ('c', 'n', 'd') OR f.confdeltype = 'd'))
"""

# pgrowlocks' words for a lock (a multixact's members say it without FOR) -> the row-lock strength.
_STRENGTHS = (
    ("key share", "FOR KEY SHARE"),
    ("share", "FOR SHARE"),
    ("no key update", "FOR NO KEY UPDATE"),
    ("update", "FOR UPDATE"),
)


def strength(mode: str) -> str:
    """pgrowlocks' mode as a row-lock strength; anything else is the strongest."""
    words = mode.lower().removeprefix("for ").strip()
    return next((s for w, s in _STRENGTHS if words == w), "FOR UPDATE")


def footprints(observer: psycopg.Connection[Any], pids: list[int]) -> dict[int, set[str]]:
    """Every session's (by pid) entries: locks, ``snapshot``, and its named rows (see the module)."""
    entries: dict[int, set[str]] = {pid: set() for pid in pids}
    xids: dict[int, set[str]] = {pid: set() for pid in pids}
    tables: list[list[str | None]] = []
    shared: set[str] = set()  # the tables' shapes, and whether the database runs SQL no text shows
    tuples: list[tuple[int, str, str]] = []
    with psycopg.RawCursor(observer) as cursor:
        found = cursor.execute(_QUERY, (pids,)).fetchall()
    for pid, entry, info in found:
        if entry == "xid":
            xids[pid].add(info[0])
        elif entry == "tuple":
            tuples.append((pid, info[0], info[1]))
        elif entry == "table":
            tables.append(info)
        elif entry == "info":
            shared.add("table|" + info[0])
        elif entry == "closed":
            shared.add("closed")
        else:
            entries[pid].add(entry)
    for held in entries.values():
        held |= shared
    if tuples:
        _wanted(observer, tuples, shared, entries)
    readable = [t for t in tables if t[1] is not None and t[2] == "false" and len(t) > 3]
    if readable:
        _rows(observer, readable, entries, xids)
    return entries


def _rows(
    observer: psycopg.Connection[Any],
    tables: list[list[str | None]],
    entries: dict[int, set[str]],
    xids: Mapping[int, set[str]],
) -> None:
    """Adds each session's named rows of ``tables`` (name, pgrowlocks' schema, _, key columns ...)."""
    shapes = []
    for name, schema, _, *keys in tables:
        assert name is not None and schema is not None
        shapes.append((name, schema, tuple(str(k) for k in keys)))
    try:
        found = observer.execute(_rows_query(tuple(shapes))).fetchall()
    except psycopg.Error:  # a table gone or out of reach: its rows stay unnamed, the reduction stays coarse
        return
    owner = {xid: pid for pid, own in xids.items() for xid in own}
    named: dict[tuple[int, str], set[str]] = {}
    unnamed: set[tuple[int, str]] = set()
    for table, locker_xids, modes, key in found:
        for xid, mode in zip(locker_xids, modes, strict=False):
            pid = owner.get(xid)
            if pid is None:
                continue  # an ended multixact member, or someone else's
            if key is None:
                unnamed.add((pid, table))
            else:
                named.setdefault((pid, table), set()).add("row|" + json.dumps([table, strength(mode), key]))
    for pid, held in entries.items():
        for name, *_ in tables:
            assert name is not None
            if (pid, name) not in unnamed and _acts_on(held, name):
                held.add("rows|" + name)
                held |= named.get((pid, name), set())


@functools.lru_cache(maxsize=256)
def _rows_query(tables: tuple[tuple[str, str, tuple[str, ...]], ...]) -> bytes:
    """The pgrowlocks read of ``tables`` (name, pgrowlocks' schema, key columns): composed once, as the
    same tables are read after step after step."""
    parts = []
    for name, schema, keys in tables:
        table = sql.SQL(name)  # already quoted by format('%I.%I')
        key = sql.SQL(", ").join(sql.SQL("t.") + sql.Identifier(k) for k in keys)
        parts.append(
            sql.SQL(
                "SELECT {name}::text, r.xids::text[], r.modes,"
                " (SELECT ROW({key})::text FROM {table} t WHERE t.ctid = r.locked_row)"
                " FROM {fn}({name}::text) r"
            ).format(name=sql.Literal(name), key=key, table=table, fn=sql.Identifier(schema, "pgrowlocks"))
        )
    return sql.SQL(" UNION ALL ").join(parts).as_bytes()


def _wanted(
    observer: psycopg.Connection[Any],
    tuples: list[tuple[int, str, str]],
    shared: set[str],
    entries: dict[int, set[str]],
) -> None:
    """Names the row of each tuple lock (a row-lock waiter's, held or queued for) by its primary key:
    ``wants|["table", "(key)"]``; a session with one it cannot name gets ``wants?``."""
    keys = {}
    for entry in shared:
        if entry.startswith("table|"):
            info = json.loads(entry[6:])
            if info[6]:
                keys[info[0]] = [column for column, _, _ in info[6]]
    parts = []
    for pid, table, ctid in tuples:
        if table in keys:
            key = sql.SQL(", ").join(sql.SQL("t.") + sql.Identifier(k) for k in keys[table])
            parts.append(
                sql.SQL(
                    "SELECT {pid}, {name}::text, (SELECT ROW({key})::text FROM {table} t WHERE t.ctid = {ctid}::tid)"
                ).format(
                    pid=sql.Literal(pid), name=sql.Literal(table), key=key, table=sql.SQL(table), ctid=sql.Literal(ctid)
                )
            )
        else:
            entries[pid].add("wants?")
    if not parts:
        return
    try:
        found = observer.execute(sql.SQL(" UNION ALL ").join(parts)).fetchall()
    except psycopg.Error:
        found = [(pid, table, None) for pid, table, _ in tuples]
    for pid, table, key in found:
        entries[pid].add("wants?" if key is None else "wants|" + json.dumps([table, key]))


def _acts_on(held: set[str], table: str) -> bool:
    return any(e.startswith("relation|") and e.split("|")[2] == table and e.split("|")[7] in ROW_ACTING for e in held)
