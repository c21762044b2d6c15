"""pgjdbc through ``--exec``: a JVM's connections are its command's sessions, and its quiet is proved.

The JVM runs threads of its own beside the application's, asleep in timed waits; the rule that
excuses them (:mod:`pgrace.engine.proxy.processes`) is tested here on real JVMs, then the shipped
lost-update and a SKIP LOCKED claim are explored with Java clients compiled in the test's tmp dir.
"""

from __future__ import annotations

import os
import socket

from pgrace.engine.proxy.peers import peer_pid


def test_a_dual_stack_client_is_found_in_the_ipv6_table() -> None:
    """The JVM's sockets are IPv6: its connection to the IPv4 proxy is listed in tcp6, under ::ffff:127.0.0.1."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        with socket.socket(socket.AF_INET6) as client:
            client.connect(("::ffff:127.0.0.1", port))
            accepted, _ = listener.accept()
            with accepted:
                assert peer_pid(accepted) == os.getpid()
