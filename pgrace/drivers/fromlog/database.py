"""The incident's database, read only and lightly: the DDL of the tables involved and the rows the incident touched.

``from-log --dsn`` may point at production, and the log that names tables and keys is
hostile text. So the connection is read-only (``default_transaction_read_only``, and every
query inside one read-only transaction that is rolled back), bounded (``statement_timeout``,
``lock_timeout``, no JIT, and on PostgreSQL 14 and later the server drops it when pgrace is
gone), named in ``pg_stat_activity``, and keeps the DSN's own ``options`` (a ``search_path``).
Only user tables are read, never a catalog, and only the columns the role may read; rows are
looked up by key with the column's own type (so by the table's index), in batches. What was
copied is listed, for the team to review before the file is shared.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

__all__ = ["Described", "describe", "server_identity"]

#: How long one query of ``--dsn`` may run, and wait for a lock, on the team's server.
STATEMENT_TIMEOUT = "10s"
LOCK_TIMEOUT = "2s"
#: Keys looked up in one query (each an index probe), and rows copied of one table at most.
KEYS_PER_QUERY = 100
MOST_ROWS = 1000
#: How it shows in the team's pg_stat_activity.
APPLICATION_NAME = "pgrace from-log"

#: The schemas of PostgreSQL's catalogs: never read, whatever the log names.
_CATALOG_SCHEMAS = ("pg_catalog", "information_schema", "pg_toast")


@dataclass
class Described:
    """Setup SQL copied from the database, what it could not copy, and what it copied."""

    setup: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    keys: dict[str, list[str]] = field(default_factory=dict)
    copied: list[str] = field(default_factory=list)
    """One line per table whose rows were copied: which rows, for review before the file is shared."""
    partitioned: set[str] = field(default_factory=set)
    """The tables (as named) whose rows are in partitions: a wait names the partition, not them."""


@contextlib.contextmanager
def _connected(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A read-only, bounded connection to ``dsn`` with the DSN's own options kept; closed however the block ends."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from pgrace.errors import OptionError, ServerUnavailable
    from pgrace.servers import connstring_problem, remember_secrets, scrub_secrets

    remember_secrets(dsn)
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise OptionError(connstring_problem(exc), "dsn") from None
    bounds = (
        f"-c default_transaction_read_only=on -c statement_timeout={STATEMENT_TIMEOUT}"
        f" -c lock_timeout={LOCK_TIMEOUT} -c idle_in_transaction_session_timeout=60s"
    )
    extra: dict[str, Any] = {
        "options": f"{params.get('options') or ''} {bounds}".strip(),
        "application_name": APPLICATION_NAME,
    }
    if "connect_timeout" not in params:
        extra["connect_timeout"] = 10
    try:
        conn = psycopg.connect(dsn, **extra)
    except psycopg.ProgrammingError as exc:
        raise OptionError(connstring_problem(exc), "dsn") from None
    except psycopg.OperationalError as exc:
        raise ServerUnavailable(
            f"the incident's database: cannot connect: {scrub_secrets(' '.join(str(exc).split()), dsn)}"
        ) from None
    with conn:
        try:
            conn.read_only = True
            # JIT compiling a big query ignored even pg_terminate_backend for an hour; a server that
            # checks its client while a query runs drops the session the moment pgrace is gone.
            conn.execute("SELECT set_config('jit', 'off', false)")
            if conn.info.server_version >= 140000:
                conn.execute("SELECT set_config('client_connection_check_interval', '1s', false)")
            conn.commit()  # a setting made in a transaction rolled back would be undone with it
            yield conn
        finally:
            if not conn.closed and not conn.broken:
                conn.rollback()


def server_identity(dsn: str) -> tuple[str, str]:
    """What tells one running server from every other: its cluster's identifier and when its postmaster started.

    Two servers copied from one template share the identifier, never the start time.
    """
    with _connected(dsn) as conn:
        return _identity(conn)


def _identity(conn: psycopg.Connection[Any]) -> tuple[str, str]:
    row = conn.execute(
        "SELECT CASE WHEN has_function_privilege('pg_control_system()', 'EXECUTE')"
        " THEN (SELECT system_identifier FROM pg_control_system())::text END, pg_postmaster_start_time()::text"
    ).fetchone()
    conn.rollback()
    return (str(row[0]), str(row[1])) if row else ("", "")


def describe(
    dsn: str, tables: list[str], keys: dict[str, list[dict[str, Any]]], ctids: dict[str, list[str]]
) -> Described:
    """CREATE TABLE and INSERT statements for ``tables`` (SQL names), with the rows at ``keys`` and ``ctids``."""
    import psycopg

    from pgrace.errors import ServerUnavailable
    from pgrace.servers import scrub_secrets

    out = Described()
    later: list[str] = []  # foreign keys between the incident's tables: added once every table has its rows
    with _connected(dsn) as conn:
        resolved = _resolve(conn, tables, out)
        for found in resolved.values():
            table = found.name
            try:
                _describe_table(conn, found, resolved, keys, ctids, out, later)
            except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled) as exc:
                conn.rollback()  # a table locked, a query past its statement_timeout: the others are copied
                reason = scrub_secrets(" ".join(str(exc).splitlines()[0].split()), dsn)
                out.notes.append(f"table {table} could not be read through --dsn ({reason}): its setup is a TODO")
            except psycopg.OperationalError as exc:
                raise ServerUnavailable(
                    f"the incident's database: {scrub_secrets(' '.join(str(exc).split()), dsn)}"
                ) from None
            except psycopg.Error as exc:  # a role that may not read it
                conn.rollback()
                reason = scrub_secrets(" ".join(str(exc).split()), dsn)
                out.notes.append(
                    f"table {table} could not be read through --dsn ({reason}): what it could not copy is a TODO"
                )
    out.setup += later
    return out


@dataclass
class _Table:
    """A table the incident names, as the database knows it."""

    name: str  # as the log's statements write it (SQL text): the scenario uses that name
    oid: int
    regclass: str  # as the DSN's search_path names it
    schema: str
    kind: str  # 'r' a table, 'p' a partitioned table
    parent: int | None  # the partitioned table of a partition


def _resolve(conn: psycopg.Connection[Any], tables: list[str], out: Described) -> dict[int, _Table]:
    """The user tables ``tables`` name (SQL names, schema-qualified or on the DSN's search_path), once each.

    A partition a wait's CONTEXT names is copied with its partitioned table when the
    statements name that one.
    """
    found: dict[int, _Table] = {}
    for table in tables:
        user = _user_table(conn, table, out)
        conn.rollback()
        if user is not None and user[0] not in found:
            found[user[0]] = _Table(table, *user)
    return {oid: t for oid, t in found.items() if t.parent not in found}


def _unquoted(name: str) -> str:
    """A SQL name without its quoted parts: a dot left is a schema's."""
    return re.sub(r'"(?:[^"]|"")*"', "", name)


def _user_table(
    conn: psycopg.Connection[Any], table: str, out: Described
) -> tuple[int, str, str, str, int | None] | None:
    """The oid, qualified name, schema, kind and partitioned table of ``table`` as the DSN's ``search_path``
    resolves it, if it is a user's table."""
    row = conn.execute(
        "SELECT c.oid, c.oid::regclass::text, n.nspname, c.relkind::text,"
        " has_any_column_privilege(c.oid, 'SELECT'),"
        " (SELECT i.inhparent FROM pg_inherits i WHERE i.inhrelid = c.oid AND c.relispartition)"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)",
        [table],
    ).fetchone()
    if row is None:
        out.notes.append(f"table {table} is not in the database --dsn names: its setup is a TODO")
        return None
    oid, name, schema, kind, readable, parent = row
    if schema in _CATALOG_SCHEMAS or schema.startswith(("pg_temp", "pg_toast")):
        out.notes.append(f"{table} is one of PostgreSQL's catalogs: nothing of it is copied")
        return None
    if kind not in ("r", "p"):
        out.notes.append(f"{table} is not a table (a view, a foreign or another relation): nothing of it is copied")
        return None
    if not readable:
        out.notes.append(f"the role of --dsn may not read {table}: its setup is a TODO")
        return None
    return int(oid), str(name), str(schema), str(kind), None if parent is None else int(parent)


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
        " has_column_privilege(a.attrelid, a.attnum, 'SELECT'), a.attidentity::text, a.attgenerated::text"
        " FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
        " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        [oid],
    ).fetchall()
    if "." in _unquoted(table) and found.schema != "public":  # the log names its schema: the scenario does too
        out.setup.append(f"CREATE SCHEMA IF NOT EXISTS {sql.Identifier(found.schema).as_string(conn)};")
    parts, sequences = _columns(table, columns, out)
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
    if _copy_rows(conn, table, found.regclass, columns, keys.get(table, []), ctids.get(table, []), out):
        for sequence, column in sequences:  # the next value is past the rows copied, as it was in the database
            out.setup.append(f"SELECT setval({sequence}, max({column})) FROM {table};")


