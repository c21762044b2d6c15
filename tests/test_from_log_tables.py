"""`from-log` on the tables real applications have: in a schema, quoted, partitioned, with defaults and keys.

Each case makes the incident on a real server with real sessions and reads the server's log;
with ``--dsn`` the tables are copied from the incident's database, without it they are guessed.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import tools.clients as clients
import tools.incidents as real
from pgrace.drivers.fromlog import from_log
from pgrace.model.fromlog import FromLog
from pgrace.servers import ServerInfo


def _both(logging: real.LoggingServer, log: Path, dsn: ServerInfo | None) -> list[FromLog]:
    """Each incident of the log, written and verified: with --dsn, on another server than the incident's."""
    shutil.copy(logging.logfile(), log)
    out = []
    for number in range(1, len(from_log([str(log)], list_only=True).incidents) + 1):
        where = logging.server if dsn is None else dsn
        found = from_log([str(log)], incident=number, server=where, dsn=logging.shop if dsn else None)
        assert found.written is not None and found.verified is not None
        assert found.verified.reproduced, (found.verified.failures, found.written.text)
        out.append(found)
    return out


@pytest.mark.server
@pytest.mark.parametrize("table", ["pgboss.job", "Order Lines", "events"])
@pytest.mark.parametrize("dsn", [False, True], ids=["guessed", "dsn"])
def test_tables_in_a_schema_quoted_or_partitioned_resolve(
    table: str, dsn: bool, pgrace_server: ServerInfo, tmp_path: Path
) -> None:
    """A deadlock on two rows, and an INSERT waiting on the unique index for another's uncommitted row."""
    with real.logging_server("18") as logging:
        clients.run(logging, clients.NAMED)
        clients.deadlock_on(logging, table)
        clients.insert_wait_on(logging, table)
        deadlock, insert = _both(logging, tmp_path / "server.log", pgrace_server if dsn else None)
    index = {"pgboss.job": "job_pkey", "Order Lines": "Order Lines_pkey", "events": "events_1_pkey"}[table]
    assert insert.incident is not None
    wait = insert.incident.waits[0]
    assert wait.index == index and wait.table is None  # an index is not a table
    assert f"on {index}" not in insert.incidents[1].summary
    text = deadlock.written.text if deadlock.written else ""
    if table == "pgboss.job":
        assert re.search(r'CREATE SCHEMA IF NOT EXISTS "?pgboss"?;', text) and "CREATE TABLE pgboss.job" in text
    if dsn and table == "events":
        assert "PARTITION BY LIST (tenant)" in text and "CREATE TABLE events_1 PARTITION OF events" in text


@pytest.mark.server
def test_defaults_sequences_and_identities_are_copied(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    """A serial id and an identity: the logged INSERTs that leave them out get them, past the rows copied."""
    with real.logging_server("18") as logging:
        clients.run(
            logging,
            "CREATE TABLE orders (id serial PRIMARY KEY, status text NOT NULL DEFAULT 'new',"
            " made timestamptz NOT NULL DEFAULT now());"
            " INSERT INTO orders (status) VALUES ('new'), ('new');"
            " CREATE TABLE tickets (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, n int NOT NULL DEFAULT 0,"
            " twice int GENERATED ALWAYS AS (n * 2) STORED);"
            " INSERT INTO tickets (n) VALUES (1), (2);",
        )
        clients.lock_wait_with(
            logging,
            ["UPDATE orders SET status = 'paid' WHERE id = 1", "INSERT INTO orders (status) VALUES ('new')"],
            "UPDATE orders SET status = 'sent' WHERE id = 1",
        )
        clients.lock_wait_with(
            logging,
            ["UPDATE tickets SET n = n + 1 WHERE id = 2", "INSERT INTO tickets DEFAULT VALUES"],
            "UPDATE tickets SET n = n + 1 WHERE id = 2",
        )
        orders, tickets = _both(logging, tmp_path / "server.log", pgrace_server)
    text = orders.written.text if orders.written else ""
    assert "CREATE SEQUENCE IF NOT EXISTS orders_id_seq;" in text
    assert "DEFAULT nextval('orders_id_seq'::regclass)" in text and "DEFAULT 'new'::text" in text
    assert "SELECT setval('orders_id_seq', max(id)) FROM orders;" in text
    text = tickets.written.text if tickets.written else ""
    assert "GENERATED ALWAYS AS IDENTITY" in text and "GENERATED ALWAYS AS ((n * 2)) STORED" in text
    assert "OVERRIDING SYSTEM VALUE" in text


@pytest.mark.server
def test_a_foreign_key_to_a_table_outside_the_incident_drops_only_the_key(
    pgrace_server: ServerInfo, tmp_path: Path
) -> None:
    """order_lines references orders, which no statement of the incident names: the table is kept, the key dropped."""
    with real.logging_server("18") as logging:
        clients.run(
            logging,
            "CREATE TABLE orders (id int PRIMARY KEY); INSERT INTO orders VALUES (1);"
            " CREATE TABLE order_lines (id int PRIMARY KEY, order_id int NOT NULL REFERENCES orders, qty int);"
            " INSERT INTO order_lines VALUES (1, 1, 1), (2, 1, 1);",
        )
        clients.lock_wait_with(
            logging, ["UPDATE order_lines SET qty = 2 WHERE id = 1"], "UPDATE order_lines SET qty = 3 WHERE id = 1"
        )
        # A key between two tables of the incident is kept: the insert waits for the delete, through it.
        clients.lock_wait_with(
            logging,
            ["DELETE FROM order_lines WHERE order_id = 1", "DELETE FROM orders WHERE id = 1"],
            "INSERT INTO order_lines VALUES (3, 1, 1)",
            end="ROLLBACK",
            waiter_end="ROLLBACK",
        )
        outside, inside = _both(logging, tmp_path / "server.log", pgrace_server)
    assert outside.written is not None and inside.written is not None
    assert "CREATE TABLE order_lines" in outside.written.text and "REFERENCES" not in outside.written.text
    assert any(
        "order_lines's foreign key order_lines_order_id_fkey to orders is dropped" in u for u in outside.written.unsaid
    )
    assert "ADD CONSTRAINT order_lines_order_id_fkey FOREIGN KEY (order_id) REFERENCES orders(id) NOT VALID" in (
        inside.written.text
    )
