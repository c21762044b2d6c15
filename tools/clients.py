"""Incidents made by real clients as applications send them: bound parameters and prepared statements.

psycopg sends a statement with parameters in the extended protocol (``prepare=True``: a
named prepared statement); node-postgres (``tests/clients/incident.js``) does the same
with ``$1`` placeholders, unnamed or named. The server logs them as ``execute NAME: ...``
with the values in a DETAIL line; ``log_statement = 'mod'`` logs no BEGIN or COMMIT.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import psycopg.sql
from psycopg.conninfo import conninfo_to_dict

from tools.incidents import LoggingServer, _blocked, _in_log

CLIENTS = Path(__file__).resolve().parents[1] / "tests" / "clients"


def _send(conn: psycopg.Connection[Any], sql: str, values: list[Any], how: str) -> None:
    """``sql`` with ``values``: bound (``params``), as a prepared statement (``prepared``), or as text (``simple``)."""
    if how == "simple":
        conn.execute(psycopg.sql.SQL(sql).format(*map(psycopg.sql.Literal, values)).as_string(conn).encode())
    else:
        conn.execute(sql.replace("{}", "%s").encode(), values, prepare=how == "prepared")


def psycopg_deadlock(
    server: LoggingServer, how: str, names: tuple[str, str] = ("alice", "bob"), before: str = ""
) -> None:
    """alice and bob transfer in opposite orders (``how``: see _send): bob closes the cycle and is the victim.

    ``before``: a statement alice runs and commits first, in a transaction of its own.
    """
    update = "UPDATE accounts SET balance = balance + {} WHERE id = {}"
    with (
        psycopg.connect(server.shop, application_name=names[0]) as alice,
        psycopg.connect(server.shop, application_name=names[1]) as bob,
        psycopg.connect(server.server.dsn, autocommit=True) as admin,
    ):
        alice.execute("SET deadlock_timeout = '10s'")
        alice.commit()
        if before:
            alice.execute(before.encode())
            alice.commit()
        _send(alice, update, [-100, 1], how)
        _send(bob, update, [-50, 2], how)
        failed: list[BaseException] = []

        def credit() -> None:
            try:
                _send(alice, update, [100, 2], how)
                alice.commit()
            except BaseException as exc:
                failed.append(exc)

        worker = threading.Thread(target=credit)
        worker.start()
        _blocked(admin, alice.info.backend_pid)
        try:
            _send(bob, update, [50, 1], how)
            raise AssertionError("bob was not the deadlock's victim")
        except psycopg.errors.DeadlockDetected:
            bob.rollback()
        worker.join()
        assert not failed, failed


def psycopg_lock_wait(server: LoggingServer, how: str, names: tuple[str, str] = ("report", "payment")) -> None:
    """A transaction renames carol's account (a logged write) while a payment waits for the row."""
    with (
        psycopg.connect(server.shop, application_name=names[0]) as report,
        psycopg.connect(server.shop, application_name=names[1], autocommit=True) as payment,
        psycopg.connect(server.server.dsn, autocommit=True) as admin,
    ):
        _send(report, "UPDATE accounts SET owner = {} WHERE id = {}", ["carol", 3], how)
        worker = threading.Thread(
            target=_send, args=(payment, "UPDATE accounts SET balance = balance + {} WHERE id = {}", [1, 3], how)
        )
        worker.start()
        _blocked(admin, payment.info.backend_pid)
        _in_log(server, "still waiting for")
        report.commit()
        worker.join()


def node_modules(where: Path) -> Path:
    """tests/clients installed with npm into ``where`` (node-postgres, at the version package.json pins)."""
    for name in ("package.json", "incident.js"):
        shutil.copy(CLIENTS / name, where / name)
    subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=where,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return where


