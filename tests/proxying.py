"""What the proxy's tests share: hooks that record every step (and hold the ones asked), a proxy on a server.

The recording hooks let every statement go at once, except those ``hold`` picks: those wait in
:meth:`Recorder.ready`, as the scheduler would hold them, until the test releases them.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from pgrace.engine.proxy import wire
from pgrace.engine.proxy.relay import Client, Proxy, Reply, Statement
from pgrace.model.timeline import Run
from pgrace.proxy import AsyncCode
from pgrace.servers import ServerInfo

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


@dataclass(frozen=True)
class Record:
    client: int
    name: str | None
    statement: Statement
    reply: Reply


@dataclass
class Recorder:
    """Hooks that record (client, Statement, Reply) for each step and hold those ``hold`` picks until released."""

    hold: Callable[[Client, Statement], bool] = lambda client, statement: False
    records: list[Record] = field(default_factory=list)
    clients: list[Client] = field(default_factory=list)
    closed_why: dict[int, str | None] = field(default_factory=dict)
    held: threading.Event = field(default_factory=threading.Event)
    """Set while a statement is held."""
    release: threading.Event = field(default_factory=threading.Event)
    closing: threading.Event | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def opened(self, client: Client) -> None:
        with self._lock:
            self.clients.append(client)

    def ready(self, client: Client, statement: Statement) -> None:
        if self.hold(client, statement):
            self.held.set()
            while not self.release.wait(0.05):
                if self.closing is not None and self.closing.is_set():
                    return
            self.held.clear()

    def done(self, client: Client, statement: Statement, reply: Reply) -> None:
        with self._lock:
            self.records.append(Record(client.number, client.application_name, statement, reply))

    def closed(self, client: Client, why: str | None) -> None:
        with self._lock:
            self.closed_why[client.number] = why

    def of(self, name: str) -> list[Record]:
        """The records of the client whose application_name is ``name``."""
        with self._lock:
            return [record for record in self.records if record.name == name]

    def steps(self, name: str) -> list[tuple[str, str]]:
        """(kind, sql) of each step of client ``name``, leaving out the driver's own housekeeping."""
        return [(record.statement.kind, record.statement.sql) for record in self.of(name)]

    def wait_closed(self, count: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.closed_why) < count:
            assert time.monotonic() < deadline, f"only {len(self.closed_why)} of {count} connections closed"
            time.sleep(0.005)


def upstream(server: ServerInfo) -> tuple[str, int]:
    params = conninfo_to_dict(server.dsn)
    return str(params["host"]), int(str(params.get("port") or 5432))


@contextlib.contextmanager
def proxied(server: ServerInfo, hooks: Recorder | None = None, **options: Any) -> Iterator[tuple[Proxy, Recorder]]:
    recorder = hooks or Recorder()
    with Proxy(*upstream(server), recorder, **options) as proxy:
        recorder.closing = proxy.closing
        yield proxy, recorder


def dsn(proxy: Proxy, server: ServerInfo, name: str, **more: str) -> str:
    """A conninfo through ``proxy`` as ``server``'s user, with application_name ``name``."""
    params = conninfo_to_dict(server.dsn)
    extra = "".join(f" {key}={value}" for key, value in more.items())
    return f"host={proxy.host} port={proxy.port} dbname={params.get('dbname', 'postgres')} user={params.get('user')} application_name={name}{extra}"


def activity(server: ServerInfo, pid: int) -> tuple[str, str] | None:
    """(state, query) of backend ``pid`` in pg_stat_activity, None once it is gone."""
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT state, query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    return (str(row[0]), str(row[1])) if row else None


def gone(server: ServerInfo, pid: int, timeout: float = 10.0) -> bool:
    """Whether backend ``pid`` has left the server within ``timeout`` (a closed connection's backend exits)."""
    deadline = time.monotonic() + timeout
    while activity(server, pid) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.005)


class RawClient:
    """A client that speaks the protocol by hand, for what no driver sends: malformed, oversized, 3.2 cancels."""

    def __init__(self, proxy: Proxy) -> None:
        self.sock = socket.create_connection((proxy.host, proxy.port), timeout=10)
        self.received = bytearray()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_messages(self, until: bytes) -> list[wire.Message]:
        """Messages until one of type ``until`` (or EOF)."""
        reader = wire.BackendReader()
        found: list[wire.Message] = []
        while not any(message.code == until for message in found):
            data = self.sock.recv(65536)
            if not data:
                break
            found += reader.feed(data)
        return found

    def start(self, user: str, database: str, version: int = wire.PROTOCOL_3_0, **params: str) -> list[wire.Message]:
        """A start-up with no password (the embedded server trusts its local users), up to ReadyForQuery."""
        fields = {"user": user, "database": database, **params}
        body = version.to_bytes(4, "big") + b"".join(f"{k}\0{v}\0".encode() for k, v in fields.items()) + b"\0"
        self.send((len(body) + 4).to_bytes(4, "big") + body)
        return self.read_messages(b"Z")

    def eof(self) -> bool:
        """Whether the proxy closed the connection (after whatever it sent)."""
        self.sock.settimeout(10)
        while True:
            data = self.sock.recv(65536)
            if not data:
                return True
            self.received += data

    def close(self) -> None:
        self.sock.close()


