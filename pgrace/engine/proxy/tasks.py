"""Async sessions: an ``async def`` per session, each in a thread and event loop of its own, its connections
through the proxy.

The session function receives a DSN for any driver (asyncpg, psycopg's async API, SQLAlchemy's
async engine); the DSN sets ``application_name`` to the session's name, so its connections are
named ``alice``, ``alice#2``. It waits provably, as a command's process does
(:func:`~pgrace.engine.proxy.processes.threads_quiet`), when its thread and the threads of its
loop's executor are asleep: the loop's own wake-up socket counts as a wake-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pgrace.engine.proxy.processes import threads_quiet

AsyncCode = Callable[[str], Awaitable[object]]


@dataclass(frozen=True)
class AsyncSession:
    """One session of async code: its name and its function."""

    name: str
    code: AsyncCode


class TaskActor:
    """An async session running in this run: a thread, its event loop and its executor."""

    def __init__(self, session: AsyncSession, dsn: str) -> None:
        self.session = session
        self.dsn = dsn
        self.opened = 0
        self.reported = False
        self.raised: BaseException | None = None
        self.tids: list[int] = []
        self.wake_ups: frozenset[int] = frozenset()
        self.ready = threading.Event()
        self.prefix = f"pgrace async {session.name}"
        self.thread = threading.Thread(target=self._main, name=self.prefix, daemon=True)

    @property
    def name(self) -> str:
        return self.session.name

    def start(self) -> TaskActor:
        self.thread.start()
        self.ready.wait()
        return self

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        loop.set_default_executor(ThreadPoolExecutor(thread_name_prefix=self.prefix))
        sockets = [getattr(loop, "_ssock", None), getattr(loop, "_csock", None)]  # the selector loop's self-pipe
        self.wake_ups = frozenset(os.fstat(s.fileno()).st_ino for s in sockets if s is not None)
        self.tids = [threading.get_native_id()]
        self.ready.set()
        try:
            loop.run_until_complete(self.session.code(self.dsn))
        except BaseException as exc:  # the session's own failure: an outcome of the run
            self.raised = exc
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    def owns(self, peer_pid: int | None, application_name: str | None) -> bool:
        return peer_pid == os.getpid() and application_name == self.session.name

    def moving(self, proxied: set[int], held: bool, horizon: float) -> str | None:
        if not self.thread.is_alive():
            return None
        tids = self.tids + [
            t.native_id for t in threading.enumerate() if t.name.startswith(self.prefix + "_") and t.native_id
        ]
        return threads_quiet(os.getpid(), tids, proxied, held, horizon, self.wake_ups)

    def exit_code(self) -> int | None:
        if self.thread.is_alive():
            return None
        return 0 if self.raised is None else 1

    def last_words(self) -> str:
        exc = self.raised
        if exc is None:
            return ""
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"{type(exc).__name__}: {message}" if message else type(exc).__name__

    def stop(self) -> None:
        """Its held statements are refused by then (the hooks stopped): the driver raises, the function ends."""
        self.thread.join(10.0)
