"""The SKIP LOCKED claim (tests/claiming.py) from real clients through the proxy: explore finds the double claim
without a lock, and proves with ``FOR UPDATE SKIP LOCKED`` that no order claims a job twice, each with its run
count. Async clients run as ``pgrace.proxy`` sessions, in process; the others as ``--exec`` commands."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
import psycopg
import pytest
from claiming import (
    CLAIM_FILE,
    CLAIMED_ONCE,
    FINAL,
    PENDING,
    SETUP,
    SKIP_LOCKED,
    claim,
    cure_proved,
    double_claim_found,
)
from proxying import psycopg_session, sqlalchemy_session

from pgrace import proxy
from pgrace.api import read_scenario
from pgrace.drivers.exec import explore_exec
from pgrace.model.exploration import Exploration
from pgrace.model.scenario import Command
from pgrace.proxy import AsyncCode
from pgrace.servers import ServerInfo

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

CLIENTS = Path(__file__).parent / "clients"


def psycopg_async(lock: str, *, pipeline: bool = False) -> AsyncCode:
    """In pipeline mode the read's result is fetched inside the pipeline (a Flush); the claim and COMMIT go in one
    cycle."""

    async def claim_one(conn: psycopg.AsyncConnection[Any]) -> None:
        cur = await conn.execute(PENDING + lock)
        row = await cur.fetchone()
        if row is not None:
            await conn.execute(claim("%s"), (row[0],))
        await conn.commit()

    return psycopg_session(claim_one, pipeline=pipeline)


def asyncpg_worker(lock: str) -> AsyncCode:
    async def worker(dsn: str) -> None:
        conn = await asyncpg.connect(dsn)
        async with conn.transaction():
            job = await conn.fetchval(PENDING + lock)
            if job is not None:
                await conn.execute(claim("$1"), job)
        await conn.close()

    return worker


def sqlalchemy_async(lock: str) -> AsyncCode:
    async def claim_one(conn: AsyncConnection) -> None:
        from sqlalchemy import text

        job = (await conn.execute(text(PENDING + lock))).scalar()
        if job is not None:
            await conn.execute(text(claim(":id")), {"id": job})

    return sqlalchemy_session(claim_one)


@pytest.mark.parametrize(
    ("client", "found_runs", "proved_runs"),
    [
        pytest.param(psycopg_async, 7, 13, id="psycopg-async"),
        pytest.param(partial(psycopg_async, pipeline=True), 19, 25, id="psycopg-pipeline", marks=pytest.mark.slow),
        # asyncpg prepares each statement in a step of its own (Parse/Describe/Flush): 6 steps a worker, not 4; a
        # prepare reads no row and takes table locks only, and its fetchval's suspended portal keeps a snapshot.
        pytest.param(asyncpg_worker, 27, 25, id="asyncpg", marks=[pytest.mark.slow, pytest.mark.thorough]),
        pytest.param(sqlalchemy_async, 7, 13, id="sqlalchemy-async"),
    ],
)
def test_async_claim_found_and_cure_proved(
    pgrace_server: ServerInfo, client: Callable[[str], AsyncCode], found_runs: int, proved_runs: int
) -> None:
    """Two workers of one client as pgrace.proxy sessions: the double claim in some order, none with the cure."""

    def explore(lock: str) -> Exploration:
        workers = {"w1": client(lock), "w2": client(lock)}
        return proxy.explore_async(workers, setup=SETUP, final=FINAL, expect=CLAIMED_ONCE, server=pgrace_server)

    found, proved = explore(""), explore(SKIP_LOCKED)
    assert (double_claim_found(found), cure_proved(proved)) == (found_runs, proved_runs)


@pytest.mark.slow
@pytest.mark.thorough  # processes of their own: the async clients above are the everyday claim
@pytest.mark.parametrize(
    ("client", "found_runs", "proved_runs"),
    [(client, 7, runs) for client, runs in [("claim_psycopg.py", 13), ("claim_django.py", 7)]],
)
def test_exec_claim_found_and_cure_proved(
    pgrace_server: ServerInfo, client: str, found_runs: int, proved_runs: int
) -> None:
    """Each worker a process of its own, connected with the PG* variables pgrace sets."""
    bug = read_scenario(str(CLAIM_FILE))
    assert bug.other is not None
    worker = f"{sys.executable} {CLIENTS / client}"
    found = explore_exec(bug, [Command("w1", worker), Command("w2", worker)], pgrace_server)
    cured = f"{worker} --skip-locked"
    proved = explore_exec(bug.other, [Command("w1", cured), Command("w2", cured)], pgrace_server)
    assert (double_claim_found(found), cure_proved(proved)) == (found_runs, proved_runs)
