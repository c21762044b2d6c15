"""Interleave async code through pgrace's proxy: asyncpg, psycopg's async API, SQLAlchemy's async engine.

Each session is an ``async def`` that takes a DSN (a ``postgresql://`` URL with the session's
name as its ``application_name``) and connects with any driver. It runs in a thread and an
event loop of its own; every statement its connections send is held at the proxy until the
scheduler lets it go, as :func:`pgrace.run_code` holds a psycopg connection's, and a
statement the server blocks is seen blocked by its backend. ``setup``, ``final`` and
``expect`` are :func:`pgrace.run_code`'s; :func:`explore_async` searches the orders as
:func:`pgrace.explore_code` does.

    async def withdraw(dsn):
        conn = await asyncpg.connect(dsn)
        balance = await conn.fetchval("SELECT balance FROM accounts WHERE id = 1")
        await conn.execute("UPDATE accounts SET balance = $1 WHERE id = 1", balance - 100)
        await conn.close()

    found = pgrace.proxy.explore_async({"alice": withdraw, "bob": withdraw}, setup=..., final=..., expect=[[300]])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pgrace.drivers.code import shared_server
from pgrace.drivers.exec import explore_exec, run_exec
from pgrace.drivers.explore import Exploration
from pgrace.engine.proxy.tasks import AsyncCode, AsyncSession
from pgrace.engine.threads.frames import where_defined
from pgrace.errors import CodeError
from pgrace.model.scenario import FinalCheck, Scenario
from pgrace.model.timeline import Run
from pgrace.servers import ServerInfo

__all__ = ["AsyncCode", "explore_async", "run_async"]


def _scenario(
    sessions: Mapping[str, AsyncCode], name: str | None, setup: str | None, final: str | None, expect: Any
) -> tuple[Scenario, list[AsyncSession]]:
    if not sessions or not all(callable(fn) for fn in sessions.values()):
        raise CodeError("sessions: a mapping of session names to async functions that take a DSN")
    path, line = where_defined(next(iter(sessions.values())))
    checks: tuple[FinalCheck, ...] = ()
    if final:
        rows = tuple(tuple(r) for r in expect) if expect is not None else ()
        checks = (FinalCheck(final, final, rows),)
    label = name or "async"
    scenario = Scenario(
        label,
        f"{', '.join(sessions)} interleaved ({path})",
        path,
        variant="code",
        setup=(setup,) if setup else (),
        setup_line=line,
        checks=checks if expect is not None else (),
    )
    return scenario, [AsyncSession(session, fn) for session, fn in sessions.items()]


def run_async(
    sessions: Mapping[str, AsyncCode],
    *,
    setup: str | None = None,
    final: str | None = None,
    expect: Sequence[Sequence[Any]] | None = None,
    order: Sequence[str] | None = None,
    server: ServerInfo | str | None = None,
    name: str | None = None,
    step_timeout: float = 10.0,
) -> Run:
    """Run the async sessions once: ``order`` names sessions (``alice``, ``alice#2``) one per statement."""
    scenario, tasks = _scenario(sessions, name, setup, final, expect)
    return run_exec(scenario, tasks, shared_server(server), order=order, step_timeout=step_timeout)


def explore_async(
    sessions: Mapping[str, AsyncCode],
    *,
    setup: str | None = None,
    final: str | None = None,
    expect: Sequence[Sequence[Any]] | None = None,
    server: ServerInfo | str | None = None,
    name: str | None = None,
    step_timeout: float = 10.0,
    reduce: bool = True,
) -> Exploration:
    """Every order of the async sessions' statements (reduced by default), grouped into outcome classes."""
    scenario, tasks = _scenario(sessions, name, setup, final, expect)
    return explore_exec(scenario, tasks, shared_server(server), step_timeout=step_timeout, reduce=reduce)
