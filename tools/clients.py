"""Incidents made by real clients as applications send them: bound parameters and prepared statements.

psycopg sends a statement with parameters in the extended protocol (``prepare=True``: a
named prepared statement); node-postgres (``tests/clients/incident.js``) does the same
with ``$1`` placeholders, unnamed or named. The server logs them as ``execute NAME: ...``
with the values in a DETAIL line; ``log_statement = 'mod'`` logs no BEGIN or COMMIT.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import psycopg
import psycopg.sql
from psycopg.conninfo import conninfo_to_dict

from tools.incidents import LoggingServer, _blocked, _in_log

CLIENTS = Path(__file__).resolve().parents[1] / "tests" / "clients"


def _send(conn: psycopg.Connection[Any], sql: str, values: list[Any], how: str) -> None:
    """``sql`` with ``values``: bound (``params``), as a prepared statement (``prepared``), or as text (``simple``)."""
    if how == "simple":
        conn.execute(psycopg.sql.SQL(sql).format(*map(psycopg.sql.Literal, values)).as_string(conn).encode())
    else:
        conn.execute(sql.replace("{}", "%s").encode(), values, prepare=how == "prepared")


def psycopg_deadlock(server: LoggingServer, how: str, names: tuple[str, str] = ("alice", "bob")) -> None:
    """alice and bob transfer in opposite orders (``how``: see _send): bob closes the cycle and is the victim."""
    update = "UPDATE accounts SET balance = balance + {} WHERE id = {}"
    with (
        psycopg.connect(server.shop, application_name=names[0]) as alice,
        psycopg.connect(server.shop, application_name=names[1]) as bob,
        psycopg.connect(server.server.dsn, autocommit=True) as admin,
    ):
        alice.execute("SET deadlock_timeout = '10s'")
        alice.commit()
        _send(alice, update, [-100, 1], how)
        _send(bob, update, [-50, 2], how)
        failed: list[BaseException] = []

        def credit() -> None:
            try:
                _send(alice, update, [100, 2], how)
                alice.commit()
            except BaseException as exc:
                failed.append(exc)

        worker = threading.Thread(target=credit)
        worker.start()
        _blocked(admin, alice.info.backend_pid)
        try:
            _send(bob, update, [50, 1], how)
            raise AssertionError("bob was not the deadlock's victim")
        except psycopg.errors.DeadlockDetected:
            bob.rollback()
        worker.join()
        assert not failed, failed


def psycopg_lock_wait(server: LoggingServer, how: str, names: tuple[str, str] = ("report", "payment")) -> None:
    """A transaction renames carol's account (a logged write) while a payment waits for the row."""
    with (
        psycopg.connect(server.shop, application_name=names[0]) as report,
        psycopg.connect(server.shop, application_name=names[1], autocommit=True) as payment,
        psycopg.connect(server.server.dsn, autocommit=True) as admin,
    ):
        _send(report, "UPDATE accounts SET owner = {} WHERE id = {}", ["carol", 3], how)
        worker = threading.Thread(
            target=_send, args=(payment, "UPDATE accounts SET balance = balance + {} WHERE id = {}", [1, 3], how)
        )
        worker.start()
        _blocked(admin, payment.info.backend_pid)
        _in_log(server, "still waiting for")
        report.commit()
        worker.join()


def node_modules(where: Path) -> Path:
    """tests/clients installed with npm into ``where`` (node-postgres, at the version package.json pins)."""
    for name in ("package.json", "incident.js"):
        shutil.copy(CLIENTS / name, where / name)
    subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=where,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return where


def node_incident(where: Path, server: LoggingServer, what: str, how: str) -> None:
    """Run tests/clients/incident.js: ``what`` is deadlock or lockwait, ``how`` extended or named."""
    params = conninfo_to_dict(server.shop)
    config = {
        "host": params.get("host"),
        "port": int(str(params.get("port") or 5432)),
        "user": params.get("user"),
        "password": params.get("password"),
        "database": "shop",
    }
    done = subprocess.run(
        ["node", "incident.js", json.dumps(config), what, how], cwd=where, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
