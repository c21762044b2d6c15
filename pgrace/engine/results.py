"""A result as pgrace keeps it: the server's exact text and the column types; values converted later, if compared."""

from __future__ import annotations

from psycopg import pq

from pgrace.model.timeline import ResultSet


def result_set(res: pq.abc.PGresult) -> ResultSet:
    """A tuple result's columns, text rows, types and command tag."""
    columns = tuple((res.fname(i) or b"").decode() for i in range(res.nfields))
    text_rows = tuple(tuple(_decode(res.get_value(r, c)) for c in range(res.nfields)) for r in range(res.ntuples))
    types = tuple(res.ftype(i) for i in range(res.nfields))
    command = (res.command_status or b"").decode()
    return ResultSet(columns, text_rows, types, command)


def _decode(value: bytes | None) -> str | None:
    return value.decode("utf-8", "replace") if value is not None else None
