"""What one look at the proxy's connections costs: the kernel's TCP tables read whole, or each end asked alone.

Usage: ``python bench/bench_peers.py [CONNECTIONS] [LOOKS]``

``--exec`` explorations look at the proxy's connections many times a step (bytes in transit, the
clients' socket inodes). Reading ``/proc/net/tcp`` and ``tcp6`` makes the kernel walk every bucket
of its connection table, however few connections there are; ``peers.tcp_end`` asks for one socket by
its addresses (sock_diag), a hash lookup. With CONNECTIONS client connections open (3 by default, a
scenario's sessions), the median wall and CPU time of one look each way, and their ratio, in one run.
"""

from __future__ import annotations

import socket
import statistics
import sys
import time
from collections.abc import Callable

from pgrace.engine.proxy.peers import in_transit, tcp_end


def timed(look: Callable[[], object], looks: int) -> tuple[float, float]:
    """Median wall and mean CPU microseconds of one look."""
    walls = []
    cpu = time.process_time()
    for _ in range(looks):
        started = time.perf_counter()
        look()
        walls.append(time.perf_counter() - started)
    return statistics.median(walls) * 1e6, (time.process_time() - cpu) / looks * 1e6


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    looks = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
        accepted = [listener.accept()[0] for _ in clients]
        pairs = [(s.getsockname()[:2], s.getpeername()[:2]) for s in accepted]

        def table() -> object:
            return in_transit(port)

        def one_by_one() -> object:
            return [(tcp_end(near, far), tcp_end(far, near)) for near, far in pairs]

        with open("/proc/net/tcp") as f:
            rows = len(f.read().splitlines()) - 1
        print(f"{count} connections, {rows} rows in /proc/net/tcp, {looks} looks each way")
        whole, whole_cpu = timed(table, looks)
        each, each_cpu = timed(one_by_one, looks)
        print(f"  tables read whole   {whole:9.1f} µs wall {whole_cpu:9.1f} µs CPU")
        print(f"  each end asked      {each:9.1f} µs wall {each_cpu:9.1f} µs CPU")
        print(f"  ratio               {whole / each:9.1f} x     {whole_cpu / each_cpu:9.1f} x")
        for sock in (*clients, *accepted):
            sock.close()


if __name__ == "__main__":
    main()
