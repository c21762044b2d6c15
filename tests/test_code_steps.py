"""What a code run's step is: a statement sent to the server, noted at the application's own line.

A psycopg call that sends nothing (an attribute's setter, ``commit()`` when idle, closing a
cursor its commit already closed) is no step: the server cannot tell its order, and each
such step multiplied the interleavings explore_code ran. A step's note passes over the
frameworks' frames (psycopg, SQLAlchemy, Django, the standard library, and the modules a
run names) to the application's line.
"""

from __future__ import annotations

import sched
from typing import Any

import psycopg
import pytest
from test_code import FINAL, ROOT, SETUP, withdraw

from pgrace.drivers.code import explore_code, run_code
from pgrace.engine.threads.frames import is_framework
from pgrace.model.timeline import Run
from pgrace.pytest_plugin import PgraceCode
from pgrace.servers import ServerInfo


def withdraw_atomically(conn: Any) -> None:
    """withdraw inside what Django's atomic() does around a transaction: autocommit off, then on again."""
    conn.autocommit = False
    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    conn.read_only = False
    conn.deferrable = False
    withdraw(conn)
    conn.autocommit = True
    conn.commit()  # idle in autocommit: psycopg sends nothing


def _sent(run: Run) -> list[str]:
    return [s.sql for s in run.step_runs()]


def test_setters_that_send_nothing_are_not_steps(pgrace_server: ServerInfo) -> None:
    run = run_code({"alice": withdraw_atomically}, setup=SETUP, final=FINAL, server=pgrace_server)
    assert _sent(run) == [
        "SELECT balance FROM accounts WHERE id = 1",
        "UPDATE accounts SET balance = 400 WHERE id = 1",
        "COMMIT",
    ]


def test_setters_cost_no_runs(pgrace_server: ServerInfo) -> None:
    """The lost update with Django's autocommit toggling costs what the bare lost update costs."""
    sessions = {"alice": withdraw_atomically, "bob": withdraw_atomically}
    reduced = explore_code(sessions, setup=SETUP, final=FINAL, server=pgrace_server)
    assert (reduced.runs, reduced.complete) == (6, True)
    assert {c.final[0] for c in reduced.classes} == {((400,),), ((300,),)}
    every = explore_code(sessions, setup=SETUP, final=FINAL, server=pgrace_server, reduce=False)
    assert (every.runs, every.complete) == (14, True)


def test_a_setter_refused_in_a_transaction_sends_nothing_either(pgrace_server: ServerInfo) -> None:
    """psycopg refuses the setter inside a transaction before sending anything: the refusal is the
    application's exception, not a step."""
    refused: list[str] = []

    def switches_too_late(conn: Any) -> None:
        conn.execute("SELECT 1")
        try:
            conn.autocommit = True
        except psycopg.ProgrammingError as exc:
            refused.append(str(exc))
        with conn.transaction():
            conn.execute("SELECT 2")
        conn.rollback()

    def inner(conn: Any) -> None:
        with conn.transaction():
            conn.execute("SELECT 3")
            try:
                conn.commit()  # forbidden inside conn.transaction(): refused before sending
            except psycopg.ProgrammingError as exc:
                refused.append(str(exc))

    run = run_code({"s": switches_too_late, "t": inner}, server=pgrace_server)
    assert _sent(run) == [
        "SELECT 1",
        "SAVEPOINT (conn.transaction())",
        "SELECT 2",
        "RELEASE (end of conn.transaction())",
        "ROLLBACK",
        "BEGIN (conn.transaction())",
        "SELECT 3",
        "COMMIT (end of conn.transaction())",
    ]
    assert len(refused) == 2 and "can't change 'autocommit' now" in refused[0]


def test_a_setter_that_syncs_a_pipeline_is_a_step(pgrace_server: ServerInfo) -> None:
    """In pipeline mode psycopg syncs the pipeline before changing an attribute: that Sync is sent.
    Entering the outermost pipeline only switches libpq's mode and sends nothing."""

    def piped(conn: Any) -> None:
        conn.autocommit = True
        with conn.pipeline():
            conn.autocommit = False
            conn.execute("SELECT 1")
        conn.commit()

    run = run_code({"p": piped}, server=pgrace_server)
    assert _sent(run) == [
        "SYNC (pipeline, before setting autocommit)",
        "SELECT 1",
        "SYNC (end of conn.pipeline())",
        "COMMIT",
    ]