def cured_wait_as_pg_locks_shows(
    server: ServerInfo, monkeypatch: pytest.MonkeyPatch, command: str, order: list[str]
) -> Run:
    """The lost update's cure, ``command`` as alice and bob in ``order``: Bob's FOR UPDATE waits for Alice's, and the
    timeline names the row, holder and modes that pg_locks and pgrowlocks show when pgrace reports the wait."""
    from pgrace.drivers.exec import run_exec
    from pgrace.engine.steps import StepBook
    from pgrace.frontends import catalog
    from pgrace.model.scenario import Command
    from pgrace.model.timeline import StepWaiting

    seen: list[tuple[Any, ...]] = []
    names: dict[int, str] = {}
    original = StepBook.waiting

    def waiting(self: StepBook, *args: Any, **kwargs: Any) -> None:
        # The test's own reading of pg_locks and pgrowlocks at the moment pgrace reports the wait.
        seen.extend(
            self.inspector.observer.execute(
                "SELECT w.pid, h.pid, (SELECT id FROM accounts WHERE ctid = format('(%s,%s)', t.page, t.tuple)::tid),"
                " (SELECT modes FROM pgrowlocks('accounts'))"
                " FROM pg_locks w JOIN pg_locks h ON h.transactionid = w.transactionid AND h.granted"
                " JOIN pg_locks t ON t.pid = w.pid AND t.locktype = 'tuple' AND t.granted"
                " WHERE w.locktype = 'transactionid' AND NOT w.granted"
            ).fetchall()
        )
        names.update(self.inspector.sessions)
        original(self, *args, **kwargs)

    monkeypatch.setattr(StepBook, "waiting", waiting)
    scenario = catalog.read_scenario("lost-update", {}).other
    assert scenario is not None
    run = run_exec(scenario, [Command("alice", command), Command("bob", command)], server, order=order)
    [(waiter, holder, row_id, modes)] = seen
    [event] = [e for e in run.events if isinstance(e, StepWaiting)]
    [wait] = event.waits
    assert (names[waiter], names[holder], row_id, modes) == ("bob#1", "alice#1", 1, ["For Update"])
    assert (wait.holder, wait.table, wait.mode, wait.holder_mode) == ("alice#1", "accounts", "FOR UPDATE", "FOR UPDATE")
    assert wait.row is not None and wait.row.key_dict() == {"id": 1}
    assert run.ok
    return run


def psycopg_session(
    body: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]], *, pipeline: bool = False
) -> AsyncCode:
    """An async session that runs ``body`` on a psycopg async connection; ``pipeline``: in psycopg's pipeline mode,
    where a read's result is fetched with a Flush and what follows it goes in one cycle."""

    async def session(dsn: str) -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            if pipeline:
                async with conn.pipeline():
                    await body(conn)
            else:
                await body(conn)

    return session


def psycopg_withdrawal(lock: str = "", *, pipeline: bool = False) -> AsyncCode:
    """The withdrawal with psycopg's async API, reading the balance with ``lock`` appended; in pipeline mode the
    write and COMMIT go in one cycle."""

    async def withdraw(conn: psycopg.AsyncConnection[Any]) -> None:
        cur = await conn.execute("SELECT balance FROM accounts WHERE id = 1" + lock)
        row = await cur.fetchone()
        assert row is not None
        await conn.execute("UPDATE accounts SET balance = %s WHERE id = 1", (row[0] - 100,))
        await conn.commit()

    return psycopg_session(withdraw, pipeline=pipeline)


def sqlalchemy_session(body: Callable[[AsyncConnection], Awaitable[None]]) -> AsyncCode:
    """An async session that runs ``body`` in one transaction of SQLAlchemy's async engine on psycopg.

    ``_initialize=False`` leaves out the dialect's first-connect queries (the version, the isolation level, an hstore
    lookup in a savepoint: ten read-only statements a session), to keep the search small.
    """

    async def session(dsn: str) -> None:
        from sqlalchemy.ext.asyncio import create_async_engine
        from sqlalchemy.pool import NullPool

        url = dsn.replace("postgresql://", "postgresql+psycopg://", 1)
        engine = create_async_engine(url, poolclass=NullPool, _initialize=False)
        try:
            async with engine.begin() as conn:
                await body(conn)
        finally:
            await engine.dispose()

    return session
