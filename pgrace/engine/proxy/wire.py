"""The PostgreSQL frontend/backend protocol as bytes in, values out: framing and message meaning, no I/O.

The proxy forwards every byte untouched and only decides *when*; to decide, it must know where
each message begins and ends and what it says. Everything here is pure so that the hostile
cases (a length below 4, a length past the cap, a string without its NUL) are told without a
socket, and a malformed message is one :class:`ProtocolViolation` carrying SQLSTATE 08P01.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import NamedTuple

PROTOCOL_3_0 = 3 << 16
PROTOCOL_3_2 = (3 << 16) | 2
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
#: A TLS record's first byte (a handshake): a client that starts TLS at once (``sslnegotiation=direct``).
TLS_HANDSHAKE = 0x16

#: PostgreSQL refuses a start-up packet longer than this (MAX_STARTUP_PACKET_LENGTH); so does the proxy.
MAX_STARTUP = 10_000
#: The protocol's bound on a cancel key (3.2 made it variable); 3.0's is 4 bytes.
MAX_CANCEL_KEY = 256
MIN_CANCEL_KEY = 4
#: A frontend message longer than this ends the connection: the proxy buffers a step whole before it goes upstream.
DEFAULT_MAX_MESSAGE = 64 * 1024 * 1024
#: How much of a backend message is kept for display; the rest is forwarded and not looked at.
KEEP_BACKEND = 64 * 1024

PROTOCOL_VIOLATION = "08P01"
FEATURE_NOT_SUPPORTED = "0A000"

_INT32 = struct.Struct("!i")
_INT16 = struct.Struct("!h")
_HEADER = struct.Struct("!ci")


class ProtocolViolation(Exception):
    """A message that breaks the protocol's framing or grammar: the connection it came on ends."""

    sqlstate = PROTOCOL_VIOLATION


# ---------------------------------------------------------------------------------------------- start-up


@dataclass(frozen=True)
class Startup:
    """A StartupMessage: the protocol version asked for and the parameters (user, database, options...)."""

    version: int
    parameters: dict[str, str]
    raw: bytes

    @property
    def replication(self) -> bool:
        """Whether it asks for a replication connection (physical ``true`` or logical ``database``)."""
        value = self.parameters.get("replication", "false").lower()
        return value not in ("false", "off", "no", "0")


@dataclass(frozen=True)
class SSLRequest:
    raw: bytes


@dataclass(frozen=True)
class GSSENCRequest:
    raw: bytes


@dataclass(frozen=True)
class CancelRequest:
    """A cancel, sent on a connection of its own: the backend's pid and the key it was given."""

    pid: int
    key: bytes


@dataclass(frozen=True)
class DirectTLS:
    """A TLS ClientHello where a start-up packet belongs (PostgreSQL 17's ``sslnegotiation=direct``)."""


StartupPacket = Startup | SSLRequest | GSSENCRequest | CancelRequest | DirectTLS


def startup_packet(buffer: bytes | bytearray) -> tuple[StartupPacket, int] | None:
    """The first start-up packet in ``buffer`` and its length, or None until it is whole.

    A start-up packet has no type byte: a length (itself included) and a code. A length
    below 8 or above :data:`MAX_STARTUP` is malformed before any more is read.
    """
    if buffer[:1] == bytes([TLS_HANDSHAKE]):
        return DirectTLS(), len(buffer)
    if len(buffer) < 4:
        return None
    (length,) = _INT32.unpack_from(buffer)
    if length < 8 or length > MAX_STARTUP:
        raise ProtocolViolation(f"invalid length of startup packet: {length}")
    if len(buffer) < length:
        return None
    return parse_startup(bytes(buffer[:length])), length


