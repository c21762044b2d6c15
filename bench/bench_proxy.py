"""The proxy's cost per statement: the same statements through the proxy (hooks that let everything go) and direct.

Usage: ``python bench/bench_proxy.py [--statements N] [--rounds R] [--baseline DIR]``

One embedded server, one run. Each round times N statements of each kind on a direct
connection and on a connection through the proxy, alternately, so a busy machine slows them
alike; the medians of the per-statement times, the proxy's overhead in µs and the ratio (of
the medians, and the median of each round's ratio to the direct round beside it) are printed
for each kind:

- ``SELECT 1`` (Simple Query, libpq's PQexec),
- ``SELECT $1::int`` (an extended cycle with a bound parameter),
- an UPDATE of one row by primary key inside a transaction (``BEGIN``, the UPDATE, ``COMMIT``:
  timed per statement, three to a transaction),
- a SELECT of 100 rows (three columns, extended protocol).

Each proxy runs in a process of its own, as each client does (a thread here would share the
relay's interpreter lock), and reports its CPU time: the relay's CPU per statement is printed
beside, the figure a loaded machine does not blur (the wall-clock ratio mostly measures how long
the two extra hops wait for a core). ``--baseline DIR`` runs a second proxy from another
checkout of pgrace (``/work/main``, say) in the same rounds, so before and after are measured
side by side. The direct connection uses the server's unix socket (the embedded server listens
on no TCP port); the clients reach each proxy over its own unix socket (the same transport: the
difference is the relay's hop alone) and, for this checkout, also over TCP on 127.0.0.1 as
``--exec`` clients do.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402
from psycopg.conninfo import conninfo_to_dict  # noqa: E402

from pgrace.servers import open_server  # noqa: E402

GOAL = 1.2  # issue 32: a statement through the proxy costs at most this many times the same statement direct

#: A proxy from the checkout in argv[1], in a process of its own: prints its port, then its CPU seconds
#: each time a line arrives on stdin, until stdin ends.
PROXY = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from pgrace.engine.proxy.relay import Proxy

class Immediate:
    def opened(self, client): pass
    def ready(self, client, statement): pass
    def done(self, client, statement, reply): pass
    def closed(self, client, why): pass

with Proxy(sys.argv[2], int(sys.argv[3]), Immediate(), socket_dir=sys.argv[4]) as proxy:
    print(proxy.port, flush=True)
    for _ in sys.stdin:
        print(time.process_time(), flush=True)
"""

#: The client, a process of its own as an application is: it prints its time per statement.
CLIENT = r"""
import sys, time, psycopg
conn = psycopg.connect(sys.argv[1], autocommit=True)
count, kind = int(sys.argv[2]), sys.argv[3]
pgconn = conn.pgconn

def once(n):
    if kind == "simple":
        pgconn.exec_(b"SELECT 1")  # libpq's PQexec: one Query message, the Simple Query protocol
    elif kind == "extended":
        conn.execute("SELECT %s::int", (n,))
    elif kind == "update":
        conn.execute("BEGIN")
        conn.execute("UPDATE bench_accounts SET balance = balance + 1 WHERE id = %s", (n % 1000 + 1,))
        conn.execute("COMMIT")
    else:
        sql = "SELECT id, name, balance FROM bench_accounts WHERE id > %s ORDER BY id LIMIT 100"
        conn.execute(sql, (n % 900,)).fetchall()

PER = 3 if kind == "update" else 1  # statements per call
for n in range(200 // PER):  # warm up: plans, caches
    once(n)
start = time.perf_counter()
calls = count // PER
for n in range(calls):
    once(n)
print((time.perf_counter() - start) / (calls * PER))
"""

KINDS = (
    ("simple", "SELECT 1 (simple)"),
    ("extended", "SELECT $1::int"),
    ("update", "UPDATE by pk in a txn"),
    ("rows", "SELECT 100 rows"),
)


