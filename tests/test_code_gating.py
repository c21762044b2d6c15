"""A code run proves only what pgrace ordered, and every run starts from the same state.

Each session below runs the lost update's read-modify-write somewhere pgrace's scheduler
does not see it (another driver, an event loop, another thread, a module-level engine):
the run must fail, one line naming the connection, never end "complete" at 300.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg2 import connect as psycopg2_connect  # bound before any guard: only the server sees its use
from test_code import FINAL, ROOT, SETUP, _leftovers, withdraw, withdraw_locked

from pgrace.drivers.code import _runner, explore_code, run_code
from pgrace.errors import CodeError
from pgrace.model.orders.choices import NamedOrder
from pgrace.servers import ServerInfo

READ = "SELECT balance FROM accounts WHERE id = 1"


def _write(balance: int) -> str:
    return f"UPDATE accounts SET balance = {balance - 100} WHERE id = 1"


def on_psycopg2(conn: Any) -> None:
    import psycopg2

    conn.execute("SELECT 1")  # one statement on pgrace's connection
    other = psycopg2.connect(conn.info.dsn, application_name="payments")
    cur = other.cursor()
    cur.execute(READ)
    (balance,) = cur.fetchone()  # type: ignore[misc]
    cur.execute(_write(balance))
    other.commit()
    other.close()


def on_psycopg2_bound_early(conn: Any) -> None:
    """psycopg2's connect as imported before the run: no Python guard sees it, the server does."""
    other = psycopg2_connect(conn.info.dsn, application_name="payments")
    cur = other.cursor()
    cur.execute(READ)
    (balance,) = cur.fetchone()  # type: ignore[misc]
    cur.execute(_write(balance))
    other.commit()
    conn.execute("SELECT 1")  # the session still sends one statement through pgrace, after
    conn.commit()


def on_asyncpg(conn: Any) -> None:
    import asyncpg

    dsn = conn.info.dsn

    async def main() -> None:
        other = await asyncpg.connect(_url(dsn), server_settings={"application_name": "payments"})
        balance = await other.fetchval(READ)
        await other.execute(_write(balance))
        await other.close()

    conn.execute("SELECT 1")
    asyncio.run(main())


def on_async_psycopg(conn: Any) -> None:
    dsn = conn.info.dsn

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, application_name="payments") as other:
            (balance,) = await (await other.execute(READ)).fetchone()  # type: ignore[misc]
            await other.execute(_write(balance))

    conn.execute("SELECT 1")
    asyncio.run(main())


_ENGINES: dict[str, Any] = {}  # the application's module-level engine, made once and shared by every run


def on_module_engine(conn: Any) -> None:
    from sqlalchemy import create_engine, text

    dsn = conn.info.dsn
    if dsn not in _ENGINES:
        _ENGINES[dsn] = create_engine(
            "postgresql+psycopg2://", connect_args={"dsn": dsn, "application_name": "payments"}
        )
    conn.execute("SELECT 1")
    with _ENGINES[dsn].begin() as other:
        balance = other.execute(text(READ)).scalar_one()
        other.execute(text(_write(balance)))


def on_to_thread(conn: Any) -> None:
    """pgrace's own connection, used from a worker thread of the event loop: not the session's thread."""
    conn.execute("SELECT 1")
    conn.commit()

    async def main() -> None:
        await asyncio.to_thread(withdraw, conn)

    asyncio.run(main())


def only_to_thread(conn: Any) -> None:
    """No statement from the session's own thread at all: 'sent no statement' would be false."""

    async def main() -> None:
        await asyncio.to_thread(withdraw, conn)

    asyncio.run(main())


def on_a_thread_of_its_own(conn: Any) -> None:
    """A plain thread opens, uses and closes its own connection between two of the session's statements."""
    dsn = conn.info.dsn
    conn.execute("SELECT 1")

    def work() -> None:
        try:
            with psycopg.connect(dsn, application_name="payments", autocommit=True) as other:
                (balance,) = other.execute(READ).fetchone()  # type: ignore[misc]
                other.execute(_write(balance))
        except CodeError:
            pass  # the application swallows the refusal: the run still fails

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    conn.commit()


