"""Real clients' lost update through the proxy: explore finds the bug, and the cure (``FOR UPDATE``) holds in every
order, each with its run count: psycopg2 and Django's ORM as ``--exec`` commands, SQLAlchemy's async engine as
``pgrace.proxy`` async sessions."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from proxying import sqlalchemy_session

from pgrace import proxy
from pgrace.proxy import AsyncCode
from pgrace.servers import ServerInfo

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

CLIENTS = Path(__file__).parent / "clients"


def _explore(server: ServerInfo, command: str, *options: str) -> tuple[int, str]:
    """``pgrace explore lost-update`` with alice and bob both running ``command``."""
    from click.testing import CliRunner

    from pgrace.cli import main

    args = ["explore", "lost-update", *options, "--exec", f"alice={command}", "--exec", f"bob={command}"]
    result = CliRunner().invoke(main, [*args, "--dsn", server.dsn], catch_exceptions=False)
    return result.exit_code, result.output


def _found_and_cured(server: ServerInfo, command: str, found_runs: str, cured_runs: str) -> None:
    """The bug shows in some order (with the lost 100), and the cure's check holds in every order, complete."""
    code, found = _explore(server, command)
    assert code == 0, found
    assert f"{found_runs}: 2 outcome classes" in found, found
    assert "reproduces the bug" in found and "final (400)" in found and "final (300)" in found, found
    assert "verdict: ✔ class 1 shows the bug" in found, found
    code, cured = _explore(server, f"{command} --for-update", "--fix")
    assert code == 0, cured
    assert f"{cured_runs}: 1 outcome class" in cured, cured
    assert "final (300) · checks hold" in cured and "incomplete" not in cured, cured
    assert "verdict: ✔ no class shows the bug" in cured, cured


def test_psycopg2_lost_update_found_and_its_cure_proved(pgrace_server: ServerInfo) -> None:
    """psycopg2 sends its values inside the text (simple queries) and BEGIN before the first."""
    command = f"{sys.executable} {CLIENTS / 'withdraw_psycopg2.py'}"
    _found_and_cured(pgrace_server, command, "all 6 interleavings, 7 runs", "all 6 interleavings, 7 runs")


def test_django_lost_update_found_and_its_cure_proved(pgrace_server: ServerInfo) -> None:
    """Django connects on its own from its settings (the PG* variables); select_for_update() is the cure."""
    command = f"{sys.executable} {CLIENTS / 'withdraw_django.py'}"
    _found_and_cured(pgrace_server, command, "all 6 interleavings, 7 runs", "all 6 interleavings, 7 runs")


SETUP = "CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL); INSERT INTO accounts VALUES (1, 500)"
FINAL = "SELECT balance FROM accounts WHERE id = 1"


def _withdraw_sqlalchemy(lock: bool) -> AsyncCode:
    async def withdraw(conn: AsyncConnection) -> None:
        from sqlalchemy import text

        read = "SELECT balance FROM accounts WHERE id = :id" + (" FOR UPDATE" if lock else "")
        balance = (await conn.execute(text(read), {"id": 1})).scalar_one()
        await conn.execute(text("UPDATE accounts SET balance = :b WHERE id = :id"), {"b": balance - 100, "id": 1})

    return sqlalchemy_session(withdraw)


def test_sqlalchemy_async_lost_update_found_and_its_cure_proved(pgrace_server: ServerInfo) -> None:
    """SQLAlchemy's async engine on psycopg's async API, as pgrace.proxy async sessions."""
    racy = _withdraw_sqlalchemy(lock=False)
    found = proxy.explore_async(
        {"alice": racy, "bob": racy}, setup=SETUP, final=FINAL, expect=[[300]], server=pgrace_server
    )
    assert found.complete and not found.ok and found.runs == 15
    assert {c.final[0] for c in found.classes} == {((400,),), ((300,),)}
    cured = _withdraw_sqlalchemy(lock=True)
    proved = proxy.explore_async(
        {"alice": cured, "bob": cured}, setup=SETUP, final=FINAL, expect=[[300]], server=pgrace_server
    )
    assert proved.complete and proved.ok and proved.runs == 7
    assert {c.final[0] for c in proved.classes} == {((300,),)}
