"""`from-log --dsn` is read-only and light on the team's server: the index, bounded queries, the DSN's options.

The database is a real one on a server the tests start, with a table big enough that a
lookup which cannot use the index shows as a sequential scan in ``pg_stat_user_tables``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgrace.drivers.fromlog.database import APPLICATION_NAME, Described, describe
from pgrace.servers import ServerInfo

pytestmark = pytest.mark.server

ROWS = 200_000


@pytest.fixture(scope="module")
def payroll(pgrace_server: ServerInfo) -> Iterator[str]:
    """A database with ``ledger`` (ROWS rows), and ``hr.salaries`` beside a ``public.salaries`` with other amounts."""
    name = f"payroll_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(pgrace_server.dsn, dbname=name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE ledger (id int PRIMARY KEY, amount int NOT NULL);"
                f" INSERT INTO ledger SELECT g, 1000 + g FROM generate_series(1, {ROWS}) g;"
                " CREATE SCHEMA hr;"
                " CREATE TABLE hr.salaries (id int PRIMARY KEY, amount int NOT NULL);"
                " INSERT INTO hr.salaries VALUES (7, 1007), (9, 1009);"
                " CREATE TABLE public.salaries (id int PRIMARY KEY, amount int NOT NULL);"
                " INSERT INTO public.salaries VALUES (7, -7), (9, -9);"
                " ANALYZE"
            )
        yield dsn
    finally:
        with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def _scans(dsn: str) -> tuple[int, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT seq_scan, coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relid = 'ledger'::regclass"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _sessions_left(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [APPLICATION_NAME])
        found = row.fetchone()
    return int(found[0]) if found else 0


def _until(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    """Until the server says so: a backend's exit and its statistics are written after the client has gone."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"the server never said {what}")
        time.sleep(0.02)


def test_rows_are_found_by_the_table_s_index(payroll: str) -> None:
    """Keys of the column's own type (the log's ``'9'`` for an int too): index scans only, and no session left."""
    seq, idx = _scans(payroll)
    out = describe(payroll, ["ledger"], {"ledger": [{"id": 7}, {"id": "9"}]}, {})
    assert out.setup[-1].endswith(" VALUES\n  ('7', '1007'),\n  ('9', '1009');"), out
    _until(lambda: _sessions_left(payroll) == 0, "that pgrace's session ended")
    _until(lambda: _scans(payroll)[1] > idx, "that the index was used")
    assert _scans(payroll)[0] == seq, "a key was looked up by reading the whole table"


def test_a_table_named_with_its_schema_is_read_from_it(payroll: str) -> None:
    out = describe(payroll, ["hr.salaries"], {"hr.salaries": [{"id": 7}, {"id": 9}]}, {})
    assert 'CREATE SCHEMA IF NOT EXISTS "hr";' in out.setup
    assert "INSERT INTO hr.salaries VALUES\n  ('7', '1007'),\n  ('9', '1009');" in out.setup, out
    assert out.copied == ["2 row(s) of hr.salaries"]


def test_the_dsn_s_search_path_is_kept(payroll: str) -> None:
    """A DSN whose options put ``hr`` first: the log's unqualified ``salaries`` is hr's."""
    out = describe(make_conninfo(payroll, options="-c search_path=hr"), ["salaries"], {"salaries": [{"id": 7}]}, {})
    assert "INSERT INTO salaries VALUES\n  ('7', '1007');" in out.setup, out


def test_a_locked_table_does_not_hold_pgrace(payroll: str) -> None:
    """A table locked on the team's server: pgrace gives up after its lock_timeout, and says so."""
    with psycopg.connect(payroll) as holder:
        holder.execute("LOCK TABLE ledger IN ACCESS EXCLUSIVE MODE")
        described: list[Described] = []
        reading = threading.Thread(
            target=lambda: described.append(describe(payroll, ["ledger"], {"ledger": [{"id": 7}]}, {}))
        )
        reading.start()
        reading.join(timeout=30)
        finished = not reading.is_alive()
        holder.rollback()
        reading.join()
    assert finished, "pgrace waited for the lock as long as it was held"
    (out,) = described
    assert any("lock timeout" in note for note in out.notes), out.notes


def test_a_key_that_is_not_of_the_column_s_type_is_skipped(payroll: str) -> None:
    """The log's text is not trusted to be a key: a value that is no int is skipped, the others are copied."""
    out = describe(payroll, ["ledger"], {"ledger": [{"id": "7; DROP TABLE x"}, {"id": 9}]}, {})
    assert "INSERT INTO ledger VALUES\n  ('9', '1009');" in out.setup, out
    assert any("1 key(s) of ledger" in note for note in out.notes), out.notes
