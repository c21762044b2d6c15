"""What the kernel says of the proxy's connections: one socket asked by its addresses (sock_diag), which must
agree with the kernel's TCP tables that it replaces on every look."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pgrace.engine.proxy.peers import _socket_inode, in_transit, peer_pid, proxy_sockets, tcp_end


@contextmanager
def connection(family: socket.AddressFamily, host: str) -> Iterator[tuple[socket.socket, socket.socket]]:
    """A client socket of ``family`` connected to ``host`` on an IPv4 listener, and the accepted end."""
    with socket.create_server(("127.0.0.1", 0)) as listener, socket.socket(family) as client:
        client.connect((host, listener.getsockname()[1]))
        accepted, _ = listener.accept()
        with accepted:
            yield client, accepted


def ends(sock: socket.socket) -> tuple[tuple[str, int], tuple[str, int]]:
    return sock.getsockname()[:2], sock.getpeername()[:2]


def test_each_end_is_the_socket_the_tcp_table_lists() -> None:
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::ffff:127.0.0.1")):
        with connection(family, host) as (_, accepted):
            proxy_end, client_end = ends(accepted)
            theirs, ours = tcp_end(client_end, proxy_end), tcp_end(proxy_end, client_end)
            assert theirs is not None and ours is not None and theirs.inode != ours.inode
            # The JVM's IPv6 socket to an IPv4 address is found by the IPv4 addresses the proxy sees.
            assert theirs.inode == _socket_inode(client_end[1], proxy_end[1]), family
            assert ours.inode == _socket_inode(proxy_end[1], client_end[1]), family
            assert peer_pid(accepted) == os.getpid() == peer_pid(accepted, theirs.inode)
            assert theirs.inode in proxy_sockets(proxy_end[1]) and ours.inode not in proxy_sockets(proxy_end[1])


def test_bytes_sent_and_not_read_are_queued_at_the_end_that_has_not_read_them() -> None:
    with connection(socket.AF_INET, "127.0.0.1") as (client, accepted):
        proxy_end, client_end = ends(accepted)
        client.sendall(b"Q")
        deadline = time.monotonic() + 5
        while not (ours := tcp_end(proxy_end, client_end)) or not ours.queued:  # loopback: in the queue at once
            assert time.monotonic() < deadline, "the sent byte never reached the proxy's end"
        assert in_transit(proxy_end[1])  # the table says so too
        assert accepted.recv(1) == b"Q"
        assert tcp_end(proxy_end, client_end) == (ours.inode, False)
        assert not in_transit(proxy_end[1])


def test_a_connection_that_is_not_there_is_none() -> None:
    with connection(socket.AF_INET, "127.0.0.1") as (_, accepted):
        proxy_end, client_end = ends(accepted)
    assert tcp_end(("127.0.0.1", 1), ("127.0.0.1", 2)) is None
    closed = tcp_end(client_end, proxy_end)  # the closing end lingers in TIME_WAIT, held by no file
    assert closed is None or (closed.inode == 0 and not closed.queued)
    assert tcp_end(("not an address", 1), ("127.0.0.1", 2)) is None
