"""A client connection's start-up through the proxy: encryption requests, cancels, authentication passed through.

The proxy has no certificate and never sees a password: it answers SSLRequest and GSSENCRequest
with ``N`` (a client that insists on TLS then says so itself), refuses direct TLS and replication
in an ErrorResponse that names the setting to change, and relays authentication (SCRAM, md5,
password) byte for byte between the client and the server. It keeps one thing for itself: the
cancel key. The client gets a key the proxy made; a CancelRequest carrying it is sent upstream
with the server's own key, so a cancel reaches the right backend, and only through the proxy.
"""

from __future__ import annotations

import contextlib
import secrets
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import NoReturn

from pgrace.engine.proxy import wire

#: How long a client may take over its start-up, authentication included (the server's authentication_timeout).
STARTUP_TIMEOUT_S = 60.0
#: A start-up message (SASL's, a ParameterStatus) longer than this is malformed.
MAX_STARTUP_MESSAGE = 64 * 1024

TLS_HINT = (
    "connect with sslmode=disable (and without sslnegotiation=direct): pgrace's proxy runs on this machine "
    "and speaks plain TCP"
)


class Ended(Exception):
    """The connection ended during start-up (the client left, was refused, or the proxy is closing)."""

    def __init__(self, why: str | None) -> None:
        super().__init__(why or "ended")
        self.why = why


