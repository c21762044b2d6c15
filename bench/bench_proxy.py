"""The proxy's cost per statement: N ``SELECT 1`` through the proxy (hooks that let everything go at once) and direct.

Usage: ``python bench/bench_proxy.py [--statements N] [--rounds R]``

One embedded server, one run: each round times N statements on a connection through the proxy
and N on a direct connection, alternately, so a busy machine slows both alike; the medians of
the per-statement times and their ratio are printed, for Simple Query (``SELECT 1``) and for an
extended cycle with a bound parameter (``SELECT %s::int``). Each client is a process of its own,
as an application is (a client thread in this process would share the relay's interpreter lock),
and the relay's CPU time per statement is printed beside: on a loaded machine the wall-clock
ratio mostly measures how long the two extra hops wait for a core. The direct connection uses the
server's unix socket (the embedded server listens on no TCP port); the proxied one reaches the
proxy over TCP on 127.0.0.1 (as ``--exec`` clients do), and the proxy reaches the server over the
same unix socket. A third client reaches the proxy over its own unix socket: the same transport
as the direct one, so the difference is the relay's hop alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pgrace.engine.proxy.relay import Client, Proxy, Reply, Statement
from pgrace.servers import open_server

GOAL = 1.2  # issue 32: a statement through the proxy costs at most this many times the same statement direct


class Immediate:
    """Hooks that let every statement go at once and keep nothing: the relay's own cost."""

    def opened(self, client: Client) -> None:
        pass

    def ready(self, client: Client, statement: Statement) -> None:
        pass

    def done(self, client: Client, statement: Statement, reply: Reply) -> None:
        pass

    def closed(self, client: Client, why: str | None) -> None:
        pass


#: The client, a process of its own as an application is: it prints its time per statement.
CLIENT = r"""
import sys, time, psycopg
conn = psycopg.connect(sys.argv[1], autocommit=True)
count, extended = int(sys.argv[2]), sys.argv[3] == "extended"
pgconn = conn.pgconn
for n in range(200):  # warm up: plans, caches
    conn.execute("SELECT %s::int", (n,)) if extended else pgconn.exec_(b"SELECT 1")
start = time.perf_counter()
if extended:
    for n in range(count):
        conn.execute("SELECT %s::int", (n,))
else:
    for _ in range(count):
        pgconn.exec_(b"SELECT 1")  # libpq's PQexec: one Query message, the Simple Query protocol
print((time.perf_counter() - start) / count)
"""


def per_statement(conninfo: str, count: int, how: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, conninfo, str(count), how], capture_output=True, text=True, check=True
    )
    return float(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--statements", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    worst = 0.0
    with open_server(None) as server:
        params = conninfo_to_dict(server.dsn)
        host, port = str(params["host"]), int(str(params.get("port") or 5432))
        with tempfile.TemporaryDirectory() as sockets, Proxy(host, port, Immediate(), socket_dir=sockets) as proxy:
            who = f"dbname={params.get('dbname')} user={params.get('user')}"
            through = f"{proxy.dsn} {who}"
            local = f"host={sockets} port={proxy.port} {who}"
            print(f"{args.rounds} rounds of {args.statements} statements each way, alternated")
            for how, label in (("simple", "simple SELECT 1"), ("extended", "extended SELECT $1::int")):
                times: dict[str, list[float]] = {"direct": [], "proxy": [], "unix": []}
                relay_cpu: list[float] = []
                for _ in range(args.rounds):
                    times["direct"].append(per_statement(server.dsn, args.statements, how))
                    cpu = time.process_time()  # this process runs only the relay's threads meanwhile
                    times["proxy"].append(per_statement(through, args.statements, how))
                    relay_cpu.append((time.process_time() - cpu) / (args.statements + 200))
                    times["unix"].append(per_statement(local, args.statements, how))
                direct_us = statistics.median(times["direct"]) * 1e6
                proxy_us = statistics.median(times["proxy"]) * 1e6
                unix_us = statistics.median(times["unix"]) * 1e6
                ratio = proxy_us / direct_us
                worst = max(worst, ratio)
                print(
                    f"{label:24} direct {direct_us:7.1f} µs  proxy {proxy_us:7.1f} µs  ratio {ratio:.2f}  "
                    f"(relay CPU {statistics.median(relay_cpu) * 1e6:.1f} µs per statement; "
                    f"fastest rounds {min(times['direct']) * 1e6:.1f} / {min(times['proxy']) * 1e6:.1f} µs)"
                )
                print(
                    f"{'':24} proxy over its unix socket {unix_us:7.1f} µs  ratio {unix_us / direct_us:.2f}  "
                    f"(fastest round {min(times['unix']) * 1e6:.1f} µs)"
                )
    verdict = "met" if worst <= GOAL else "NOT met"
    print(f"goal: ratio ≤ {GOAL}: {verdict} (worst {worst:.2f}; load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
