"""Any client through pgrace's proxy: ``--exec`` commands (:func:`run_exec`, :func:`explore_exec`, what the CLI
calls), and async Python (:func:`run_async`, :func:`explore_async`): asyncpg, psycopg's async API, SQLAlchemy's.

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

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pgrace.servers
from pgrace.api import tidy
from pgrace.drivers import exec as commands_driver
from pgrace.drivers.code import shared_server
from pgrace.drivers.searches import REDUCED, SearchMode
from pgrace.engine.proxy.tasks import AsyncCode, AsyncSession
from pgrace.engine.threads.frames import where_defined
from pgrace.errors import CodeError
from pgrace.model.exploration import Exploration
from pgrace.model.monitor import Note
from pgrace.model.scenario import FinalCheck, Scenario
from pgrace.model.timeline import Run
from pgrace.servers import ServerInfo

__all__ = ["AsyncCode", "explore_async", "explore_exec", "run_async", "run_exec"]


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
    return commands_driver.run_exec(scenario, tasks, shared_server(server), order=order, step_timeout=step_timeout)


def explore_async(
    sessions: Mapping[str, AsyncCode],
    *,
    setup: str | None = None,
    final: str | None = None,
    expect: Sequence[Sequence[Any]] | None = None,
    server: ServerInfo | str | None = None,
    name: str | None = None,
    step_timeout: float = 10.0,
    search: SearchMode = REDUCED,
) -> Exploration:
    """Every order of the async sessions' statements (reduced by default), grouped into outcome classes; or the
    ``search`` asked: every order, a ``Sample``, ``PreemptionBounded`` or ``Pct``, as ``pgrace explore``'s."""
    scenario, tasks = _scenario(sessions, name, setup, final, expect)
    return commands_driver.explore_exec(
        scenario,
        tasks,
        shared_server(server),
        step_timeout=step_timeout,
        search=search,
    )


@contextmanager
def _serving(server: ServerInfo | None, dsn: str | None, superuser: bool, on_note: Note | None) -> Iterator[ServerInfo]:
    """The caller's server as it is, or one opened (and tidied, as every command's) from ``dsn`` for the call."""
    if server is not None:
        yield server
        return
    with pgrace.servers.open_server(dsn, superuser) as opened:
        tidy(opened, on_note)
        yield opened


def run_exec(scenario: Scenario, commands: Sequence[str] = (), *, server: ServerInfo | None = None, **how: Any) -> Run:
    """Run ``commands`` (``NAME=COMMAND``, over the file's ``[exec]`` ones) once over ``scenario``'s setup, their
    connections through pgrace's proxy one statement at a time, then its checks (docs/guide/any-language.md).
    ``how``: ``dsn``, ``superuser``, ``on_note`` as ``pgrace.explore``'s; ``order`` (session names, one per
    statement), ``step_timeout``."""
    with _serving(server, how.pop("dsn", None), how.pop("superuser", False), how.pop("on_note", None)) as opened:
        return commands_driver.run_commands(scenario, commands, opened, **how)


def explore_exec(
    scenario: Scenario, commands: Sequence[str] = (), *, server: ServerInfo | None = None, **how: Any
) -> Exploration:
    """Every order of the statements ``commands`` (over the file's ``[exec]`` ones) send, grouped into classes
    judged by ``scenario``'s checks. ``how``: as ``run_exec``'s, and ``search`` (the reduced search by default;
    any of ``pgrace.explore``'s), ``examples`` (classes replayed, as ``pgrace.explore``'s)."""
    commands_driver.check_exec_bounds(how.get("search", REDUCED))
    with _serving(server, how.pop("dsn", None), how.pop("superuser", False), how.pop("on_note", None)) as opened:
        return commands_driver.explore_commands(scenario, commands, opened, **how)
