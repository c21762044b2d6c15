"""Cell values: the server's text is the truth; Python values only where one compares.

A result is kept as the server's text (what every renderer prints), with each column's
type OID. :func:`cell_value` turns one cell into a Python value with psycopg's loaders
when an expectation compares it or a capture binds it, and keeps the text when psycopg
cannot (a date under ``DateStyle = Postgres, MDY``, an unknown type): a value never
crashes a run. :func:`display_cell` is how a cell is shown: its text, quoted when the
column is a string type, ``true``/``false`` for booleans, ``(void)`` for a void result.
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import psycopg
from psycopg import pq
from psycopg.adapt import Transformer

BOOL = 16
VOID = 2278
# text, varchar, bpchar, name, "char", unknown: shown quoted, as a string literal
STRING_TYPES = frozenset({25, 1043, 1042, 19, 18, 705})

_transformer = Transformer()


def cell_value(text: str | None, oid: int) -> Any:
    """The Python value of one cell, or its text when psycopg cannot load it."""
    if text is None:
        return None
    if not oid or oid in STRING_TYPES:
        return text
    try:
        return _transformer.get_loader(oid, pq.Format.TEXT).load(text.encode())
    except (psycopg.Error, ValueError, ArithmeticError, LookupError):
        return text


def display_cell(text: str | None, oid: int) -> str:
    """A cell as the timeline shows it: the server's own text, never a conversion."""
    if text is None:
        return "NULL"
    if oid == VOID:
        return "(void)"
    if oid == BOOL:
        return {"t": "true", "f": "false"}.get(text, text)
    if oid in STRING_TYPES:
        return repr(text)
    return text


def to_json_value(value: Any) -> Any:
    """Python values from the server as JSON values; exact decimals stay numbers when whole."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json_value(v) for k, v in value.items()}
    return str(value)