def node_incident(where: Path, server: LoggingServer, what: str, how: str) -> None:
    """Run tests/clients/incident.js: ``what`` is deadlock or lockwait, ``how`` extended or named."""
    params = conninfo_to_dict(server.shop)
    config = {
        "host": params.get("host"),
        "port": int(str(params.get("port") or 5432)),
        "user": params.get("user"),
        "password": params.get("password"),
        "database": "shop",
    }
    done = subprocess.run(
        ["node", "incident.js", json.dumps(config), what, how], cwd=where, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


#: Tables as real applications name them: in a schema of their own (pg-boss's), quoted, partitioned.
NAMED = """
CREATE SCHEMA pgboss;
CREATE TABLE pgboss.job (id int PRIMARY KEY, state text NOT NULL);
INSERT INTO pgboss.job VALUES (1, 'created'), (2, 'created'), (3, 'created');
CREATE TABLE "Order Lines" ("Id" int PRIMARY KEY, qty int NOT NULL);
INSERT INTO "Order Lines" VALUES (1, 1), (2, 1), (3, 1);
CREATE TABLE events (tenant int, id int, n int NOT NULL, PRIMARY KEY (tenant, id)) PARTITION BY LIST (tenant);
CREATE TABLE events_1 PARTITION OF events FOR VALUES IN (1);
CREATE TABLE events_2 PARTITION OF events FOR VALUES IN (2);
INSERT INTO events VALUES (1, 1, 0), (1, 2, 0), (2, 1, 0);
"""

#: Per table: its name in SQL, a write of the row with key {}, and a new row that conflicts on a unique index.
WRITES = {
    "pgboss.job": ("UPDATE pgboss.job SET state = 'active' WHERE id = {}", "INSERT INTO pgboss.job VALUES (10, 'x')"),
    "Order Lines": (
        'UPDATE "Order Lines" SET qty = qty + 1 WHERE "Id" = {}',
        'INSERT INTO "Order Lines" VALUES (10, 1)',
    ),
    "events": ("UPDATE events SET n = n + 1 WHERE tenant = 1 AND id = {}", "INSERT INTO events VALUES (1, 10, 0)"),
}


def named_tables(server: LoggingServer) -> None:
    with psycopg.connect(server.shop, autocommit=True) as conn:
        conn.execute(NAMED)


def deadlock_on(server: LoggingServer, table: str) -> None:
    """alice and bob write rows 1 and 2 of ``table`` in opposite orders: bob closes the cycle and is the victim."""
    write = WRITES[table][0]
    with (
        psycopg.connect(server.shop, application_name="alice") as alice,
        psycopg.connect(server.shop, application_name="bob") as bob,
        psycopg.connect(server.server.dsn, autocommit=True) as admin,
    ):
        alice.execute("SET deadlock_timeout = '10s'")
        alice.commit()
        alice.execute(write.format(1).encode())
        bob.execute(write.format(2).encode())

        def credit() -> None:
            alice.execute(write.format(2).encode())
            alice.commit()

        worker = threading.Thread(target=credit)
        worker.start()
        _blocked(admin, alice.info.backend_pid)
        try:
            bob.execute(write.format(1).encode())
            raise AssertionError("bob was not the deadlock's victim")
        except psycopg.errors.DeadlockDetected:
            bob.rollback()
        worker.join()


def insert_wait_on(server: LoggingServer, table: str) -> None:
    """A writer inserts a row and waits; a second insert of the same key waits on the unique index, then goes on."""
    insert = WRITES[table][1].encode()
    with (
        psycopg.connect(server.shop, application_name="writer") as writer,
        psycopg.connect(server.shop, application_name="second", autocommit=True) as second,
        psycopg.connect(server.server.dsn, autocommit=True) as admin,
    ):
        writer.execute(insert)
        worker = threading.Thread(target=second.execute, args=(insert,))
        worker.start()
        _blocked(admin, second.info.backend_pid)
        _in_log(server, "still waiting for")
        writer.rollback()
        worker.join()


def lock_wait_with(
    server: LoggingServer, holder: list[str], waiter: str, end: str = "COMMIT", waiter_end: str | None = None
) -> None:
    """``holder``'s statements in one transaction, then ``waiter``'s statement waits for it until ``end``.

    The waiter's statement runs on its own, or in a transaction that ends with ``waiter_end``.
    """
    with (
        psycopg.connect(server.shop, application_name="holder") as first,
        psycopg.connect(server.shop, application_name="waiter", autocommit=waiter_end is None) as second,
        psycopg.connect(server.server.dsn, autocommit=True) as admin,
    ):
        for statement in holder:
            first.execute(statement.encode())
        reported = _reports(server)
        worker = threading.Thread(target=second.execute, args=(waiter.encode(),))
        worker.start()
        _blocked(admin, second.info.backend_pid)
        deadline = time.monotonic() + 10
        while _reports(server) == reported:  # log_lock_waits reports after deadlock_timeout
            assert time.monotonic() < deadline, "the wait was never logged"
            time.sleep(0.01)
        first.execute(end.encode())
        worker.join()
        if waiter_end is not None:
            second.execute(waiter_end.encode())


def _reports(server: LoggingServer) -> int:
    return server.logfile().read_text(errors="replace").count("still waiting for")


def run(server: LoggingServer, statements: str) -> None:
    """``statements`` in the incident's database (its tables), before the incident."""
    with psycopg.connect(server.shop, autocommit=True) as conn:
        conn.execute(statements.encode())


def asyncpg_incident(server: LoggingServer, what: str) -> None:
    """The deadlock or the lock wait (``what``), sent by asyncpg: every statement a named prepared statement."""
    import asyncio

    import asyncpg

    params = conninfo_to_dict(server.shop)
    where = {"host": params.get("host"), "port": int(str(params.get("port") or 5432)), "user": params.get("user")}

    async def connect(name: str, database: str = "shop") -> Any:
        return await asyncpg.connect(**where, database=database, server_settings={"application_name": name})

    async def blocked(admin: Any, pid: int) -> None:
        for _ in range(2000):
            if await admin.fetchval("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid) == "Lock":
                return
            await asyncio.sleep(0.005)
        raise AssertionError(f"pid {pid} never waited")

    async def deadlock() -> None:
        admin = await connect("admin", "postgres")
        alice, bob = await connect("alice"), await connect("bob")
        update = "UPDATE accounts SET balance = balance + $1 WHERE id = $2"
        await alice.execute("SET deadlock_timeout = '10s'")
        first, second = alice.transaction(), bob.transaction()
        await first.start()
        await alice.execute(update, -100, 1)
        await second.start()
        await bob.execute(update, -50, 2)
        credit = asyncio.ensure_future(alice.execute(update, 100, 2))
        await blocked(admin, alice.get_server_pid())
        try:
            await bob.execute(update, 50, 1)
            raise AssertionError("bob was not the deadlock's victim")
        except asyncpg.exceptions.DeadlockDetectedError:
            await second.rollback()
        await credit
        await first.commit()
        for conn in (admin, alice, bob):
            await conn.close()

    async def lock_wait() -> None:
        admin = await connect("admin", "postgres")
        report, payment = await connect("report"), await connect("payment")
        holding = report.transaction()
        await holding.start()
        await report.execute("UPDATE accounts SET owner = $1 WHERE id = $2", "carol", 3)
        reported = _reports(server)
        pay = "UPDATE accounts SET balance = balance + $1 WHERE id = $2"
        paying = asyncio.ensure_future(payment.execute(pay, 1, 3))
        await blocked(admin, payment.get_server_pid())
        while _reports(server) == reported:  # log_lock_waits reports after deadlock_timeout
            await asyncio.sleep(0.01)
        await holding.commit()
        await paying
        for conn in (admin, report, payment):
            await conn.close()

    asyncio.run(deadlock() if what == "deadlock" else lock_wait())