def _copy_rows(
    conn: psycopg.Connection[Any],
    table: str,
    regclass: str,
    columns: list[tuple[Any, ...]],
    keys: list[dict[str, Any]],
    ctids: list[str],
    out: Described,
) -> bool:
    """The rows the log names by key (by ctid when no key), of the columns the role may read, as an INSERT.

    Whether there were any to copy.
    """
    from psycopg import sql

    types = {c[0]: c[1] for c in columns}
    columns = [c for c in columns if not c[6]]  # a generated column is computed, not copied
    readable = [c[0] for c in columns if c[4]]
    hidden = [c[0] for c in columns if not c[4]]
    usable = [k for k in keys if k and all(col in types for col in k)]
    if not readable or not (usable or ctids):
        out.notes.append(f"no row of {table} is named by a key in the log: copy the rows it needs (TODO)")
        return False
    if hidden:
        out.notes.append(
            f"the role of --dsn may not read {table}'s column(s) {', '.join(hidden)}: they are not copied (TODO)"
        )
    literals = sql.SQL(", ").join(sql.SQL("quote_nullable({})").format(sql.Identifier(n)) for n in readable)
    head = sql.SQL("SELECT concat_ws(', ', {}) FROM {} WHERE ").format(literals, sql.SQL(regclass))
    rows: set[str] = set()
    skipped = 0
    if usable:
        if len(usable) > MOST_ROWS:
            out.notes.append(f"the log names {len(usable):,} keys of {table}: only the first {MOST_ROWS:,} are copied")
            usable = usable[:MOST_ROWS]
        for start in range(0, len(usable), KEYS_PER_QUERY):
            keyed = usable[start : start + KEYS_PER_QUERY]
            skipped += _lookup(conn, head, [(_by_key(k, types), [str(v) for v in k.values()]) for k in keyed], rows)
    else:
        where = sql.SQL("ctid = %s::tid")
        for start in range(0, min(len(ctids), MOST_ROWS), KEYS_PER_QUERY):
            batch = ctids[start : start + KEYS_PER_QUERY]
            skipped += _lookup(conn, head, [(where, [c]) for c in batch], rows)
    if skipped:
        out.notes.append(f"{skipped} key(s) of {table} in the log are not values of its columns' types: not looked up")
    if not rows:
        out.notes.append(f"the rows of {table} the incident touched are gone from the database (TODO)")
        return False
    listed = ", ".join(sql.Identifier(n).as_string(conn) for n in readable)
    names = "" if len(readable) == len(types) else f" ({listed})"
    overriding = " OVERRIDING SYSTEM VALUE" if any(c[5] == "a" for c in columns) else ""
    out.setup.append(
        f"INSERT INTO {table}{names}{overriding} VALUES\n  " + ",\n  ".join(f"({r})" for r in sorted(rows)) + ";"
    )
    out.copied.append(f"{len(rows)} row(s) of {table}" + (f" (columns {', '.join(readable)})" if hidden else ""))
    return True


