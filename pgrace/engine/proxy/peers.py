"""Which process is at the other end of a client connection: its pid names a session by the program that opened it."""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Iterator
from typing import NamedTuple


def peer_pid(sock: socket.socket, inode: int | None = None) -> int | None:
    """The client's process id: SO_PEERCRED on a unix socket, else the owner of its TCP port on this machine
    (``inode``: its socket's, when the caller has asked the kernel already)."""
    try:
        if sock.family == socket.AF_UNIX:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            return int(struct.unpack("3i", creds)[0]) or None
        far, near = sock.getpeername()[:2], sock.getsockname()[:2]
    except OSError:
        return None
    if far[0] not in ("127.0.0.1", "::1"):
        return None
    if not inode:
        try:
            end = tcp_end(far, near)
            inode = end.inode if end is not None else None
        except KernelSilent:
            inode = _socket_inode(far[1], near[1])
    return _owner(inode) if inode else None


class TcpEnd(NamedTuple):
    """One end of a TCP connection on this machine, as the kernel has it."""

    inode: int
    """Its socket's inode (0 once no file holds it)."""
    queued: bool
    """Established, with bytes in its queues: received and not read, or sent and not acknowledged."""


# sock_diag (linux/sock_diag.h, linux/inet_diag.h): one socket asked by its addresses.
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLMSG_ERROR = 2
_NLM_F_REQUEST = 1
_NO_COOKIE = 0xFFFFFFFF
_TCP_ESTABLISHED = 1


class KernelSilent(Exception):
    """The kernel does not answer questions about one socket (no sock_diag here): read its tables instead."""


def tcp_end(local: tuple[str, int], remote: tuple[str, int]) -> TcpEnd | None:
    """The end at ``local`` of the TCP connection to ``remote`` (IP address, port), asked of the kernel by its
    addresses (sock_diag); None when it has no such socket. Raises :class:`KernelSilent` when it cannot be asked.

    A hash lookup in the kernel, tens of microseconds: reading ``/proc/net/tcp`` walks every bucket of the
    connection table (a quarter of a million here) and costs milliseconds of kernel time each time.
    The end of a client whose IPv6 socket reaches an IPv4 address (the JVM's) is found by its IPv4 addresses.
    """
    family = socket.AF_INET6 if ":" in local[0] else socket.AF_INET
    try:
        ours, theirs = (socket.inet_pton(family, host).ljust(16, b"\0") for host, _ in (local, remote))
        request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF)
        request += struct.pack(">HH", local[1], remote[1]) + ours + theirs
        request += struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
    except (OSError, ValueError, OverflowError, struct.error):
        return None  # not an address, nor a port: no socket has it
    header = struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as diag:
            diag.send(header + request)
            answer = diag.recv(8192)
    except OSError as exc:
        raise KernelSilent(str(exc)) from None
    if len(answer) >= 20 and struct.unpack_from("=H", answer, 4)[0] == _NLMSG_ERROR:
        if -struct.unpack_from("=i", answer, 16)[0] == errno.ENOENT:
            return None
        raise KernelSilent(os.strerror(-struct.unpack_from("=i", answer, 16)[0]))
    if len(answer) < 16 + 72:
        raise KernelSilent("a short answer")
    state = answer[16 + 1]
    unread, unacknowledged, _uid, inode = struct.unpack_from("=IIII", answer, 16 + 56)
    return TcpEnd(inode, state == _TCP_ESTABLISHED and (unread > 0 or unacknowledged > 0))


class _TcpRow(NamedTuple):
    local: int
    remote: int
    established: bool
    queued: bool
    inode: int


def _tcp_table() -> Iterator[_TcpRow]:
    """This machine's TCP connections, from the kernel's tables (IPv4, then IPv6): ports, state, whether bytes wait
    in a queue (sent and not acknowledged, or received and not read) and the inode of the socket (0: none holds it).

    Both tables: a dual-stack client (the JVM's sockets are IPv6) reaches an IPv4 listener from an IPv6 socket,
    listed in ``tcp6`` under the mapped address ``::ffff:127.0.0.1``.
    """
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            parts = row.split(None, 10)  # sl, local, remote, state, queues, timer, retransmits, uid, timeout, inode
            try:
                local, remote = (int(parts[k].rsplit(":", 1)[1], 16) for k in (1, 2))
                yield _TcpRow(local, remote, parts[3] == "01", parts[4] != "00000000:00000000", int(parts[9]))
            except (ValueError, IndexError):
                continue


def in_transit(port: int) -> bool:
    """Whether bytes are on their way over a TCP connection to ``port``, in either direction, read from the
    kernel's tables (where it cannot be asked one socket at a time: :func:`tcp_end`).

    A client that has just sent a statement, or a reply the proxy has just sent, may sit in a
    socket queue (sent, not yet acknowledged; received, not yet read) while both ends look
    asleep in ``/proc``: the kernel's TCP table shows those queues.
    """
    return any(row.established and row.queued and port in (row.local, row.remote) for row in _tcp_table())


def _socket_inode(port: int, remote: int) -> int | None:
    """The inode of the client's end of a connection (local ``port``, to ``remote``), from the kernel's TCP tables."""
    return next((row.inode for row in _tcp_table() if (row.local, row.remote) == (port, remote) and row.inode), None)


def proxy_sockets(port: int) -> set[int]:
    """The inodes of the client ends of TCP connections to ``port`` on this machine, from the kernel's TCP tables
    (a closed end in TIME_WAIT has none)."""
    return {row.inode for row in _tcp_table() if row.remote == port and row.inode}


def _owner(inode: int) -> int | None:
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
