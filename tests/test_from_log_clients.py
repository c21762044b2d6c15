"""`pgrace from-log` on logs written as applications write them: bound parameters, prepared statements, 'mod'.

Each case starts a server of one version that logs with one ``log_statement``, makes a
deadlock and a long lock wait with real clients (psycopg with parameters or
``prepare=True``; node-postgres's extended protocol, unnamed or named; asyncpg's named
prepared statements), and checks that
both incidents come back from the server's own log file.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import tools.clients as clients
import tools.incidents as real
from pgrace.drivers.fromlog import from_log

CASES = [
    ("18", "mod", "psycopg-simple"),
    ("18", "mod", "psycopg-prepared"),
    ("18", "mod", "node-extended"),
    ("18", "none", "node-extended"),
    ("18", "all", "node-named"),
    ("18", "all", "psycopg-params"),
    ("15", "mod", "node-extended"),
    ("15", "mod", "psycopg-params"),
    ("15", "none", "node-named"),
    ("15", "all", "node-extended"),
    ("15", "all", "psycopg-prepared"),
    ("18", "mod", "asyncpg"),
    ("15", "all", "asyncpg"),
]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """node-postgres, installed with npm for these tests alone."""
    return clients.node_modules(tmp_path_factory.mktemp("node"))


def _make(client: str, logging: real.LoggingServer, node: Path) -> None:
    if client == "asyncpg":
        clients.asyncpg_incident(logging, "deadlock")
        clients.asyncpg_incident(logging, "lockwait")
    elif client.startswith("psycopg"):
        clients.psycopg_deadlock(logging, client.split("-")[1])
        clients.psycopg_lock_wait(logging, client.split("-")[1])
    else:
        how = client.split("-")[1]
        clients.node_incident(node, logging, "deadlock", how)
        clients.node_incident(node, logging, "lockwait", how)


@pytest.mark.server
@pytest.mark.parametrize(("version", "statements", "client"), CASES)
def test_what_real_clients_did_comes_back(
    version: str, statements: str, client: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if version == "15" and not (real.PG15 / "postgres").exists():
        pytest.skip(f"no PostgreSQL 15 at {real.PG15}")
    where = request.getfixturevalue("node") if client.startswith("node") else tmp_path
    with real.logging_server(version, statements=statements) as logging:
        _make(client, logging, where)
        log = tmp_path / "server.log"
        shutil.copy(logging.logfile(), log)

        for number, kind in ((1, "deadlock"), (2, "lock wait")):
            found = from_log([str(log)], incident=number, server=logging.server)
            assert found.written is not None and found.verified is not None
            assert found.incidents[number - 1].kind == kind
            assert found.verified.reproduced, (kind, found.verified.failures, found.written.text)
            text, unsaid = found.written.text, found.written.unsaid
            assert "$1" not in text and "$2" not in text
            logged_parameters = statements != "none" and client != "psycopg-simple"
            if logged_parameters:  # the values the client bound, as the log gave them
                assert "WHERE id = '3'" in text if kind == "lock wait" else "WHERE id = '2'" in text
                assert not any("were not logged" in u for u in unsaid), unsaid
            if (
                statements == "mod" and kind == "deadlock"
            ):  # no BEGIN in the log: the transactions are inferred, and said to be
                assert any("BEGIN of" in u and "was not logged" in u for u in unsaid), unsaid


@pytest.mark.server
@pytest.mark.parametrize(("holder", "waiter"), [("deadlock", "step"), ("step", "terminated"), ("cancel", "unknown")])
def test_sessions_named_like_a_cause_of_release_are_data(holder: str, waiter: str, tmp_path: Path) -> None:
    """An application_name that is a word of the expectations (released_by) never becomes one.

    Named so, the lock wait's holder made its release read "expected released by deadlock,
    got released by deadlock", and a holder named ``step`` made any release pass.
    """
    with real.logging_server("18") as logging:
        clients.psycopg_deadlock(logging, "simple", names=(holder, waiter))
        clients.psycopg_lock_wait(logging, "simple", names=(holder, waiter))
        log = tmp_path / "server.log"
        shutil.copy(logging.logfile(), log)
        for number in (2, 1):  # the lock wait, then the deadlock
            found = from_log([str(log)], incident=number, server=logging.server)
            assert found.written is not None and found.verified is not None
            assert found.verified.reproduced, found.verified.failures
            incident = found.incident
            assert incident is not None
            assert set(incident.names.values()) == {f"pid{pid}" for pid in incident.pids}
            released = f"pid{incident.waits[0].holders[0]}" if number == 2 else "deadlock"
            assert f'released_by = "{released}"' in found.written.text
            assert any(f"application_name {holder!r} is not a session name" in u for u in found.written.unsaid)


@pytest.mark.server
def test_with_x_and_no_v_a_write_before_the_transaction_is_not_in_it(tmp_path: Path) -> None:
    """log_statement 'mod' and a prefix with %x but no %v: alice's earlier write, committed, had an xid;
    her transfer's first UPDATE is logged with none yet, so it began a transaction of its own."""
    earlier = "UPDATE accounts SET owner = 'carol' WHERE id = 3"
    with real.logging_server("18", statements="mod", prefix="%m [%p] %a %x ") as logging:
        clients.psycopg_deadlock(logging, "simple", before=earlier)
        log = tmp_path / "server.log"
        shutil.copy(logging.logfile(), log)
        found = from_log([str(log)], server=logging.server)
    assert found.written is not None and found.verified is not None
    assert found.verified.reproduced, found.verified.failures
    assert earlier not in found.written.text