@dataclass(frozen=True)
class Upstream:
    """Where the server listens: a host name or address, or a unix socket directory (a path), and a port."""

    host: str
    port: int

    def connect(self) -> socket.socket:
        if self.host.startswith("/"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(f"{self.host}/.s.PGSQL.{self.port}")
            except OSError:
                sock.close()
                raise
            return sock
        sock = socket.create_connection((self.host, self.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


@dataclass(frozen=True)
class Keys:
    """A backend's pid, the server's cancel key for it, and the key the proxy gave the client instead."""

    pid: int
    server_key: bytes
    client_key: bytes


class CancelKeys:
    """The keys of every live client connection, shared by the proxy's threads."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self._keys: dict[tuple[int, bytes], Keys] = {}
        self._lock = threading.Lock()

    def add(self, keys: Keys) -> None:
        with self._lock:
            self._keys[keys.pid, keys.client_key] = keys

    def remove(self, keys: Keys) -> None:
        with self._lock:
            self._keys.pop((keys.pid, keys.client_key), None)

    def cancel(self, pid: int, key: bytes) -> bool:
        """Send the server's own CancelRequest for the backend the client's ``key`` names; False if none does."""
        with self._lock:
            keys = self._keys.get((pid, key))
        if keys is None:
            return False
        send_cancel(self.upstream, keys)
        return True


def send_cancel(upstream: Upstream, keys: Keys) -> None:
    """A CancelRequest for ``keys``' backend on a connection of its own; the server answers by closing it."""
    with contextlib.suppress(OSError), upstream.connect() as sock:  # a server gone has nothing left to cancel
        sock.settimeout(5.0)
        sock.sendall(wire.cancel_request(keys.pid, keys.server_key))
        sock.recv(1)


@dataclass
class Started:
    """A client connection past its start-up: both sockets, what the client asked, and the keys."""

    client: socket.socket
    server: socket.socket
    startup: wire.Startup
    keys: Keys
    parameters: dict[str, str]
    """ParameterStatus values the server reported during start-up (application_name among them)."""
    to_client: bytes
    """The server's last start-up messages (its ReadyForQuery among them), not yet sent: sent after ``opened``."""


class Channel:
    """Blocking reads from a socket that give up when the proxy closes or the start-up takes too long."""

    def __init__(self, sock: socket.socket, wake: socket.socket, closing: threading.Event, deadline: float) -> None:
        self.sock = sock
        self.wake = wake
        self.closing = closing
        self.deadline = deadline

    def wait(self, *others: socket.socket) -> list[socket.socket]:
        """The sockets (``sock`` and ``others``) that have something to read."""
        with selectors.DefaultSelector() as selector:
            for sock in (self.sock, *others, self.wake):
                selector.register(sock, selectors.EVENT_READ)
            while True:
                if self.closing.is_set():
                    raise Ended("the proxy is closing")
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise Ended("the client took too long to start up")
                ready = [key.fileobj for key, _ in selector.select(left)]
                if self.wake in ready:
                    raise Ended("the proxy is closing")
                if ready:
                    return [sock for sock in ready if isinstance(sock, socket.socket)]

    def recv(self, sock: socket.socket) -> bytes:
        try:
            data = sock.recv(65536)
        except OSError as exc:
            raise Ended(f"connection lost during start-up: {exc}") from None
        if not data:
            raise Ended(None if sock is self.sock else "the server closed the connection during start-up")
        return data


def start(
    client: socket.socket, wake: socket.socket, closing: threading.Event, upstream: Upstream, cancels: CancelKeys
) -> Started:
    """Take ``client`` through its start-up to the server's ReadyForQuery, or raise :class:`Ended`."""
    channel = Channel(client, wake, closing, time.monotonic() + STARTUP_TIMEOUT_S)
    startup = _startup_message(channel, cancels)
    if startup.replication:
        _refuse(client, wire.FEATURE_NOT_SUPPORTED, "pgrace's proxy does not relay replication connections", None)
    try:
        server = upstream.connect()
    except OSError as exc:
        _refuse(client, "08006", f"pgrace's proxy could not reach the server: {exc}", None)
    try:
        server.sendall(startup.raw)
        return _authenticate(channel, server, startup, cancels)
    except BaseException:
        server.close()
        raise


def _startup_message(channel: Channel, cancels: CancelKeys) -> wire.Startup:
    """Read start-up packets until a StartupMessage, answering encryption requests and cancels on the way."""
    buffer = bytearray()
    while True:
        try:
            found = wire.startup_packet(buffer)
        except wire.ProtocolViolation as exc:
            _refuse(channel.sock, exc.sqlstate, str(exc), None)
        if found is None:
            _read_more(channel, buffer)
            continue
        packet, length = found
        del buffer[:length]
        if isinstance(packet, wire.DirectTLS):
            _refuse(channel.sock, wire.FEATURE_NOT_SUPPORTED, "pgrace's proxy does not accept TLS", TLS_HINT)
        if isinstance(packet, wire.CancelRequest):
            cancels.cancel(packet.pid, packet.key)
            raise Ended(None)
        if isinstance(packet, wire.Startup):
            if buffer:
                _refuse(channel.sock, wire.PROTOCOL_VIOLATION, "unexpected data after the startup packet", None)
            return packet
        if buffer:  # bytes sent before the answer to an encryption request: refused, as the server does
            _refuse(channel.sock, wire.PROTOCOL_VIOLATION, "received unencrypted data after SSL request", None)
        channel.sock.sendall(wire.REFUSE_ENCRYPTION)


def _read_more(channel: Channel, buffer: bytearray) -> None:
    channel.wait()
    buffer += channel.recv(channel.sock)


def _authenticate(channel: Channel, server: socket.socket, startup: wire.Startup, cancels: CancelKeys) -> Started:
    """Relay the exchange both ways until the server's ReadyForQuery, keeping its BackendKeyData for the proxy."""
    from_client = wire.Framer(MAX_STARTUP_MESSAGE)
    from_server = wire.Framer(MAX_STARTUP_MESSAGE)
    keys: Keys | None = None
    parameters: dict[str, str] = {}
    while True:
        for sock in channel.wait(server):
            if sock is channel.sock:
                try:
                    messages = from_client.feed(channel.recv(sock))
                except wire.ProtocolViolation as exc:
                    _refuse(channel.sock, exc.sqlstate, str(exc), None)
                for message in messages:
                    if message.code != b"p":
                        _refuse(channel.sock, wire.PROTOCOL_VIOLATION, f"unexpected message {message.code!r}", None)
                    server.sendall(message.raw)
                continue
            out = bytearray()
            for message in from_server.feed(channel.recv(server)):
                if message.code == b"K":
                    key = wire.backend_key(message.body)
                    keys = Keys(key.pid, key.key, secrets.token_bytes(len(key.key)))
                    out += wire.backend_key_data(keys.pid, keys.client_key)
                    continue
                if message.code == b"S":
                    name, value = wire.parameter_status(message.body)
                    parameters[name] = value
                out += message.raw
                if message.code == b"E":
                    channel.sock.sendall(out)
                    raise Ended(wire.error_fields(message.body).get("M", "the server refused the connection"))
                if message.code == b"Z":
                    if keys is None:
                        _refuse(channel.sock, wire.PROTOCOL_VIOLATION, "the server sent no BackendKeyData", None)
                    cancels.add(keys)
                    return Started(channel.sock, server, startup, keys, parameters, bytes(out))
            channel.sock.sendall(out)


def _refuse(client: socket.socket, sqlstate: str, text: str, hint: str | None) -> NoReturn:
    """Tell the client why in an ErrorResponse, then end the connection."""
    with contextlib.suppress(OSError):
        client.sendall(wire.Refusal(sqlstate, text, hint).encode())
    raise Ended(text)
