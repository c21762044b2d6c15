"""Every connection of a run, landed where the run's SQL goes and checked before any SQL is sent."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgrace.errors import RunAborted

# Backends opened by :func:`connect` per scratch schema: (pid, backend_start), so that the
# run's end terminates its own lingering sessions and never another run's.
_BACKENDS: dict[str, list[tuple[int, int]]] = {}


def connect(
    dsn: str,
    schema: str | None,
    *,
    options: str = "",
    observer: bool = False,
    autocommit: bool = True,
    connection_class: Any = psycopg.Connection,
    **kwargs: Any,
) -> Any:
    """Open one connection of a run (control, session or observer), autocommit unless told.

    ``connection_class``: the application's code gets pgrace's traced connection, which
    opens no transaction of its own (``autocommit`` False), as psycopg's default.

    ``options`` (e.g. the settings isolation specs expect) are added to the DSN's own
    rather than replacing them; in schema mode the scratch ``search_path`` comes last, so
    it wins, and is verified with ``current_schema()`` before the caller sends anything.
    The observer also searches the schema where pgrowlocks is installed, after the scratch one.
    """
    own = str(conninfo_to_dict(dsn).get("options") or "")
    merged = " ".join(part for part in (own, options, f"-c search_path={schema}" if schema else "") if part)
    if merged:
        kwargs["options"] = merged
    conn = connection_class.connect(dsn, autocommit=autocommit, **kwargs)
    if schema is None:
        return conn
    try:
        if observer:
            row = conn.execute(
                "SELECT n.nspname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                " WHERE p.proname = 'pgrowlocks' ORDER BY n.nspname = 'public' DESC LIMIT 1"
            ).fetchone()
            if row is not None:
                conn.execute(sql.SQL("SET search_path = {}, {}").format(sql.Identifier(schema), sql.Identifier(row[0])))
        found = conn.execute(
            "SELECT current_schema(), pg_backend_pid(),"
            " (SELECT (extract(epoch FROM backend_start) * 1000000)::bigint"
            "  FROM pg_stat_activity WHERE pid = pg_backend_pid())"
        ).fetchone()
        if found is None or found[0] != schema:
            raise RunAborted(
                f"a connection did not land in the scratch schema {schema} (current schema: "
                f"{found[0] if found else None}); nothing was run"
            )
        _BACKENDS.setdefault(schema, []).append((found[1], found[2]))
    except BaseException:
        conn.close()
        raise
    return conn


def observer_conninfo(dsn: str, schema: str | None = None) -> str:
    """``dsn`` with a ``search_path`` that the scenario cannot change: pg_catalog first, then ``schema``, public.

    The scenario's role owns its database, so it can set the database's default search_path
    and create functions and operators in the schemas on it; pgrace's superuser connections
    to that database never take that default.
    """
    path = ["pg_catalog", *([sql.Identifier(schema).as_string(None)] if schema else []), "public"]
    options = str(conninfo_to_dict(dsn).get("options") or "")
    return make_conninfo(dsn, options=f"{options} -c search_path={','.join(path)}".strip())