_KEPT: dict[str, Any] = {}  # the application keeps the first connection it was given, per thread name


def on_a_kept_connection(conn: Any) -> None:
    """An earlier run's connection object, used again: its backend now serves another object."""
    withdraw(_KEPT.setdefault(threading.current_thread().name, conn))


def _url(dsn: str) -> str:
    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    host = str(parts.get("host", "")).replace("/", "%2F")
    return f"postgresql://{parts.get('user', '')}@{host}:{parts.get('port', 5432)}/{parts['dbname']}"


def _line(fn: Callable[[Any], None], text: str) -> str:
    """``test_code_gating.py:N`` of the line of ``fn`` that holds ``text``."""
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return f"test_code_gating.py:{first + next(i for i, line in enumerate(lines) if text in line)}"


OWN = "session alice opened a connection of its own at tests/"
UNGATED: list[tuple[Callable[[Any], None], str, list[str]]] = [
    (on_psycopg2, "psycopg2", [OWN, _line(on_psycopg2, "psycopg2.connect("), "(psycopg2.connect)"]),
    (
        on_psycopg2_bound_early,
        "psycopg2 bound before the run",
        ["a connection pgrace did not open reached the run's database (application_name 'payments'", "COMMIT"],
    ),
    (on_asyncpg, "asyncpg", [OWN, _line(on_asyncpg, "asyncpg.connect("), "(asyncpg.connect)"]),
    (
        on_async_psycopg,
        "psycopg.AsyncConnection",
        [OWN, _line(on_async_psycopg, "AsyncConnection.connect("), "(psycopg.AsyncConnection.connect)"],
    ),
    (
        on_module_engine,
        "a module-level SQLAlchemy engine on psycopg2",
        [OWN, _line(on_module_engine, ".begin() as other"), "(psycopg2.connect)"],
    ),
    (
        on_to_thread,
        "asyncio.to_thread over pgrace's connection",
        ["session alice sent a statement past the scheduler at tests/test_code.py:", "not its session's"],
    ),
    (
        only_to_thread,
        "asyncio.to_thread only",
        ["session alice sent a statement past the scheduler at tests/test_code.py:", "not its session's"],
    ),
    (
        on_a_kept_connection,
        "an earlier run's connection kept",
        ["sent a statement past the scheduler at tests/test_code.py:", "passed to an earlier run was used again"],
    ),
    (
        on_a_thread_of_its_own,
        "a thread of its own",
        [
            "a thread that is no session's opened a connection to the run's database at tests/",
            _line(on_a_thread_of_its_own, "psycopg.connect("),
        ],
    ),
]