def parse_startup(packet: bytes) -> StartupPacket:
    """One whole start-up packet, length included."""
    (code,) = _INT32.unpack_from(packet, 4)
    if code == SSL_REQUEST and len(packet) == 8:
        return SSLRequest(packet)
    if code == GSSENC_REQUEST and len(packet) == 8:
        return GSSENCRequest(packet)
    if code == CANCEL_REQUEST:
        key = packet[12:]
        if len(packet) < 12 or not MIN_CANCEL_KEY <= len(key) <= MAX_CANCEL_KEY:
            raise ProtocolViolation(f"invalid length of cancel request packet: {len(packet)}")
        return CancelRequest(_INT32.unpack_from(packet, 8)[0], key)
    if code >> 16 != 3:
        raise ProtocolViolation(f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}")
    fields = packet[8:]
    if not fields.endswith(b"\0"):
        raise ProtocolViolation("startup packet does not end with a NUL")
    pairs = fields[:-1]  # each name and value ends with a NUL; one more NUL ends the list
    if pairs and not pairs.endswith(b"\0"):
        raise ProtocolViolation("startup packet does not end with a NUL")
    parts = pairs[:-1].split(b"\0") if pairs else []
    if len(parts) % 2:
        raise ProtocolViolation("startup packet has a parameter name without a value")
    names = [_text(part) for part in parts[0::2]]
    values = [_text(part) for part in parts[1::2]]
    return Startup(code, dict(zip(names, values, strict=True)), packet)


def cancel_request(pid: int, key: bytes) -> bytes:
    """A CancelRequest packet for the backend ``pid`` with its ``key``."""
    return _INT32.pack(12 + len(key)) + _INT32.pack(CANCEL_REQUEST) + _INT32.pack(pid) + key


# ---------------------------------------------------------------------------------------------- messages


class Message(NamedTuple):
    """One typed message: its type byte, its body (maybe cut at a bound, for display) and its raw bytes.

    A named tuple, not a dataclass: the relay makes one per message that passes (a hundred for a
    hundred rows), and a tuple is made in a fraction of a frozen dataclass's time.
    """

    code: bytes
    body: bytes
    raw: bytes = b""
    whole: bool = True
    """False when the body was cut at :data:`KEEP_BACKEND`: its meaning beyond that is unknown."""


class Framer:
    """Splits a client's byte stream into whole typed messages, each bounded by ``max_message``."""

    def __init__(self, max_message: int = DEFAULT_MAX_MESSAGE) -> None:
        self.max_message = max_message
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        """The messages ``data`` completes, in order; a partial one waits for more."""
        if self._buffer:
            self._buffer += data
            data = bytes(self._buffer)
            self._buffer.clear()
        messages: list[Message] = []
        start, size, cap = 0, len(data), self.max_message
        while size - start >= 5:
            code, length = _HEADER.unpack_from(data, start)
            if length < 4 or length > cap:
                raise ProtocolViolation(f"invalid message length {length} for message type {code!r}")
            end = start + 1 + length
            if end > size:
                break
            raw = data[start:end]
            messages.append(Message(code, raw[5:], raw))
            start = end
        if start < size:
            self._buffer += data[start:]
        return messages

    @property
    def pending(self) -> int:
        """Bytes of a message not yet whole."""
        return len(self._buffer)


class BackendReader:
    """Follows the server's byte stream without holding it: each message's type and its first ``keep`` bytes.

    The proxy forwards the server's bytes as they come (an ErrorResponse must reach the client at
    once; a COPY TO may be gigabytes); this reads a copy of them to know when a step is done.
    """

    def __init__(self, keep: int = KEEP_BACKEND) -> None:
        self.keep = keep
        self._buffer = bytearray()
        self._skip = 0
        self._skipped: Message | None = None

    def feed(self, data: bytes) -> list[Message]:
        messages: list[Message] = []
        if self._skip:
            used = min(self._skip, len(data))
            self._skip -= used
            data = data[used:]
            if not self._skip and self._skipped is not None:
                messages.append(self._skipped)
                self._skipped = None
        if self._buffer:
            self._buffer += data
            data = bytes(self._buffer)
            self._buffer.clear()
        start, size, keep = 0, len(data), self.keep
        while size - start >= 5:
            code, length = _HEADER.unpack_from(data, start)
            if length < 4:
                raise ProtocolViolation(f"server sent an invalid message length {length}")
            end = start + 1 + length
            if length - 4 > keep:
                if end > size:
                    if size - start - 5 < keep:
                        break  # wait for the head of the body
                    self._skip = end - size
                    self._skipped = Message(code, data[start + 5 : start + 5 + keep], whole=False)
                    start = size
                    break
                messages.append(Message(code, data[start + 5 : start + 5 + keep], whole=False))
            elif end > size:
                break
            else:
                messages.append(Message(code, data[start + 5 : end]))
            start = end
        if start < size:
            self._buffer += data[start:]
        return messages


