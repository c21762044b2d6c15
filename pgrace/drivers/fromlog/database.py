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


@contextlib.contextmanager
def _connected(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A read-only, bounded connection to ``dsn`` with the DSN's own options kept; closed however the block ends."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from pgrace.errors import ScenarioError, ServerUnavailable
    from pgrace.servers import connstring_problem, remember_secrets, scrub_secrets

    remember_secrets(dsn)
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ScenarioError(f"--dsn: {connstring_problem(exc)}") from None
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
        raise ScenarioError(f"--dsn: {connstring_problem(exc)}") from None
    except psycopg.OperationalError as exc:
        raise ServerUnavailable(f"--dsn: cannot connect: {scrub_secrets(' '.join(str(exc).split()), dsn)}") from None
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
    with _connected(dsn) as conn:
        for table in tables:
            try:
                _describe_table(conn, table, tables, keys, ctids, out)
            except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled) as exc:
                conn.rollback()  # a table locked, a query past its statement_timeout: the others are copied
                reason = scrub_secrets(" ".join(str(exc).splitlines()[0].split()), dsn)
                out.notes.append(f"table {table} could not be read through --dsn ({reason}): its setup is a TODO")
            except psycopg.OperationalError as exc:
                raise ServerUnavailable(f"--dsn: {scrub_secrets(' '.join(str(exc).split()), dsn)}") from None
            except psycopg.Error as exc:  # a role that may not read it
                conn.rollback()
                reason = scrub_secrets(" ".join(str(exc).split()), dsn)
                out.notes.append(
                    f"table {table} could not be read through --dsn ({reason}): what it could not copy is a TODO"
                )
    return out


def _user_table(conn: psycopg.Connection[Any], table: str, out: Described) -> tuple[int, str, str] | None:
    """The oid and qualified name of ``table`` as the DSN's ``search_path`` resolves it, if it is a user's table."""
    row = conn.execute(
        "SELECT c.oid, c.oid::regclass::text, n.nspname, c.relkind::text,"
        " has_any_column_privilege(c.oid, 'SELECT')"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)",
        [table],
    ).fetchone()
    if row is None:
        out.notes.append(f"table {table} is not in the database --dsn names: its setup is a TODO")
        return None
    oid, name, schema, kind, readable = row
    if schema in _CATALOG_SCHEMAS or schema.startswith(("pg_temp", "pg_toast")):
        out.notes.append(f"{table} is one of PostgreSQL's catalogs: nothing of it is copied")
        return None
    if kind not in ("r", "p"):
        out.notes.append(f"{table} is not a table (a view, a foreign or another relation): nothing of it is copied")
        return None
    if not readable:
        out.notes.append(f"the role of --dsn may not read {table}: its setup is a TODO")
        return None
    return int(oid), str(name), str(schema)


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

    found = _user_table(conn, table, out)
    if found is None:
        return
    oid, regclass, schema = found
    columns = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid),"
        " has_column_privilege(a.attrelid, a.attnum, 'SELECT')"
        " FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
        " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        [oid],
    ).fetchall()
    parts = []
    for name, type_, notnull, default, _readable in columns:
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
    if "." in table and schema != "public":  # the log names its schema: the scenario's statements do too
        out.setup.append(f"CREATE SCHEMA IF NOT EXISTS {sql.Identifier(schema).as_string(conn)};")
    out.setup.append(f"CREATE TABLE {table} (\n  " + ",\n  ".join(parts) + "\n);")
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
    _copy_rows(conn, table, regclass, columns, keys.get(table, []), ctids.get(table, []), out)


def _copy_rows(
    conn: psycopg.Connection[Any],
    table: str,
    regclass: str,
    columns: list[tuple[Any, ...]],
    keys: list[dict[str, Any]],
    ctids: list[str],
    out: Described,
) -> None:
    """The rows the log names by key (by ctid when no key), of the columns the role may read, as an INSERT."""
    from psycopg import sql

    types = {c[0]: c[1] for c in columns}
    readable = [c[0] for c in columns if c[4]]
    hidden = [c[0] for c in columns if not c[4]]
    usable = [k for k in keys if k and all(col in types for col in k)]
    if not readable or not (usable or ctids):
        out.notes.append(f"no row of {table} is named by a key in the log: copy the rows it needs (TODO)")
        return
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
        return
    names = "" if not hidden else " (" + ", ".join(sql.Identifier(n).as_string(conn) for n in readable) + ")"
    out.setup.append(f"INSERT INTO {table}{names} VALUES\n  " + ",\n  ".join(f"({r})" for r in sorted(rows)) + ";")
    out.copied.append(f"{len(rows)} row(s) of {table}" + (f" (columns {', '.join(readable)})" if hidden else ""))


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