class ProxyProcess:
    """A proxy from one checkout, in its own process, with its CPU time on request."""

    def __init__(self, tree: Path, host: str, port: int, sockets: str) -> None:
        self.sockets = sockets
        self.process = subprocess.Popen(
            [sys.executable, "-c", PROXY, str(tree), host, str(port), sockets],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None and self.process.stdin is not None
        self.port = int(self.process.stdout.readline())

    def cpu(self) -> float:
        assert self.process.stdout is not None and self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        return float(self.process.stdout.readline())

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)


def per_statement(conninfo: str, count: int, kind: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, conninfo, str(count), kind], capture_output=True, text=True, check=True
    )
    return float(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--statements", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--kind", action="append", choices=[kind for kind, _ in KINDS], help="only these (repeatable)")
    parser.add_argument("--baseline", type=Path, help="another pgrace checkout whose relay runs beside this one")
    args = parser.parse_args()
    worst: dict[str, float] = {}
    with open_server(None) as server, tempfile.TemporaryDirectory() as scratch:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS bench_accounts")
            conn.execute("CREATE TABLE bench_accounts (id int PRIMARY KEY, name text NOT NULL, balance int NOT NULL)")
            conn.execute(
                "INSERT INTO bench_accounts SELECT n, 'account ' || n, 1000 FROM generate_series(1, 1000) AS n"
            )
            conn.execute("VACUUM ANALYZE bench_accounts")
        params = conninfo_to_dict(server.dsn)
        host, port = str(params["host"]), int(str(params.get("port") or 5432))
        who = f"dbname={params.get('dbname')} user={params.get('user')}"
        trees = {"this": HERE} if args.baseline is None else {"this": HERE, "baseline": args.baseline.resolve()}
        proxies: dict[str, ProxyProcess] = {}
        try:
            for name, tree in trees.items():
                sockets = os.path.join(scratch, name)
                os.mkdir(sockets)
                proxies[name] = ProxyProcess(tree, host, port, sockets)
            targets = {"direct": server.dsn}
            for name, proxy in proxies.items():
                targets[f"{name} unix"] = f"host={proxy.sockets} port={proxy.port} {who}"
            targets["this tcp"] = f"host=127.0.0.1 port={proxies['this'].port} sslmode=disable {who}"
            print(f"{args.rounds} rounds of {args.statements} statements per target, alternated; trees: ", end="")
            print(", ".join(f"{name} = {tree}" for name, tree in trees.items()))
            for kind, label in KINDS:
                if args.kind and kind not in args.kind:
                    continue
                times: dict[str, list[float]] = {target: [] for target in targets}
                cpu: dict[str, list[float]] = {target: [] for target in targets if target != "direct"}
                for _ in range(args.rounds):
                    for target, conninfo in targets.items():
                        proxy = proxies.get(target.split()[0])
                        before = proxy.cpu() if proxy is not None else 0.0
                        times[target].append(per_statement(conninfo, args.statements, kind))
                        if proxy is not None:
                            cpu[target].append((proxy.cpu() - before) / (args.statements + 200))
                direct = statistics.median(times["direct"]) * 1e6
                print(f"{label:22} direct {direct:7.1f} µs (fastest round {min(times['direct']) * 1e6:.1f})")
                for target in cpu:
                    through = statistics.median(times[target]) * 1e6
                    ratio = through / direct
                    worst[target] = max(worst.get(target, 0.0), ratio)
                    fastest = min(times[target])
                    paired = statistics.median(t / d for t, d in zip(times[target], times["direct"], strict=True))
                    print(
                        f"{'':22} {target:13} {through:7.1f} µs  overhead {through - direct:6.1f} µs  "
                        f"ratio {ratio:.2f} (round by round {paired:.2f})  "
                        f"relay CPU {statistics.median(cpu[target]) * 1e6:5.1f} µs per statement  "
                        f"(fastest round {fastest * 1e6:.1f} µs, ratio {fastest / min(times['direct']):.2f})"
                    )
        finally:
            for proxy in proxies.values():
                proxy.close()
    for target, ratio in worst.items():
        print(f"goal: ratio ≤ {GOAL} for {target}: {'met' if ratio <= GOAL else 'NOT met'} (worst median {ratio:.2f})")
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
