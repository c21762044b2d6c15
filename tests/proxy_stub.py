"""A Simple-Query relay for the session transport's tests while the protocol's own relay is being written.

It speaks just enough of the protocol (start-up passed through, ``Query`` steps, a
``Parse``...``Sync`` cycle as one step) to drive :class:`~pgrace.engine.proxy.session.ProxyHooks`
with real clients over real sockets.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Statement:
    sql: str
    params: tuple[str | None, ...]
    kind: Literal["query", "extended", "flush", "copy", "other"]
    data: bytes


@dataclass(frozen=True)
class Reply:
    tags: tuple[str, ...]
    rows: tuple[tuple[str | None, ...], ...]
    columns: tuple[str, ...]
    error: dict[str, str] | None
    status: bytes | None


@dataclass
class Client:
    number: int
    application_name: str | None
    backend_pid: int
    peer_pid: int | None
    peer_port: int | None = None


def _read(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return out


def _message(sock: socket.socket) -> tuple[bytes, bytes]:
    head = _read(sock, 5)
    (length,) = struct.unpack("!i", head[1:])
    return head[:1], head + _read(sock, length - 4)


def _peer_pid(port: int, listen_port: int) -> int | None:
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == port and int(cols[2].rsplit(":", 1)[1], 16) == listen_port:
                    inode = cols[9]
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return int(pid)
    return None


class StubProxy:
    def __init__(self, upstream_host: str, upstream_port: int, hooks: Any) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.hooks = hooks
        self.host = "127.0.0.1"
        self.listener = socket.create_server((self.host, 0))
        self.port = self.listener.getsockname()[1]
        self.threads: list[threading.Thread] = []
        self.socks: list[socket.socket] = []
        self.count = 0
        self.lock = threading.Lock()
        self.closing = False

    def __enter__(self) -> StubProxy:
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing = True
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self.lock:
            for s in self.socks:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
        for t in self.threads:
            t.join(5)

    def _accept(self) -> None:
        while not self.closing:
            try:
                conn, addr = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.count += 1
                t = threading.Thread(target=self._serve, args=(conn, addr[1], self.count), daemon=True)
                self.threads.append(t)
                self.socks.append(conn)
            t.start()

    def _connect_upstream(self) -> socket.socket:
        host, port = self.upstream
        if host.startswith("/"):
            up = socket.socket(socket.AF_UNIX)
            up.connect(f"{host}/.s.PGSQL.{port}")
        else:
            up = socket.create_connection((host, port))
        with self.lock:
            self.socks.append(up)
        return up

    def _serve(self, client: socket.socket, port: int, number: int) -> None:  # noqa: C901, PLR0915
        up = None
        info = None
        try:
            while True:
                (length,) = struct.unpack("!i", _read(client, 4))
                body = _read(client, length - 4)
                code = struct.unpack("!i", body[:4])[0]
                if code in (80877103, 80877104):
                    client.sendall(b"N")
                    continue
                break
            params = body[4:].split(b"\0")
            pairs = dict(zip(params[::2], params[1::2], strict=False))
            app = pairs.get(b"application_name", b"").decode() or None
            up = self._connect_upstream()
            up.sendall(struct.pack("!i", length) + body)
            pid = 0
            while True:  # authentication until the first ReadyForQuery, both ways
                readable, _, _ = select.select([client, up], [], [])
                if up in readable:
                    kind, msg = _message(up)
                    client.sendall(msg)
                    if kind == b"K":
                        pid = struct.unpack("!i", msg[5:9])[0]
                    if kind == b"Z":
                        break
                    if kind == b"E":
                        return
                if client in readable:
                    _, msg = _message(client)
                    up.sendall(msg)
            info = Client(number, app, pid, _peer_pid(port, self.port), port)
            self.hooks.opened(info)
            while True:
                kind, msg = _message(client)
                if kind == b"X":
                    up.sendall(msg)
                    return
                data = msg
                sql = ""
                if kind == b"Q":
                    sql = msg[5:-1].decode()
                    stmt = Statement(sql, (), "query", data)
                else:
                    while kind != b"S":
                        if kind == b"P":
                            sql = msg[5:].split(b"\0")[1].decode()
                        kind, msg = _message(client)
                        data += msg
                    stmt = Statement(sql, (), "extended", data)
                self.hooks.ready(info, stmt)
                up.sendall(data)
                tags: list[str] = []
                rows: list[tuple[str | None, ...]] = []
                columns: tuple[str, ...] = ()
                error = None
                while True:
                    k, m = _message(up)
                    client.sendall(m)
                    if k == b"C":
                        tags.append(m[5:-1].decode())
                    elif k == b"T":
                        n = struct.unpack("!h", m[5:7])[0]
                        pos, names = 7, []
                        for _ in range(n):
                            end = m.index(b"\0", pos)
                            names.append(m[pos:end].decode())
                            pos = end + 1 + 18
                        columns = tuple(names)
                    elif k == b"D":
                        n = struct.unpack("!h", m[5:7])[0]
                        pos = 7
                        cells: list[str | None] = []
                        for _ in range(n):
                            (size,) = struct.unpack("!i", m[pos : pos + 4])
                            pos += 4
                            if size < 0:
                                cells.append(None)
                            else:
                                cells.append(m[pos : pos + size].decode())
                                pos += size
                        rows.append(tuple(cells))
                    elif k == b"E":
                        fields = {}
                        for part in m[5:-1].split(b"\0"):
                            if part:
                                fields[part[:1].decode()] = part[1:].decode()
                        error = fields
                    elif k == b"Z":
                        self.hooks.done(info, stmt, Reply(tuple(tags), tuple(rows), columns, error, m[5:6]))
                        break
        except Exception:
            pass
        finally:
            if info is not None:
                self.hooks.closed(info, None)
            for s in (client, up):
                if s is not None:
                    with contextlib.suppress(OSError):
                        s.close()
