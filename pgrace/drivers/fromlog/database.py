"""The incident's database, read only: the DDL of the tables involved and the rows the incident touched.

The connection is read-only (``default_transaction_read_only``, and every query inside one
read-only transaction that is rolled back): ``from-log --dsn`` may point at production.
"""

from __future__ import annotations

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
        for table in tables:
            try:
                _describe_table(conn, table, tables, keys, ctids, out)
            except psycopg.OperationalError as exc:
                raise ServerUnavailable(f"--dsn: {scrub_secrets(' '.join(str(exc).split()), dsn)}") from None
            except psycopg.Error as exc:  # a role that may not read it: the table is a TODO, the others are copied
                conn.rollback()
                reason = scrub_secrets(" ".join(str(exc).split()), dsn)
                out.notes.append(
                    f"table {table} could not be read through --dsn ({reason}): what it could not copy is a TODO"
                )
        conn.rollback()
    return out


def _describe_table(
    conn: psycopg.Connection[Any],
    table: str,
    tables: list[str],
    keys: dict[str, list[dict[str, Any]]],
    ctids: dict[str, list[str]],
    out: Described,
) -> None:
    """Add ``table``'s DDL and the incident's rows of it to ``out`` (read only)."""
    from psycopg import sql

    from pgrace.drivers.fromlog.sqlinfo import quoted

    row = conn.execute("SELECT to_regclass(%s)::oid", [quoted(table)]).fetchone()
    if row is None or row[0] is None:
        out.notes.append(f"table {table} is not in the database --dsn names: its setup is a TODO")
        return
    oid = row[0]
    columns = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid)"
        " FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
        " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        [oid],
    ).fetchall()
    parts = []
    for name, type_, notnull, default in columns:
        text = f"{sql.Identifier(name).as_string(conn)} {type_}"
        if notnull:
            text += " NOT NULL"
        if default is not None and not default.startswith("nextval("):
            text += f" DEFAULT {default}"
        parts.append(text)
    for conname, contype, definition, target in conn.execute(
        "SELECT conname, contype, pg_get_constraintdef(oid), confrelid::regclass::text"
        " FROM pg_constraint WHERE conrelid = %s ORDER BY contype DESC, conname",
        [oid],
    ).fetchall():
        if contype == "f" and target not in tables:
            out.notes.append(
                f"{table}'s foreign key {conname} to {target} is left out: its implicit "
                f"KEY SHARE locks on {target} are not reproduced"
            )
            return
        parts.append(f"CONSTRAINT {sql.Identifier(conname).as_string(conn)} {definition}")
    ident = sql.Identifier(table).as_string(conn)
    out.setup.append(f"CREATE TABLE {ident} (\n  " + ",\n  ".join(parts) + "\n);")
    for (index,) in conn.execute(
        "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = %s"
        " AND indexrelid NOT IN (SELECT conindid FROM pg_constraint WHERE conrelid = %s)",
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
    names = [c[0] for c in columns]
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
        literals, sql.Identifier(table), sql.SQL(" OR ").join(sql.SQL("({})").format(c) for c in conditions)
    )
    rows = [r[0] for r in conn.execute(query, params).fetchall()]
    if rows:
        out.setup.append(f"INSERT INTO {ident} VALUES\n  " + ",\n  ".join(f"({r})" for r in sorted(rows)) + ";")
    else:
        out.notes.append(f"the rows of {table} the incident touched are gone from the database (TODO)")