def _by_key(key: dict[str, Any], types: dict[str, str]) -> sql.Composable:
    """``a = %s::<a's type> AND …``: the column's own type, so the table's index finds the row."""
    from psycopg import sql

    return sql.SQL(" AND ").join(sql.SQL("{} = %s::{}").format(sql.Identifier(col), sql.SQL(types[col])) for col in key)


def _lookup(
    conn: psycopg.Connection[Any],
    head: sql.Composable,
    conditions: list[tuple[sql.Composable, list[str]]],
    rows: set[str],
) -> int:
    """Add the rows matching any of ``conditions`` to ``rows``; a value that is not of its column's type is skipped.

    Returns how many conditions were skipped so.
    """
    import psycopg
    from psycopg import sql

    if len(rows) >= MOST_ROWS:
        return 0
    query = sql.Composed(
        [head, sql.SQL(" OR ").join(sql.SQL("({})").format(c) for c, _ in conditions), sql.SQL(f" LIMIT {MOST_ROWS}")]
    )
    try:
        with conn.transaction():  # a savepoint: a bad value undoes this query alone
            found = conn.execute(query, [p for _, params in conditions for p in params]).fetchall()
    except psycopg.DataError:  # class 22: a log's value that is not of the column's type
        if len(conditions) == 1:
            return 1
        return sum(_lookup(conn, head, [c], rows) for c in conditions)
    rows.update(r[0] for r in found[: MOST_ROWS - len(rows)])
    return 0


def _columns(table: str, columns: list[tuple[Any, ...]], out: Described) -> tuple[list[str], list[tuple[str, str]]]:
    """Each column's definition (type, NOT NULL, default, identity, generated); the sequences to set past the rows.

    A serial's sequence is made in ``out.setup`` before its table.
    """
    from pgrace.drivers.fromlog.sqlinfo import quoted

    parts = []
    sequences: list[tuple[str, str]] = []  # (sequence, column): set past the copied rows
    for name, type_, notnull, default, _readable, identity, generated in columns:
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
    return parts, sequences


#: A serial column's default: ``nextval('accounts_id_seq'::regclass)``.
_SEQUENCE = re.compile(r"nextval\('((?:[^']|'')+)'::regclass\)\Z")


def _literal(text: str) -> str:
    """``text`` inside a SQL string literal."""
    return text.replace("'", "''")
