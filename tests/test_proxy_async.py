"""pgrace.proxy: async sessions (asyncpg, psycopg's async API), each in a thread and event loop of its own, through
the proxy on the one scheduler (real server, real drivers)."""

from __future__ import annotations

import time

import asyncpg
import psycopg
import pytest
from proxying import psycopg_withdrawal

from pgrace import proxy
from pgrace.drivers.searches import Exhaustive
from pgrace.engine.proxy import startup
from pgrace.proxy import AsyncCode
from pgrace.servers import ServerInfo

SETUP = "CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL); INSERT INTO accounts VALUES (1, 500)"
FINAL = "SELECT balance FROM accounts WHERE id = 1"


async def withdraw_asyncpg(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    async with conn.transaction():
        balance = await conn.fetchval("SELECT balance FROM accounts WHERE id = 1")
        await conn.execute("UPDATE accounts SET balance = $1 WHERE id = 1", balance - 100)
    await conn.close()


async def withdraw_locked_asyncpg(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    async with conn.transaction():
        balance = await conn.fetchval("SELECT balance FROM accounts WHERE id = 1 FOR UPDATE")
        await conn.execute("UPDATE accounts SET balance = $1 WHERE id = 1", balance - 100)
    await conn.close()


def test_asyncpg_finds_the_lost_update(pgrace_server: ServerInfo) -> None:
    """asyncpg prepares with Parse/Describe/Flush, then binds: two steps per statement, and the lost update found."""
    sessions = {"alice": withdraw_asyncpg, "bob": withdraw_asyncpg}
    found = proxy.explore_async(sessions, setup=SETUP, final=FINAL, expect=[[300]], server=pgrace_server)
    finals = {str(c.final) for c in found.classes}
    assert any("400" in final for final in finals) and any("300" in final for final in finals), finals
    assert found.complete and not found.ok and found.runs == 27, (found.incomplete, found.runs)
    cured = {"alice": withdraw_locked_asyncpg, "bob": withdraw_locked_asyncpg}
    proved = proxy.explore_async(cured, setup=SETUP, final=FINAL, expect=[[300]], server=pgrace_server)
    assert proved.complete and len(proved.classes) == 1 and proved.ok, [c.summary for c in proved.classes]
    assert proved.runs == 9


@pytest.mark.thorough  # psycopg2's late client is the everyday test of a session not yet there
def test_a_slow_start_up_is_waited_for(pgrace_server: ServerInfo, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection still in its start-up at the proxy (authentication on a loaded server) belongs to a session
    that will send a statement: the first choice waits for it, so every run follows the order asked for."""
    real_start = startup.start

    def slow_for_alice(*args: object, **kwargs: object) -> startup.Started:
        started = real_start(*args, **kwargs)  # type: ignore[arg-type]
        if started.startup.parameters.get("application_name") == "alice":
            time.sleep(0.3)  # the client waits for its ReadyForQuery meanwhile, asleep in its event loop
        return started

    monkeypatch.setattr(startup, "start", slow_for_alice)
    sessions = {"alice": withdraw_asyncpg, "bob": withdraw_asyncpg}
    found = proxy.explore_async(sessions, setup=SETUP, final=FINAL, expect=[[300]], server=pgrace_server)
    assert found.complete, found.incomplete
    assert not found.ok and len(found.classes) == 2, [c.summary for c in found.classes]


def test_psycopg_async_lost_update_found_and_cure_proved(pgrace_server: ServerInfo) -> None:
    sessions = {"alice": psycopg_withdrawal(), "bob": psycopg_withdrawal()}
    found = proxy.explore_async(sessions, setup=SETUP, final=FINAL, expect=[[300]], server=pgrace_server)
    assert found.complete and found.runs == 7 and len(found.classes) == 2 and not found.ok
    cured = {"alice": psycopg_withdrawal(" FOR UPDATE"), "bob": psycopg_withdrawal(" FOR UPDATE")}
    proved = proxy.explore_async(cured, setup=SETUP, final=FINAL, expect=[[300]], server=pgrace_server)
    assert proved.complete and len(proved.classes) == 1 and proved.ok, [c.summary for c in proved.classes]


@pytest.mark.slow
def test_psycopg_pipeline_lost_update_found(pgrace_server: ServerInfo) -> None:
    """The write and its COMMIT reach the server as one step: what the write did is in no footprint reading, so the
    search must not take that step for one that commutes (nor the lone Sync and Flush the pipeline ends with for
    steps it cannot read)."""
    racy = psycopg_withdrawal(pipeline=True)
    found = proxy.explore_async(
        {"alice": racy, "bob": racy}, setup=SETUP, final=FINAL, expect=[[300]], server=pgrace_server
    )
    assert found.complete and not found.ok, found.incomplete
    assert {c.final[0] for c in found.classes} == {((400,),), ((300,),)}
    assert found.runs == 19


@pytest.mark.slow
def test_psycopg_pipeline_lost_update_cure_proved(pgrace_server: ServerInfo) -> None:
    cured = psycopg_withdrawal(" FOR UPDATE", pipeline=True)
    proved = proxy.explore_async(
        {"alice": cured, "bob": cured}, setup=SETUP, final=FINAL, expect=[[300]], server=pgrace_server
    )
    assert proved.complete and proved.ok, proved.incomplete
    assert {c.final[0] for c in proved.classes} == {((300,),)}
    assert proved.runs == 19


def test_psycopg_async_one_run_in_order(pgrace_server: ServerInfo) -> None:
    sessions = {"alice": psycopg_withdrawal(), "bob": psycopg_withdrawal()}
    order = ["alice", "alice", "bob", "bob", "alice", "alice", "bob", "bob"]
    run = proxy.run_async(sessions, setup=SETUP, final=FINAL, expect=[[400]], order=order, server=pgrace_server)
    assert [s.session for s in run.scenario.steps] == order
    assert run.ok


def assert_reduced_keeps_500_and_400(sessions: dict[str, AsyncCode], server: ServerInfo) -> None:
    """alice notes bob's balance in ``seen``: the exhaustive search sees 500 and 400 noted, and the reduced one keeps
    both classes in fewer runs."""
    setup = SETUP + "; CREATE TABLE seen (balance int NOT NULL)"
    final = "SELECT balance FROM seen ORDER BY balance"  # no physical order: the reduction takes the moves alone
    reduced = proxy.explore_async(sessions, setup=setup, final=final, expect=[[500]], server=server)
    every = proxy.explore_async(sessions, setup=setup, final=final, expect=[[500]], server=server, search=Exhaustive())
    assert reduced.complete and every.complete, (reduced.incomplete, every.incomplete)
    assert {c.final[0] for c in every.classes} == {((500,),), ((400,),)}, [(c.final, c.summary) for c in every.classes]
    assert sorted(c.key for c in reduced.classes) == sorted(c.key for c in every.classes)
    assert reduced.runs is not None and every.runs is not None and reduced.runs < every.runs, (reduced.runs, every.runs)


async def _note_balance(dsn: str) -> None:
    """One prepared statement outside a transaction block: asyncpg's Parse/Describe/Flush opens the implicit
    transaction, and the ACCESS SHARE lock parsing took on accounts is held until the Bind/Execute/Sync after it."""
    conn = await asyncpg.connect(dsn)
    await conn.execute("INSERT INTO seen SELECT balance FROM accounts WHERE id = $1", 1)
    await conn.close()


async def _lock_and_change(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute("LOCK TABLE accounts IN ACCESS EXCLUSIVE MODE")
        await conn.execute("UPDATE accounts SET balance = 400 WHERE id = 1")
        await conn.commit()


def test_a_prepare_is_ordered_by_the_table_lock_it_takes(pgrace_server: ServerInfo) -> None:
    """A prepare reads no row, but its table lock decides who waits for whom: before bob's LOCK TABLE, bob waits
    and alice notes 500; after it, alice's prepare waits for bob's COMMIT and notes 400. The reduced search must
    tell the two apart as the exhaustive one does (a prepare taken to touch nothing misses 400)."""
    assert_reduced_keeps_500_and_400({"alice": _note_balance, "bob": _lock_and_change}, pgrace_server)


async def _note_balance_repeatable(dsn: str) -> None:
    """In REPEATABLE READ the prepare's parse takes the transaction's snapshot: what the INSERT notes is fixed then."""
    conn = await asyncpg.connect(dsn)
    async with conn.transaction(isolation="repeatable_read"):
        await conn.execute("INSERT INTO seen SELECT balance FROM accounts WHERE id = $1", 1)
    await conn.close()


async def _change(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute("UPDATE accounts SET balance = 400 WHERE id = 1")
        await conn.commit()


def test_a_prepare_that_takes_the_snapshot_is_ordered_by_the_commits_around_it(pgrace_server: ServerInfo) -> None:
    """The snapshot is taken while the prepare waits for the rest of its cycle (the backend 'active', reading): bob's
    COMMIT before the prepare, alice notes 400; after it, 500, even when bob commits before alice's INSERT runs."""
    assert_reduced_keeps_500_and_400({"alice": _note_balance_repeatable, "bob": _change}, pgrace_server)
