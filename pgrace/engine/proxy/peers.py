"""Which process is at the other end of a client connection: its pid names a session by the program that opened it."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator


def peer_pid(sock: socket.socket) -> int | None:
    """The client's process id: SO_PEERCRED on a unix socket, else the owner of its TCP port on this machine."""
    try:
        if sock.family == socket.AF_UNIX:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            return int(struct.unpack("3i", creds)[0]) or None
        host, port = sock.getpeername()[:2]
        ours = sock.getsockname()[1]
    except OSError:
        return None
    if host not in ("127.0.0.1", "::1"):
        return None
    inode = _socket_inode(port, ours)
    return None if inode is None else _owner(inode)


def _established() -> Iterator[tuple[int, int, bool]]:
    """This machine's established TCP connections, from the kernel's tables: local port, remote
    port, and whether bytes wait in a queue (sent and not acknowledged, or received and not read)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines, None)
                rows = [line.split() for line in lines]
        except OSError:
            continue
        for parts in rows:
            if len(parts) < 5 or parts[3] != "01":
                continue
            try:
                local, remote = (int(parts[k].rsplit(":", 1)[1], 16) for k in (1, 2))
            except (ValueError, IndexError):
                continue
            yield local, remote, parts[4] != "00000000:00000000"


def connected_ports(port: int) -> set[int]:
    """The local ports of this machine's established TCP connections to ``port``: a client's end, accepted or not."""
    return {local for local, remote, _ in _established() if remote == port}


def in_transit(port: int) -> bool:
    """Whether bytes are on their way over a TCP connection to ``port``, in either direction.

    A client that has just sent a statement, or a reply the proxy has just sent, may sit in a
    socket queue (sent, not yet acknowledged; received, not yet read) while both ends look
    asleep in ``/proc``: the kernel's TCP table shows those queues.
    """
    return any(queued and port in (local, remote) for local, remote, queued in _established())


def _socket_inode(port: int, remote: int) -> str | None:
    """The inode of the client's end of a connection (local ``port``, to ``remote``), from the kernel's TCP tables.

    Both tables: a dual-stack client (the JVM's sockets are IPv6) reaches an IPv4 listener from an IPv6
    socket, listed in ``tcp6`` under the mapped address ``::ffff:127.0.0.1``.
    """
    local, far = f":{port:04X}", f":{remote:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines, None)
                for line in lines:
                    parts = line.split()
                    if len(parts) > 9 and parts[1].endswith(local) and parts[2].endswith(far) and parts[9] != "0":
                        return parts[9]
        except OSError:
            continue
    return None


def _owner(inode: str) -> int | None:
    """The process holding ``socket:[inode]`` open, if this user may look (its own processes, or root)."""
    target = f"socket:[{inode}]"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") == target:
                    return int(entry)
            except OSError:
                continue
    return None
