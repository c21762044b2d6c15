"""The incident's database, read only: the DDL of the tables involved and the rows the incident touched.

The connection is read-only (``default_transaction_read_only``, and every query inside one
read-only transaction that is rolled back): ``from-log --dsn`` may point at production.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

__all__ = ["Described", "describe"]


@dataclass
class Described:
    """Setup SQL copied from the database, and what it could not copy."""

    setup: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    keys: dict[str, list[str]] = field(default_factory=dict)
    partitioned: set[str] = field(default_factory=set)
    """The tables (as named) whose rows are in partitions: a wait names the partition, not them."""


def describe(
    dsn: str, tables: list[str], keys: dict[str, list[dict[str, Any]]], ctids: dict[str, list[str]]
) -> Described:
    """CREATE TABLE and INSERT statements for ``tables``, with the rows at ``keys`` and ``ctids``."""
    import psycopg

    from pgrace.errors import ScenarioError, ServerUnavailable
    from pgrace.servers import connstring_problem, scrub_secrets

    out = Described()
    try:
        conn = psycopg.connect(dsn, options="-c default_transaction_read_only=on", connect_timeout=10)
    except psycopg.ProgrammingError as exc:
        raise ScenarioError(f"--dsn: {connstring_problem(exc)}") from None
    except psycopg.OperationalError as exc:
        raise ServerUnavailable(f"--dsn: cannot connect: {scrub_secrets(' '.join(str(exc).split()), dsn)}") from None
    with conn:
        conn.read_only = True
        try:
            resolved = _resolve(conn, tables, out)
        except psycopg.OperationalError as exc:
            raise ServerUnavailable(f"--dsn: {scrub_secrets(' '.join(str(exc).split()), dsn)}") from None
        later: list[str] = []  # foreign keys between the incident's tables: added once every table has its rows
        for table in resolved.values():
            try:
                _describe_table(conn, table, resolved, keys, ctids, out, later)
            except psycopg.OperationalError as exc:
                raise ServerUnavailable(f"--dsn: {scrub_secrets(' '.join(str(exc).split()), dsn)}") from None
            except psycopg.Error as exc:  # a role that may not read it: the table is a TODO, the others are copied
                conn.rollback()
                reason = scrub_secrets(" ".join(str(exc).split()), dsn)
                out.notes.append(
                    f"table {table} could not be read through --dsn ({reason}): what it could not copy is a TODO"
                )
        conn.rollback()
    out.setup += later
    return out


@dataclass
class _Table:
    """A table the incident names, as the database knows it."""

    name: str  # as the log's statements write it (SQL text): the scenario uses that name
    oid: int
    schema: str
    kind: str  # 'r' a table, 'p' a partitioned table
    qualified: bool


def _resolve(conn: psycopg.Connection[Any], tables: list[str], out: Described) -> dict[int, _Table]:
    """The tables ``tables`` name (SQL names, schema-qualified or on the DSN's search_path), once each.

    A partition named by a wait's CONTEXT is its partitioned table when the statements name
    that one; an index (a wait on a unique index) is not a table.
    """
    found: dict[int, _Table] = {}
    partitions: list[tuple[str, int]] = []
    for table in tables:
        row = conn.execute(
            "SELECT c.oid, n.nspname, c.relkind::text, c.relispartition,"
            " (SELECT i.inhparent FROM pg_inherits i WHERE i.inhrelid = c.oid LIMIT 1)"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)",
            [table],
        ).fetchone()
        conn.rollback()
        if row is None:
            out.notes.append(f"table {table} is not in the database --dsn names: its setup is a TODO")
            continue
        oid, schema, kind, partition, parent = row
        if kind not in ("r", "p"):
            out.notes.append(f"{table} is not a table: nothing of it is copied")
            continue
        if partition:
            partitions.append((table, int(parent)))
        found.setdefault(int(oid), _Table(table, int(oid), str(schema), str(kind), "." in _unquoted(table)))
    for table, parent in partitions:  # copied with its partitioned table
        if parent in found:
            found = {oid: t for oid, t in found.items() if t.name != table}
    return found


def _unquoted(name: str) -> str:
    """A SQL name without its quoted parts: a dot left is a schema's."""
    return re.sub(r'"(?:[^"]|"")*"', "", name)


def _describe_table(
    conn: psycopg.Connection[Any],
    found: _Table,
    tables: dict[int, _Table],
    keys: dict[str, list[dict[str, Any]]],
    ctids: dict[str, list[str]],
    out: Described,
    later: list[str],
) -> None:
    """Add ``found``'s DDL and the incident's rows of it to ``out`` (read only); its keys to the others to ``later``."""
    from psycopg import sql

    from pgrace.drivers.fromlog.sqlinfo import quoted

    table, oid = found.name, found.oid
    columns = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid),"
        " a.attidentity::text, a.attgenerated::text"
        " FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
        " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        [oid],
    ).fetchall()
    if found.qualified and found.schema != "public":  # the log names its schema: the scenario's statements do too
        out.setup.append(f"CREATE SCHEMA IF NOT EXISTS {quoted(found.schema)};")
    parts = []
    sequences: list[tuple[str, str]] = []  # (sequence, column): set past the copied rows
    for name, type_, notnull, default, identity, generated in columns:
        column = quoted(name)
        text = f"{column} {type_}"
        if notnull:
            text += " NOT NULL"
        if identity:
            text += f" GENERATED {'ALWAYS' if identity == 'a' else 'BY DEFAULT'} AS IDENTITY"
            sequences.append((f"pg_get_serial_sequence('{_literal(table)}', '{_literal(name)}')", column))
        elif generated:
            text += f" GENERATED ALWAYS AS ({default}) STORED"
        elif default is not None:
            if seq := _SEQUENCE.match(default):  # a serial: its sequence is made, and set past the rows copied
                out.setup.append(f"CREATE SEQUENCE IF NOT EXISTS {seq.group(1)};")
                sequences.append((f"'{_literal(seq.group(1))}'", column))
            text += f" DEFAULT {default}"
        parts.append(text)
    for conname, contype, definition, target in conn.execute(
        "SELECT conname, contype, pg_get_constraintdef(oid), confrelid"
        " FROM pg_constraint WHERE conrelid = %s AND coninhcount = 0 AND contype <> 'n' ORDER BY contype DESC, conname",
        [oid],
    ).fetchall():
        constraint = f"CONSTRAINT {quoted(conname)} {definition}"
        if contype == "f":
            referenced = conn.execute("SELECT %s::regclass::text", [target]).fetchone()
            other = str(referenced[0]) if referenced else str(target)
            if target not in tables:
                out.notes.append(
                    f"{table}'s foreign key {conname} to {other} is dropped ({other} is not one of the incident's "
                    f"tables): its KEY SHARE locks on {other} are not reproduced"
                )
                continue
            # Its rows may reference rows not copied: checked for what the steps write, not for the copy.
            later.append(f"ALTER TABLE {table} ADD {constraint} NOT VALID;")
            continue
        parts.append(constraint)
    partitioned = ""
    if found.kind == "p":
        row = conn.execute("SELECT pg_get_partkeydef(%s)", [oid]).fetchone()
        partitioned = f" PARTITION BY {row[0]}" if row else ""
        out.partitioned.add(table)
    out.setup.append(f"CREATE TABLE {table} (\n  " + ",\n  ".join(parts) + f"\n){partitioned};")
    for part, bound in conn.execute(
        "SELECT c.oid::regclass::text, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
        " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s ORDER BY 1",
        [oid],
    ).fetchall():
        out.setup.append(f"CREATE TABLE {part} PARTITION OF {table} {bound};")
    for (index,) in conn.execute(
        "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = %s"
        " AND indexrelid NOT IN (SELECT conindid FROM pg_constraint WHERE conrelid = %s)"
        " AND indexrelid NOT IN (SELECT inhrelid FROM pg_inherits)",
        [oid, oid],
    ).fetchall():
        out.setup.append(index + ";")
    triggers = conn.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = %s AND NOT tgisinternal", [oid]).fetchone()
    if triggers and triggers[0]:
        out.notes.append(f"{table} has {triggers[0]} trigger(s): the locks they take are not reproduced")
    pk = conn.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
        " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND i.indisprimary",
        [oid],
    ).fetchall()
    out.keys[table] = [r[0] for r in pk]
    names = [c[0] for c in columns if not c[5]]  # a generated column is computed, not copied
    literals = sql.SQL(", ").join(sql.SQL("quote_nullable({})").format(sql.Identifier(n)) for n in names)
    conditions: list[sql.Composable] = []
    params: list[Any] = []
    for key in keys.get(table, []):
        if all(col in names for col in key):
            conditions.append(sql.SQL(" AND ").join(sql.SQL("{}::text = %s").format(sql.Identifier(c)) for c in key))
            params += [str(v) for v in key.values()]
    for ctid in [] if conditions else ctids.get(table, []):  # a key says more than a ctid
        conditions.append(sql.SQL("ctid = %s::tid"))
        params.append(ctid)
    if not conditions:
        out.notes.append(f"no row of {table} is named by a key in the log: copy the rows it needs (TODO)")
        return
    query = sql.SQL("SELECT DISTINCT concat_ws(', ', {}) FROM {} WHERE {} LIMIT 1000").format(
        literals, sql.SQL(table), sql.SQL(" OR ").join(sql.SQL("({})").format(c) for c in conditions)
    )
    rows = [r[0] for r in conn.execute(query, params).fetchall()]
    if not rows:
        out.notes.append(f"the rows of {table} the incident touched are gone from the database (TODO)")
        return
    listed = "" if len(names) == len(columns) else " (" + ", ".join(quoted(n) for n in names) + ")"
    overriding = " OVERRIDING SYSTEM VALUE" if any(c[4] == "a" for c in columns) else ""
    out.setup.append(
        f"INSERT INTO {table}{listed}{overriding} VALUES\n  " + ",\n  ".join(f"({r})" for r in sorted(rows)) + ";"
    )
    for sequence, column in sequences:  # the next value is past the rows copied, as it was past them in the database
        out.setup.append(f"SELECT setval({sequence}, max({column})) FROM {table};")


#: A serial column's default: ``nextval('accounts_id_seq'::regclass)``.
_SEQUENCE = re.compile(r"nextval\('((?:[^']|'')+)'::regclass\)\Z")


def _literal(text: str) -> str:
    """``text`` inside a SQL string literal."""
    return text.replace("'", "''")