def test_a_cursor_its_commit_closed_is_closed_without_a_step(pgrace_server: ServerInfo) -> None:
    def reads(conn: Any) -> None:
        named = conn.cursor(name="reader")
        named.execute("SELECT 1")
        named.fetchall()
        conn.commit()  # a cursor WITHOUT HOLD ends with its transaction
        named.close()
        held = conn.cursor(name="held", withhold=True)
        held.execute("SELECT 2")
        held.fetchall()
        conn.commit()
        held.close()  # WITH HOLD outlives the commit: closing it is sent

    run = run_code({"r": reads}, server=pgrace_server)
    assert _sent(run) == [
        "DECLARE reader CURSOR FOR SELECT 1",
        "FETCH (server-side cursor)",
        "COMMIT",
        "DECLARE held CURSOR FOR SELECT 2",
        "FETCH (server-side cursor)",
        "COMMIT",
        "CLOSE (server-side cursor)",
    ]


def test_a_transaction_block_that_raises_is_rolled_back_and_says_so(pgrace_server: ServerInfo) -> None:
    def gives_up(conn: Any) -> None:
        with conn.transaction():
            conn.execute("SELECT 1")
            raise psycopg.Rollback

    run = run_code({"g": gives_up}, server=pgrace_server)
    assert _sent(run) == ["BEGIN (conn.transaction())", "SELECT 1", "ROLLBACK (end of conn.transaction())"]


# -- notes at the application's line --------------------------------------------------------------

ORM = """
def get(conn, sql):
    return run(conn, sql)

def run(conn, sql):
    return conn.execute(sql).fetchone()
"""


def _module(name: str) -> dict[str, Any]:
    """A library module, ``name``, with a file of its own (acme_orm.py under the tests' root)."""
    namespace: dict[str, Any] = {"__name__": name}
    exec(compile(ORM, str(ROOT / "acme_orm.py"), "exec"), namespace)
    return namespace


def test_notes_pass_over_the_modules_a_run_names(
    pgrace_server: ServerInfo, pgrace_code: PgraceCode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    orm = _module("acme_orm.query")

    def reads(conn: Any) -> None:
        orm["get"](conn, "SELECT 1")  # the application's line

    line = reads.__code__.co_firstlineno + 1
    own = run_code({"r": reads}, server=pgrace_server, framework_modules=["acme_orm"])
    assert own.scenario.steps[0].note == f"tests/test_code_steps.py:{line}"
    unnamed = run_code({"r": reads}, server=pgrace_server)
    assert unnamed.scenario.steps[0].note == "acme_orm.py:6"  # without the setting: the library's own line
    found = explore_code({"r": reads}, server=pgrace_server, framework_modules=["acme_orm"])
    assert found.replay(found.classes[0]).scenario.steps[0].note == f"tests/test_code_steps.py:{line}"
    by_fixture = pgrace_code.run({"r": reads}, framework_modules=["acme_orm"])  # the pytest helper's setting
    assert by_fixture.scenario.steps[0].note == f"tests/test_code_steps.py:{line}"


def test_notes_pass_over_the_standard_library(pgrace_server: ServerInfo, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)

    def scheduled(conn: Any) -> None:
        later = sched.scheduler()
        later.enter(0, 1, conn.execute, ("SELECT 1",))
        later.run()  # sched.py calls psycopg: the application's line is this one

    run = run_code({"s": scheduled}, server=pgrace_server)
    assert run.scenario.steps[0].note == f"tests/test_code_steps.py:{scheduled.__code__.co_firstlineno + 3}"


def test_a_module_named_like_the_standard_librarys_is_the_applications() -> None:
    assert is_framework("email.utils", sched.__file__.replace("sched.py", "email/utils.py"))
    assert not is_framework("email.utils", str(ROOT / "email" / "utils.py"))
    assert is_framework("django.db.backends.utils", "/anywhere/django/db/backends/utils.py")
    assert not is_framework("djangoapp.views", "/app/djangoapp/views.py")
    assert is_framework("acme_orm", "/app/acme_orm.py", ("acme_orm",))
