"""A bound parameter or a result value as text for the timeline, whether the client sent it as text or binary.

asyncpg binds every parameter in binary and reads every column in binary; a timeline that said
``\\x0000002a`` where the application meant 42 would hide the race it shows. The common types
are decoded here; any other binary value is shown as hex, so nothing is ever guessed.
"""

from __future__ import annotations

import datetime
import struct
import uuid
from collections.abc import Callable

BOOL, BYTEA, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 19, 20, 21, 23, 25, 26
JSON, FLOAT4, FLOAT8, UNKNOWN, BPCHAR, VARCHAR = 114, 700, 701, 705, 1042, 1043
DATE, TIMESTAMP, TIMESTAMPTZ, NUMERIC, UUID, JSONB = 1082, 1114, 1184, 1700, 2950, 3802

_EPOCH = datetime.datetime(2000, 1, 1)
_EPOCH_DATE = datetime.date(2000, 1, 1)


def shown(value: bytes | None, type_oid: int, binary: bool) -> str | None:
    """``value`` as the timeline shows it: None for NULL, text as sent, binary decoded when its type is known."""
    if value is None:
        return None
    if not binary:
        return value.decode("utf-8", errors="backslashreplace")
    decode = _DECODERS.get(type_oid)
    if decode is not None:
        try:
            return decode(value)
        except (ValueError, struct.error, OverflowError, IndexError):
            pass
    return "\\x" + value.hex()


def _integer(value: bytes) -> str:
    if len(value) not in (2, 4, 8):
        raise ValueError(len(value))
    return str(int.from_bytes(value, "big", signed=True))


def _bool(value: bytes) -> str:
    if len(value) != 1:
        raise ValueError(len(value))
    return "true" if value[0] else "false"


def _utf8(value: bytes) -> str:
    return value.decode("utf-8", errors="backslashreplace")


def _jsonb(value: bytes) -> str:
    if value[:1] != b"\x01":
        raise ValueError("jsonb version")
    return _utf8(value[1:])


def _float(value: bytes) -> str:
    return repr(struct.unpack("!f" if len(value) == 4 else "!d", value)[0])


def _uuid(value: bytes) -> str:
    return str(uuid.UUID(bytes=value))


def _date(value: bytes) -> str:
    return (_EPOCH_DATE + datetime.timedelta(days=int.from_bytes(value, "big", signed=True))).isoformat()


def _timestamp(value: bytes) -> str:
    moment = _EPOCH + datetime.timedelta(microseconds=int.from_bytes(value, "big", signed=True))
    return moment.isoformat(sep=" ")


def _timestamptz(value: bytes) -> str:
    return _timestamp(value) + "+00"


_NUMERIC_NAN, _NUMERIC_NEG, _NUMERIC_PINF, _NUMERIC_NINF = 0xC000, 0x4000, 0xD000, 0xF000


def _numeric(value: bytes) -> str:
    """PostgreSQL's binary numeric: base-10000 digits, the weight of the first, a sign, the display scale."""
    count, weight, sign, scale = struct.unpack_from("!hhHh", value)
    if len(value) != 8 + 2 * count:
        raise ValueError("numeric length")
    specials = {_NUMERIC_NAN: "NaN", _NUMERIC_PINF: "Infinity", _NUMERIC_NINF: "-Infinity"}
    if sign in specials:
        return specials[sign]
    digits = struct.unpack_from(f"!{count}H", value, 8)
    whole = "".join(f"{digit:04d}" for digit in digits)
    point = 4 * (weight + 1)  # where the decimal point falls in ``whole``
    if point <= 0:
        whole, point = "0" * (4 - point) + whole, 4
    whole = whole.ljust(point, "0")
    integer = whole[:point].lstrip("0") or "0"
    fraction = whole[point:].ljust(scale, "0")[:scale]
    text = integer + ("." + fraction if scale > 0 else "")
    return "-" + text if sign == _NUMERIC_NEG else text


_DECODERS: dict[int, Callable[[bytes], str]] = {
    INT2: _integer,
    INT4: _integer,
    INT8: _integer,
    OID: lambda value: str(int.from_bytes(value, "big", signed=False)),
    BOOL: _bool,
    TEXT: _utf8,
    VARCHAR: _utf8,
    BPCHAR: _utf8,
    NAME: _utf8,
    UNKNOWN: _utf8,
    JSON: _utf8,
    JSONB: _jsonb,
    FLOAT4: _float,
    FLOAT8: _float,
    UUID: _uuid,
    NUMERIC: _numeric,
    DATE: _date,
    TIMESTAMP: _timestamp,
    TIMESTAMPTZ: _timestamptz,
}
