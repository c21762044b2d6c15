"""Real incidents on a real server: a server that logs, and sessions that deadlock or wait.

Nothing here writes log text by hand: the sessions run the incident, and the tests read
the file the server itself wrote (``pg_current_logfile``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from pgrace.servers import ServerInfo

PG15 = Path("/usr/lib/postgresql/15/bin")
PREFIX = "%m [%p] %a %v %x "
SHOP = """
CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, balance int NOT NULL);
INSERT INTO accounts VALUES (1, 'alice', 500), (2, 'bob', 500), (3, 'carol', 500);
"""


@dataclass
class LoggingServer:
    """A server that writes its log where the test can read it, and a database ``shop`` with accounts."""

    server: ServerInfo
    destination: str

    @property
    def shop(self) -> str:
        return self.server.dsn.replace("dbname=postgres", "dbname=shop")

    def logfile(self) -> Path:
        with psycopg.connect(self.server.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT current_setting('data_directory'), pg_current_logfile(%s)", [self.destination])
            data, name = row.fetchone() or ("", "")
        return Path(str(data)) / str(name)

    def shop_rows(self) -> list[tuple[int, str, int]]:
        with psycopg.connect(self.shop) as conn:
            return conn.execute("SELECT id, owner, balance FROM accounts ORDER BY id").fetchall()

    def databases(self) -> set[str]:
        with psycopg.connect(self.server.dsn) as conn:
            return {r[0] for r in conn.execute("SELECT datname FROM pg_database")}


@contextlib.contextmanager
def logging_server(
    version: str, destination: str = "stderr", statements: str = "all", prefix: str = PREFIX
) -> Iterator[LoggingServer]:
    """Start a server of ``version`` ("18": the embedded one, "15": Debian's) logging as a team should."""
    from pgrace.servers.embedded import embedded_server, local_server

    settings = {
        "logging_collector": "on",
        "log_destination": destination,
        "log_line_prefix": prefix,
        "log_lock_waits": "on",
        "deadlock_timeout": "100ms",
        "log_statement": statements,
        "lc_messages": "C",
    }
    opened = embedded_server(settings) if version == "18" else local_server(str(PG15), settings)
    with opened as server:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE shop")
        logging = LoggingServer(server, destination)
        with psycopg.connect(logging.shop, autocommit=True) as conn:
            conn.execute(SHOP)
        yield logging


def _blocked(admin: psycopg.Connection, pid: int) -> None:
    """Until the server reports ``pid`` waiting for a lock (what pgrace itself watches)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = admin.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
        if row and row[0] == "Lock":
            return
        time.sleep(0.005)
    raise AssertionError(f"pid {pid} never waited")


def _in_log(server: LoggingServer, text: str) -> None:
    """Until the server's log says ``text`` (log_lock_waits writes after deadlock_timeout)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if text in server.logfile().read_text(errors="replace"):
            return
        time.sleep(0.01)
    raise AssertionError(f"the log never said {text!r}")


def deadlock(server: LoggingServer, names: tuple[str, str] = ("alice", "bob"), tail: str = "") -> None:
    """alice and bob transfer in opposite orders: bob closes the cycle and is the victim (alice checks late).

    ``names`` are their application_names and ``tail`` is SQL text (a comment, say) ending each
    update: what any client can put in a server's log.
    """
    with (
        psycopg.connect(server.shop, application_name=names[0]) as alice,
        psycopg.connect(server.shop, application_name=names[1]) as bob,
        psycopg.connect(server.server.dsn, autocommit=True) as admin,
    ):
        alice.execute("SET deadlock_timeout = '10s'")
        alice.commit()
        alice.execute(f"UPDATE accounts SET balance = balance - 100 WHERE id = 1{tail}".encode())
        bob.execute(f"UPDATE accounts SET balance = balance - 50 WHERE id = 2{tail}".encode())
        done: list[BaseException] = []

        def credit() -> None:
            try:
                alice.execute(f"UPDATE accounts SET balance = balance + 100 WHERE id = 2{tail}".encode())
                alice.commit()
            except BaseException as exc:
                done.append(exc)

        worker = threading.Thread(target=credit)
        worker.start()
        _blocked(admin, alice.info.backend_pid)
        try:
            bob.execute(f"UPDATE accounts SET balance = balance + 50 WHERE id = 1{tail}".encode())
            raise AssertionError("bob was not the deadlock's victim")
        except psycopg.errors.DeadlockDetected:
            bob.rollback()
        worker.join()
        assert not done, done


def lock_wait(server: LoggingServer) -> None:
    """A report holds carol's account while a payment waits for it, longer than deadlock_timeout."""
    with (
        psycopg.connect(server.shop, application_name="report") as report,
        psycopg.connect(server.shop, application_name="payment", autocommit=True) as payment,
        psycopg.connect(server.server.dsn, autocommit=True) as admin,
    ):
        report.execute("SELECT balance FROM accounts WHERE id = 3 FOR UPDATE")
        worker = threading.Thread(
            target=payment.execute, args=("UPDATE accounts SET balance = balance + 1 WHERE id = 3",)
        )
        worker.start()
        _blocked(admin, payment.info.backend_pid)
        _in_log(server, "still waiting for")
        report.commit()
        worker.join()


def cycle(server: LoggingServer, names: tuple[str, ...] = ("ann", "ben", "cid")) -> None:
    """Each session updates its own account, then the next one's: the last closes the cycle and is the victim."""
    assert 2 <= len(names) <= 3  # the shop has three accounts
    with contextlib.ExitStack() as stack:
        conns = [stack.enter_context(psycopg.connect(server.shop, application_name=n)) for n in names]
        admin = stack.enter_context(psycopg.connect(server.server.dsn, autocommit=True))
        for conn in conns[:-1]:  # the others check for deadlocks long after the last one does
            conn.execute("SET deadlock_timeout = '10s'")
            conn.commit()
        for i, conn in enumerate(conns):
            conn.execute(f"UPDATE accounts SET balance = balance - 1 WHERE id = {i + 1}".encode())
        failed: list[BaseException] = []

        def next_one(i: int) -> None:
            try:
                conns[i].execute(
                    f"UPDATE accounts SET balance = balance + 1 WHERE id = {(i + 1) % len(conns) + 1}".encode()
                )
                conns[i].commit()
            except BaseException as exc:
                failed.append(exc)

        workers = [threading.Thread(target=next_one, args=(i,)) for i in range(len(conns) - 1)]
        for i, worker in enumerate(workers):
            worker.start()
            _blocked(admin, conns[i].info.backend_pid)
        try:
            next_one(len(conns) - 1)
        finally:
            for worker in workers:
                worker.join()
        assert len(failed) == 1 and isinstance(failed[0], psycopg.errors.DeadlockDetected), failed
        conns[-1].rollback()


def busy_deadlock(server: LoggingServer) -> None:
    """:func:`deadlock`, with what transactions also do: reads and a write of carol's account, not in the cycle."""
    with (
        psycopg.connect(server.shop, application_name="alice") as alice,
        psycopg.connect(server.shop, application_name="bob") as bob,
        psycopg.connect(server.server.dsn, autocommit=True) as admin,
    ):
        alice.execute("SET deadlock_timeout = '10s'")
        alice.commit()
        alice.execute("SELECT owner FROM accounts WHERE id = 3")
        alice.execute("UPDATE accounts SET balance = balance - 100 WHERE id = 1")
        alice.execute("SELECT count(*) FROM accounts")
        bob.execute("SELECT balance FROM accounts WHERE id = 3")
        bob.execute("UPDATE accounts SET balance = balance - 50 WHERE id = 2")
        bob.execute("UPDATE accounts SET owner = 'carol' WHERE id = 3")
        done: list[BaseException] = []

        def credit() -> None:
            try:
                alice.execute("UPDATE accounts SET balance = balance + 100 WHERE id = 2")
                alice.commit()
            except BaseException as exc:
                done.append(exc)

        worker = threading.Thread(target=credit)
        worker.start()
        _blocked(admin, alice.info.backend_pid)
        try:
            bob.execute("UPDATE accounts SET balance = balance + 50 WHERE id = 1")
            raise AssertionError("bob was not the deadlock's victim")
        except psycopg.errors.DeadlockDetected:
            bob.rollback()
        worker.join()
        assert not done, done
