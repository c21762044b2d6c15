"""pgrace.proxy: async sessions (asyncpg, psycopg's async API), each in a thread and event loop of its own, through
the proxy on the one scheduler (real server, real drivers)."""

from __future__ import annotations

import asyncpg
import psycopg

from pgrace import proxy
from pgrace.servers import ServerInfo

SETUP = "CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL); INSERT INTO accounts VALUES (1, 500)"
FINAL = "SELECT balance FROM accounts WHERE id = 1"


async def withdraw_asyncpg(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    async with conn.transaction():
        balance = await conn.fetchval("SELECT balance FROM accounts WHERE id = 1")
        await conn.execute("UPDATE accounts SET balance = $1 WHERE id = 1", balance - 100)
    await conn.close()


async def withdraw_psycopg(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT balance FROM accounts WHERE id = 1")
        row = await cur.fetchone()
        assert row is not None
        await conn.execute("UPDATE accounts SET balance = %s WHERE id = 1", (row[0] - 100,))
        await conn.commit()


async def withdraw_locked_psycopg(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT balance FROM accounts WHERE id = 1 FOR UPDATE")
        row = await cur.fetchone()
        assert row is not None
        await conn.execute("UPDATE accounts SET balance = %s WHERE id = 1", (row[0] - 100,))
        await conn.commit()


def test_asyncpg_finds_the_lost_update(pgrace_server: ServerInfo) -> None:
    """asyncpg prepares with Parse/Describe/Flush, then binds: two steps per statement, and the lost update found."""
    sessions = {"alice": withdraw_asyncpg, "bob": withdraw_asyncpg}
    found = proxy.explore_async(sessions, setup=SETUP, final=FINAL, expect=[[300]], server=pgrace_server)
    finals = {str(c.final) for c in found.classes}
    assert any("400" in final for final in finals) and any("300" in final for final in finals), finals
    assert not found.passed


def test_psycopg_async_lost_update_found_and_cure_proved(pgrace_server: ServerInfo) -> None:
    sessions = {"alice": withdraw_psycopg, "bob": withdraw_psycopg}
    found = proxy.explore_async(sessions, setup=SETUP, final=FINAL, expect=[[300]], server=pgrace_server)
    assert found.complete and found.runs == 7 and len(found.classes) == 2 and not found.passed
    cured = {"alice": withdraw_locked_psycopg, "bob": withdraw_locked_psycopg}
    proved = proxy.explore_async(cured, setup=SETUP, final=FINAL, expect=[[300]], server=pgrace_server)
    assert proved.complete and len(proved.classes) == 1 and proved.passed, [c.summary for c in proved.classes]


def test_psycopg_async_one_run_in_order(pgrace_server: ServerInfo) -> None:
    sessions = {"alice": withdraw_psycopg, "bob": withdraw_psycopg}
    order = ["alice", "alice", "bob", "bob", "alice", "alice", "bob", "bob"]
    run = proxy.run_async(sessions, setup=SETUP, final=FINAL, expect=[[400]], order=order, server=pgrace_server)
    assert [s.session for s in run.scenario.steps] == order
    assert run.ok