# ---------------------------------------------------------------------------------------------- fields


class Fields:
    """Reads a message body field by field; running past its end is a :class:`ProtocolViolation`."""

    __slots__ = ("at", "body", "what")

    def __init__(self, body: bytes, what: str) -> None:
        self.body = body
        self.at = 0
        self.what = what

    def _need(self, size: int) -> int:
        at = self.at
        if size < 0 or at + size > len(self.body):
            raise ProtocolViolation(f"{self.what} message is too short")
        self.at = at + size
        return at

    def int16(self) -> int:
        at = self.at
        if at + 2 > len(self.body):
            raise ProtocolViolation(f"{self.what} message is too short")
        self.at = at + 2
        return int(_INT16.unpack_from(self.body, at)[0])

    def int32(self) -> int:
        at = self.at
        if at + 4 > len(self.body):
            raise ProtocolViolation(f"{self.what} message is too short")
        self.at = at + 4
        return int(_INT32.unpack_from(self.body, at)[0])

    def raw(self, size: int) -> bytes:
        return self.body[self._need(size) : self.at]

    def byte(self) -> bytes:
        return self.raw(1)

    def cstring(self) -> str:
        end = self.body.find(b"\0", self.at)
        if end < 0:
            raise ProtocolViolation(f"{self.what} message has a string without its NUL")
        text = _text(self.body[self.at : end])
        self.at = end + 1
        return text

    def rest(self) -> bytes:
        return self.body[self._need(len(self.body) - self.at) :]


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="backslashreplace")


@dataclass(frozen=True)
class Parse:
    name: str
    sql: str
    types: tuple[int, ...]


@dataclass(frozen=True)
class Bind:
    portal: str
    statement: str
    formats: tuple[int, ...]
    values: tuple[bytes | None, ...]
    result_formats: tuple[int, ...]

    def format_of(self, index: int) -> int:
        """The format of parameter ``index``: none listed is text, one listed is every parameter's."""
        return format_at(self.formats, index)


def format_at(formats: tuple[int, ...], index: int) -> int:
    if not formats:
        return 0
    if len(formats) == 1:
        return formats[0]
    return formats[index] if index < len(formats) else 0


@dataclass(frozen=True)
class Target:
    """What a Describe or Close names: a prepared statement (``S``) or a portal (``P``)."""

    kind: str
    name: str


def query_text(body: bytes) -> str:
    return Fields(body, "Query").cstring()


def parse_parse(body: bytes) -> Parse:
    fields = Fields(body, "Parse")
    name, sql, count = fields.cstring(), fields.cstring(), fields.int16()
    if count < 0:
        raise ProtocolViolation("Parse message has a negative parameter count")
    return Parse(name, sql, tuple(fields.int32() for _ in range(count)))


def parse_bind(body: bytes) -> Bind:
    fields = Fields(body, "Bind")
    portal, statement = fields.cstring(), fields.cstring()
    formats = tuple(fields.int16() for _ in range(_count(fields)))
    values: list[bytes | None] = []
    for _ in range(_count(fields)):
        size = fields.int32()
        values.append(None if size == -1 else fields.raw(size))
    results = tuple(fields.int16() for _ in range(_count(fields)))
    return Bind(portal, statement, formats, tuple(values), results)


def _count(fields: Fields) -> int:
    count = fields.int16()
    if count < 0:
        raise ProtocolViolation(f"{fields.what} message has a negative count")
    return count


def parse_target(body: bytes, what: str) -> Target:
    fields = Fields(body, what)
    kind = fields.byte()
    if kind not in (b"S", b"P"):
        raise ProtocolViolation(f"{what} message names neither a statement nor a portal: {kind!r}")
    return Target(kind.decode(), fields.cstring())


def execute_portal(body: bytes) -> str:
    return Fields(body, "Execute").cstring()


# ---------------------------------------------------------------------------------------------- backend


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    format: int


_COLUMN = struct.Struct("!IhIhih")  # table oid, attribute number, type oid, type size, type modifier, format