@pytest.mark.parametrize(("fn", "kind", "said"), UNGATED, ids=[kind for _, kind, _ in UNGATED])
def test_a_statement_pgrace_did_not_order_fails_the_run(
    pgrace_server: ServerInfo, fn: Callable[[Any], None], kind: str, said: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never 'complete' over the lost update's statements run where the scheduler did not see them."""
    monkeypatch.chdir(ROOT)
    with pytest.raises(CodeError) as caught:
        explore_code({"alice": fn, "bob": fn}, setup=SETUP, final=FINAL, server=pgrace_server, name="ungated")
    text = str(caught.value)
    assert caught.value.exit_code == 2
    assert "\n" not in text
    assert "sent no statement" not in text
    assert "pgrace did not order" in text, text
    for part in said:
        assert part in text, text
    assert _leftovers(pgrace_server, "ungated") == []
    for engine in _ENGINES.values():
        engine.dispose()
    _ENGINES.clear()
    _KEPT.clear()


_ADMIN: list[str] = []  # the server's own superuser DSN, for an intruder of another role


def as_another_role(conn: Any) -> None:
    """The superuser, connected to the run's database through a connect no guard sees."""
    other = psycopg2_connect(psycopg.conninfo.make_conninfo(_ADMIN[0], dbname=conn.info.dbname), application_name="ops")
    other.cursor().execute(READ)
    conn.execute("SELECT 1")
    conn.commit()
    other.close()


def test_a_backend_of_another_role_is_seen_too(pgrace_server: ServerInfo) -> None:
    _ADMIN[:] = [pgrace_server.dsn]
    with pytest.raises(CodeError) as caught:
        run_code({"alice": as_another_role}, setup=SETUP, server=pgrace_server)
    assert "a connection pgrace did not open reached the run's database (application_name 'ops'" in str(caught.value)
    assert "another role's, its statements hidden from pgrace's role" in str(caught.value)


def test_a_session_that_sent_nothing_anywhere_is_still_told_so(pgrace_server: ServerInfo) -> None:
    with pytest.raises(CodeError, match="session bad sent no statement: none on the connection pgrace passed it"):
        explore_code({"good": withdraw, "bad": lambda conn: None}, setup=SETUP, final=FINAL, server=pgrace_server)


# -- every run starts from the same state ---------------------------------------------------------


def withdraw_then_hurry(conn: Any) -> None:
    """The cure, after which the session shortens its lock timeout (a setting it leaves behind)."""
    withdraw_locked(conn)
    conn.execute("SET lock_timeout = '1ms'")
    conn.commit()


def test_a_setting_a_run_leaves_does_not_reach_the_next(pgrace_server: ServerInfo) -> None:
    sessions = {"alice": withdraw_then_hurry, "bob": withdraw_then_hurry}
    found = explore_code(sessions, setup=SETUP, final=FINAL, server=pgrace_server)
    assert [(c.final[0], c.errors) for c in found.classes] == [(((300,),), ())]  # no 55P03 in any run
    assert found.complete


_CONFIGURED: weakref.WeakSet[Any] = weakref.WeakSet()  # connection objects configured, as an application keeps them


def withdraw_configured_lazily(conn: Any) -> None:
    """The time zone set on a connection object's first use only (as Django does)."""
    if conn not in _CONFIGURED:
        conn.execute("SELECT set_config('TimeZone', 'UTC', false)")
        _CONFIGURED.add(conn)
    withdraw(conn)


def test_code_that_configures_its_connection_lazily_sends_the_same_steps_every_run(pgrace_server: ServerInfo) -> None:
    sessions = {"alice": withdraw_configured_lazily, "bob": withdraw_configured_lazily}
    found = explore_code(sessions, setup=SETUP, final=FINAL, server=pgrace_server)
    assert found.complete, found.incomplete
    assert {c.final[0] for c in found.classes} == {((400,),), ((300,),)}  # the lost update found
    for cls in found.classes:
        assert cls.statements[0][1] == "SELECT set_config('TimeZone', 'UTC', false)"


def test_nothing_a_run_leaves_on_its_connection_reaches_the_next(pgrace_server: ServerInfo) -> None:
    """Settings, prepared statements, temporary tables, advisory locks, an open transaction."""
    seen: list[tuple[Any, ...]] = []

    def leaves_everything(conn: Any) -> None:
        row = conn.execute(
            "SELECT current_setting('lock_timeout'), (SELECT count(*) FROM pg_prepared_statements),"
            " (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),"
            " to_regclass('pg_temp.left_behind') IS NOT NULL"
        ).fetchone()
        seen.append(row)
        conn.execute(
            "SET lock_timeout = '5s'; PREPARE left_behind AS SELECT 1; SELECT pg_try_advisory_lock(42);"
            " CREATE TEMPORARY TABLE left_behind (i int)"
        )
        conn.commit()
        conn.execute("SELECT 1")  # and a transaction left open

    runner = _runner(
        "leaves",
        {"a": leaves_everything},
        pgrace_server,
        setup=None,
        final=None,
        teardown=None,
        step_timeout=10.0,
        expect=None,
    )
    with runner as entered:
        for _ in range(3):  # one runner, its runs one after the other, as an exploration's
            entered.run_once(NamedOrder(None, ["a"]), observe=False)
    assert seen == [("0", 0, 0, False)] * 3


def test_a_lock_that_a_ctrl_c_left_held_does_not_strand_the_sessions(pgrace_server: ServerInfo) -> None:
    """A KeyboardInterrupt can land just as ``with cond`` acquires (CPython looks for signals between the two): the
    main thread then holds the scheduler's lock outside every block. The run's cleanup gives it up, so the session
    threads it releases can take it and end, instead of waiting for it for good."""
    threads: list[threading.Thread] = []

    def interrupted(ready: list[str]) -> str:
        threads.extend(s.gate.thread for s in entered.sessions.values() if s.gate.thread is not None)
        entered.cond.acquire()  # what the interrupted `with` left behind
        raise KeyboardInterrupt

    with _runner(
        "interrupted",
        {"alice": withdraw, "bob": withdraw},
        pgrace_server,
        setup=SETUP,
        final=FINAL,
        teardown=None,
        step_timeout=10.0,
        expect=None,
    ) as entered:
        with pytest.raises(KeyboardInterrupt):
            entered.run_once(interrupted, observe=False)
        assert len(threads) == 2
        for thread in threads:
            thread.join(20)
            assert not thread.is_alive(), "a session thread still waits for the lock the interrupt left held"


def test_an_exploration_that_is_not_complete_says_why(pgrace_server: ServerInfo) -> None:
    sent = [0]

    def changes(conn: Any) -> None:
        """Python state of its own: the statement's text changes from run to run."""
        sent[0] += 1
        conn.execute(f"UPDATE accounts SET balance = balance - 1 WHERE id = 1 -- call {sent[0]}")
        conn.commit()

    found = explore_code({"a": changes, "b": changes}, setup=SETUP, server=pgrace_server)
    assert not found.complete
    assert found.incomplete is not None and "sent another statement" in found.incomplete
    found = explore_code({"alice": withdraw, "bob": withdraw}, setup=SETUP, final=FINAL, server=pgrace_server, limit=2)
    assert not found.complete
    assert found.incomplete == "stopped at the limit of 2 runs"


def test_run_code_gates_the_same(pgrace_server: ServerInfo) -> None:
    with pytest.raises(CodeError, match="pgrace did not order"):
        run_code({"alice": on_psycopg2}, server=pgrace_server, setup=SETUP)


def test_pgraces_own_setup_connection_still_exiting_is_no_stranger(
    pgrace_server: ServerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The superuser's connection that furnished the database (pgrowlocks, the schema) is pgrace's own.

    Under load its backend can still be exiting, in pg_stat_activity under no application_name, when
    the first run looks for strangers: here it is held stopped for 3 s after the client closed it, past the first look on any machine.
    """
    import os
    import signal

    from pgrace.scratch.databases import _install_pgrowlocks as install

    resumed: list[threading.Timer] = []

    def slow_to_exit(conn: psycopg.Connection[Any]) -> bool:
        pid = conn.info.backend_pid
        close = conn.close

        def stopped_then_closed() -> None:
            os.kill(pid, signal.SIGSTOP)  # the backend reads the client's Terminate only once continued
            resumed.append(threading.Timer(3.0, os.kill, (pid, signal.SIGCONT)))
            resumed[-1].start()
            close()

        conn.close = stopped_then_closed  # type: ignore[method-assign]
        return install(conn)

    monkeypatch.setattr("pgrace.scratch.run._install_pgrowlocks", slow_to_exit)
    try:
        found = explore_code({"alice": withdraw, "bob": withdraw}, setup=SETUP, final=FINAL, server=pgrace_server)
    finally:
        for timer in resumed:
            timer.join()
    assert resumed, "the database was furnished on a connection of its own"
    assert found.complete and {c.final[0] for c in found.classes} == {((400,),), ((300,),)}
