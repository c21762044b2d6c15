"""Which process is at the other end of a client connection: its pid names a session by the program that opened it."""

from __future__ import annotations

import os
import socket
import struct


def peer_pid(sock: socket.socket) -> int | None:
    """The client's process id: SO_PEERCRED on a unix socket, else the owner of its TCP port on this machine."""
    try:
        if sock.family == socket.AF_UNIX:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            return int(struct.unpack("3i", creds)[0]) or None
        host, port = sock.getpeername()[:2]
    except OSError:
        return None
    if host not in ("127.0.0.1", "::1"):
        return None
    inode = _socket_inode(port, "/proc/net/tcp6" if ":" in host else "/proc/net/tcp")
    return None if inode is None else _owner(inode)


def connected_ports(port: int) -> set[int]:
    """The local ports of this machine's established TCP connections to ``port``: a client's end, accepted or not."""
    found: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines, None)
                for line in lines:
                    parts = line.split()
                    if len(parts) > 3 and parts[3] == "01" and int(parts[2].rsplit(":", 1)[1], 16) == port:
                        found.add(int(parts[1].rsplit(":", 1)[1], 16))
        except (OSError, ValueError, IndexError):
            continue
    return found


def in_transit(port: int) -> bool:
    """Whether bytes are on their way over a TCP connection to ``port``, in either direction.

    A client that has just sent a statement, or a reply the proxy has just sent, may sit in a
    socket queue (sent, not yet acknowledged; received, not yet read) while both ends look
    asleep in ``/proc``: the kernel's TCP table shows those queues.
    """
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines, None)
                for line in lines:
                    parts = line.split()
                    if len(parts) < 5 or parts[3] != "01" or parts[4] == "00000000:00000000":
                        continue
                    ends = (int(parts[1].rsplit(":", 1)[1], 16), int(parts[2].rsplit(":", 1)[1], 16))
                    if port in ends:
                        return True
        except (OSError, ValueError, IndexError):
            continue
    return False


def _socket_inode(port: int, table: str) -> str | None:
    """The inode of the socket whose local port is ``port`` (the client's end), from the kernel's TCP table."""
    suffix = f":{port:04X}"
    try:
        with open(table) as lines:
            next(lines, None)
            for line in lines:
                parts = line.split()
                if len(parts) > 9 and parts[1].endswith(suffix) and parts[9] != "0":
                    return parts[9]
    except OSError:
        return None
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