def row_description(body: bytes) -> tuple[Column, ...]:
    """A RowDescription's columns, read with one struct call each: it comes with every statement's rows."""
    if len(body) < 2:
        raise ProtocolViolation("RowDescription message is too short")
    count = _INT16.unpack_from(body)[0]
    if count < 0:
        raise ProtocolViolation("RowDescription message has a negative count")
    columns = []
    at = 2
    for _ in range(count):
        end = body.find(b"\0", at)
        if end < 0:
            raise ProtocolViolation("RowDescription message has a string without its NUL")
        if end + 1 + _COLUMN.size > len(body):
            raise ProtocolViolation("RowDescription message is too short")
        _, _, type_oid, _, _, fmt = _COLUMN.unpack_from(body, end + 1)
        columns.append(Column(_text(body[at:end]), type_oid, fmt))
        at = end + 1 + _COLUMN.size
    return tuple(columns)


def data_row(body: bytes) -> tuple[bytes | None, ...]:
    """A DataRow's values; a row cut for display (:class:`BackendReader`) yields what it holds whole."""
    if len(body) < 2:
        raise ProtocolViolation("DataRow message is too short")
    count = _INT16.unpack_from(body)[0]
    if count < 0:
        raise ProtocolViolation("DataRow message has a negative count")
    values: list[bytes | None] = []
    at, whole = 2, len(body)
    for _ in range(count):
        if at + 4 > whole:
            values.append(b"...")
            break
        size = _INT32.unpack_from(body, at)[0]
        at += 4
        if size == -1:
            values.append(None)
        elif size < 0 or at + size > whole:
            values.append(b"...")
            break
        else:
            values.append(body[at : at + size])
            at += size
    return tuple(values)


def parameter_types(body: bytes) -> tuple[int, ...]:
    fields = Fields(body, "ParameterDescription")
    return tuple(fields.int32() & 0xFFFFFFFF for _ in range(_count(fields)))


def error_fields(body: bytes) -> dict[str, str]:
    """An ErrorResponse's or NoticeResponse's fields by code letter (``C``: the SQLSTATE)."""
    fields = Fields(body, "ErrorResponse")
    found: dict[str, str] = {}
    while fields.at < len(body):
        code = fields.byte()
        if code == b"\0":
            break
        found[code.decode("latin-1")] = fields.cstring()
    return found


def command_tag(body: bytes) -> str:
    return Fields(body, "CommandComplete").cstring()


@dataclass(frozen=True)
class BackendKey:
    pid: int
    key: bytes


def backend_key(body: bytes) -> BackendKey:
    fields = Fields(body, "BackendKeyData")
    pid = fields.int32()
    key = fields.rest()
    if not MIN_CANCEL_KEY <= len(key) <= MAX_CANCEL_KEY:
        raise ProtocolViolation(f"server sent a cancel key of {len(key)} bytes")
    return BackendKey(pid, key)


def parameter_status(body: bytes) -> tuple[str, str]:
    fields = Fields(body, "ParameterStatus")
    return fields.cstring(), fields.cstring()


def authentication_code(body: bytes) -> int:
    return Fields(body, "Authentication").int32()


# ---------------------------------------------------------------------------------------------- encoding


def message(code: bytes, body: bytes) -> bytes:
    return code + _INT32.pack(len(body) + 4) + body


def backend_key_data(pid: int, key: bytes) -> bytes:
    return message(b"K", _INT32.pack(pid) + key)


@dataclass(frozen=True)
class Refusal:
    """What the proxy itself says to a client it will not serve: an ErrorResponse's fields."""

    sqlstate: str
    message: str
    hint: str | None = None
    severity: str = "FATAL"
    extra: dict[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        parts = [("S", self.severity), ("V", self.severity), ("C", self.sqlstate), ("M", self.message)]
        if self.hint:
            parts.append(("H", self.hint))
        parts.extend(self.extra.items())
        body = b"".join(code.encode() + text.encode("utf-8", errors="replace") + b"\0" for code, text in parts)
        return message(b"E", body + b"\0")


#: The one-byte answer to an SSLRequest or a GSSENCRequest: not here, go on in plain text.
REFUSE_ENCRYPTION = b"N"
