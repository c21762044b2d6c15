"""Real clients through the proxy: each one's steps are the units expected, its own results are right,
and a statement the hooks hold is really held (not on the server) until released."""

from __future__ import annotations

import asyncio
import json
import os
import select
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jvm
import psycopg
import psycopg2
import pytest
from jvm import JDBC
from proxying import Recorder, activity, dsn, proxied

from pgrace.engine.proxy.relay import Client, Proxy, Statement
from pgrace.servers import ServerInfo
from tools.clients import CLIENTS


def test_psycopg_sync_simple_extended_and_prepared(pgrace_server: ServerInfo) -> None:
    with proxied(pgrace_server) as (proxy, hooks), psycopg.connect(dsn(proxy, pgrace_server, "sync")) as conn:
        assert conn.execute("SELECT 1 AS one").fetchall() == [(1,)]
        assert conn.execute("SELECT %s::int + 1, %s::text", (41, "hé")).fetchall() == [(42, "hé")]
        assert conn.execute("SELECT %s::int * 2", (21,), prepare=True).fetchall() == [(42,)]
        assert conn.execute("SELECT %s::int * 2", (5,), prepare=True).fetchall() == [(10,)]
        conn.commit()
    steps = hooks.steps("sync")
    assert steps[0] == ("query", "BEGIN")
    assert steps[1] == ("query", "SELECT 1 AS one")
    assert ("extended", "SELECT $1::int + 1, $2::text") in steps
    records = hooks.of("sync")
    bound = next(r for r in records if r.statement.sql == "SELECT $1::int + 1, $2::text")
    assert bound.statement.params == ("41", "hé")
    assert bound.reply.rows == (("42", "hé"),) and bound.reply.status == b"T"
    # psycopg prepares in a cycle of its own (Parse, Sync), then binds the named statement in each.
    prepared = [r for r in records if r.statement.sql == "SELECT $1::int * 2"]
    assert [r.statement.params for r in prepared] == [(), ("21",), ("5",)]
    assert [r.reply.rows for r in prepared] == [(), (("42",),), (("10",),)]
    assert records[-1].statement.sql == "COMMIT" and records[-1].reply.status == b"I"


def test_psycopg_async(pgrace_server: ServerInfo) -> None:
    async def main(conninfo: str) -> list[tuple[Any, ...]]:
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
            cur = await conn.execute("SELECT %s::int, %s::bool", (7, True))
            return await cur.fetchall()

    with proxied(pgrace_server) as (proxy, hooks):
        assert asyncio.run(main(dsn(proxy, pgrace_server, "async"))) == [(7, True)]
    assert hooks.steps("async") == [("extended", "SELECT $1::int, $2::bool")]
    assert hooks.of("async")[0].reply.rows == (("7", "t"),)


def test_psycopg_pipeline_several_syncs_in_flight_replies_in_order(pgrace_server: ServerInfo) -> None:
    with (
        proxied(pgrace_server) as (proxy, hooks),
        psycopg.connect(dsn(proxy, pgrace_server, "pipe"), autocommit=True) as conn,
        conn.pipeline() as pipeline,
    ):
        cursors = [conn.execute("SELECT %s::int", (n,)) for n in range(3)]
        pipeline.sync()
        cursors += [conn.execute("SELECT %s::int", (n,)) for n in range(3, 5)]
        pipeline.sync()
        assert [cur.fetchone() for cur in cursors] == [(n,) for n in range(5)]
    records = [r for r in hooks.of("pipe") if r.statement.kind == "extended"]
    assert [r.reply.rows for r in records] == [(("0",), ("1",), ("2",)), (("3",), ("4",)), ()]
    assert [r.statement.params for r in records] == [("0", "1", "2"), ("3", "4"), ()]
    assert records[-1].statement.sql == ""  # the Sync psycopg sends as the pipeline ends: a step of its own


def test_libpq_pipeline_with_every_sync_sent_before_any_reply(pgrace_server: ServerInfo) -> None:
    """Three cycles sent in one write: the relay holds the later ones behind the first, in order."""
    with (
        proxied(pgrace_server) as (proxy, hooks),
        psycopg.connect(dsn(proxy, pgrace_server, "libpq"), autocommit=True) as connection,
    ):
        conn = connection.pgconn
        conn.enter_pipeline_mode()
        for n in range(3):
            conn.send_query_params(b"SELECT $1::int * 10", [str(n).encode()])
            conn.pipeline_sync()
        assert conn.flush() == 0
        results: list[psycopg.pq.abc.PGresult] = []
        while len(results) < 6:  # each cycle's rows and its sync; None between them
            if conn.is_busy():  # wait for bytes only when libpq has none to hand out
                assert select.select([conn.socket], [], [], 10)[0], "no reply in 10 s"
                conn.consume_input()
            elif (result := conn.get_result()) is not None:
                results.append(result)
        rows = [r.get_value(0, 0) for r in results if r.status == psycopg.pq.ExecStatus.TUPLES_OK]
        assert rows == [b"0", b"10", b"20"]
        conn.exit_pipeline_mode()
    records = hooks.of("libpq")
    assert [(r.statement.kind, r.statement.params, r.reply.rows) for r in records] == [
        ("extended", (str(n),), ((str(10 * n),),)) for n in range(3)
    ]


def test_psycopg_executemany(pgrace_server: ServerInfo) -> None:
    with proxied(pgrace_server) as (proxy, hooks), psycopg.connect(dsn(proxy, pgrace_server, "many")) as conn:
        conn.execute("CREATE TEMP TABLE t (n int)")
        conn.cursor().executemany("INSERT INTO t VALUES (%s)", [(n,) for n in range(5)])
        assert conn.execute("SELECT sum(n) FROM t").fetchone() == (10,)
    inserts = [r for r in hooks.of("many") if r.statement.sql == "INSERT INTO t VALUES ($1)"]
    assert [p for r in inserts for p in r.statement.params] == [str(n) for n in range(5)]
    assert [t for r in inserts for t in r.reply.tags] == ["INSERT 0 1"] * 5


def test_copy_from_and_to(pgrace_server: ServerInfo) -> None:
    with proxied(pgrace_server) as (proxy, hooks), psycopg.connect(dsn(proxy, pgrace_server, "copy")) as conn:
        conn.execute("CREATE TEMP TABLE t (n int, s text)")
        with conn.cursor().copy("COPY t FROM STDIN") as copy:
            for n in range(1000):
                copy.write_row((n, "x" * 50))
        with conn.cursor().copy("COPY (SELECT n FROM t WHERE n < 3 ORDER BY n) TO STDOUT") as copy:
            assert [bytes(row) for row in copy] == [b"0\n", b"1\n", b"2\n"]
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (1000,)
    tags = {r.statement.sql: r.reply.tags for r in hooks.of("copy")}
    assert tags["COPY t FROM STDIN"] == ("COPY 1000",)
    assert tags["COPY (SELECT n FROM t WHERE n < 3 ORDER BY n) TO STDOUT"] == ("COPY 3",)


def test_listen_notify_across_two_connections(pgrace_server: ServerInfo) -> None:
    with (
        proxied(pgrace_server) as (proxy, hooks),
        psycopg.connect(dsn(proxy, pgrace_server, "listener"), autocommit=True) as listener,
        psycopg.connect(dsn(proxy, pgrace_server, "notifier"), autocommit=True) as notifier,
    ):
        listener.execute("LISTEN jobs")
        notifier.execute("NOTIFY jobs, 'job 7'")
        notes = [(n.channel, n.payload) for n in listener.notifies(timeout=10, stop_after=1)]
    assert notes == [("jobs", "job 7")]
    assert hooks.steps("notifier") == [("query", "NOTIFY jobs, 'job 7'")]


def test_asyncpg_flush_prefixes_and_prepared_statements(pgrace_server: ServerInfo) -> None:
    import asyncpg

    async def main(port: int, user: str) -> tuple[Any, ...]:
        conn = await asyncpg.connect(
            host="127.0.0.1",
            port=port,
            user=user,
            database="postgres",
            ssl=False,
            server_settings={"application_name": "asyncpg"},
        )
        try:
            one = await conn.fetchval("SELECT $1::int8 + 1", 41)
            statement = await conn.prepare("SELECT $1::text || '!' AS shout, $2::uuid AS id")
            row = await statement.fetchrow("hi", "00000000-0000-0000-0000-000000000007")
            async with conn.transaction():
                await conn.execute("CREATE TEMP TABLE t (n int)")
                await conn.executemany("INSERT INTO t VALUES ($1)", [(1,), (2,)])
            return one, tuple(row), await conn.fetchval("SELECT sum(n) FROM t")
        finally:
            await conn.close()

    with proxied(pgrace_server) as (proxy, hooks):
        user = str(psycopg.conninfo.conninfo_to_dict(pgrace_server.dsn)["user"])
        one, row, total = asyncio.run(main(proxy.port, user))
    assert one == 42 and row[0] == "hi!" and str(row[1]).endswith("7") and total == 3
    steps = hooks.steps("asyncpg")
    # asyncpg prepares with Parse/Describe/Flush (a step of its own), then binds and executes up to Sync.
    shout = "SELECT $1::text || '!' AS shout, $2::uuid AS id"
    assert ("flush", shout) in steps and ("extended", shout) in steps
    assert steps.index(("flush", shout)) < steps.index(("extended", shout))
    executed = next(r for r in hooks.of("asyncpg") if r.statement.kind == "extended" and r.statement.sql == shout)
    assert executed.statement.params == ("hi", "00000000-0000-0000-0000-000000000007")
    assert executed.reply.rows == (("hi!", "00000000-0000-0000-0000-000000000007"),)
    plus = next(r for r in hooks.of("asyncpg") if r.statement.kind == "extended" and "+ 1" in r.statement.sql)
    assert plus.statement.params == ("41",) and plus.reply.rows == (("42",),)


def test_psycopg2(pgrace_server: ServerInfo) -> None:
    with proxied(pgrace_server) as (proxy, hooks):
        conn = psycopg2.connect(dsn(proxy, pgrace_server, "psycopg2"))
        try:
            cur = conn.cursor()
            cur.execute("SELECT %s + 1", (41,))
            assert cur.fetchone() == (42,)
            conn.commit()
        finally:
            conn.close()
    assert ("query", "SELECT 41 + 1") in hooks.steps("psycopg2")


NODE_CLIENT = """
const { Client } = require('pg');
(async () => {
  const config = JSON.parse(process.argv[2]);
  const client = new Client(config);
  await client.connect();
  const out = [];
  out.push((await client.query('SELECT 1 AS one')).rows);
  out.push((await client.query('SELECT $1::int + 1 AS n', [41])).rows);
  for (const v of [1, 2]) {
    out.push((await client.query({ name: 'twice', text: 'SELECT $1::int * 2 AS n', values: [v] })).rows);
  }
  await client.end();
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e.message); process.exit(1); });
"""


NODE_HOLD = """
const { Client } = require('pg');
(async () => {
  const client = new Client(JSON.parse(process.argv[2]));
  await client.connect();
  const result = await client.query(process.argv[3], [1]);
  await client.end();
  console.log(result.rows[0].n);
})().catch((e) => { console.error(e.message); process.exit(1); });
"""


@pytest.fixture(scope="module")
def node_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("npm") is None:
        pytest.fail("npm is not installed: node-postgres cannot be tested")
    where = tmp_path_factory.mktemp("node")
    shutil.copy(CLIENTS / "package.json", where / "package.json")
    subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=where,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (where / "client.js").write_text(NODE_CLIENT)
    (where / "hold.js").write_text(NODE_HOLD)
    return where


@pytest.mark.slow
def test_node_postgres(pgrace_server: ServerInfo, node_client: Path) -> None:
    user = str(psycopg.conninfo.conninfo_to_dict(pgrace_server.dsn)["user"])
    with proxied(pgrace_server) as (proxy, hooks):
        config = {
            "host": proxy.host,
            "port": proxy.port,
            "user": user,
            "database": "postgres",
            "application_name": "node",
        }
        done = subprocess.run(
            ["node", "client.js", json.dumps(config)], cwd=node_client, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        hooks.wait_closed(1)
    assert json.loads(done.stdout) == [[{"one": 1}], [{"n": 42}], [{"n": 2}], [{"n": 4}]]
    assert hooks.steps("node") == [
        ("query", "SELECT 1 AS one"),
        ("extended", "SELECT $1::int + 1 AS n"),
        ("extended", "SELECT $1::int * 2 AS n"),
        ("extended", "SELECT $1::int * 2 AS n"),
    ]
    assert [r.statement.params for r in hooks.of("node")[1:]] == [("41",), ("1",), ("2",)]
    assert hooks.clients[0].peer_pid is not None and hooks.clients[0].peer_pid != os.getpid()


JAVA_CLIENT = """
import java.sql.*;
public class Client {
    public static void main(String[] args) throws Exception {
        try (Connection conn = DriverManager.getConnection(args[0])) {
            try (Statement s = conn.createStatement(); ResultSet rs = s.executeQuery("SELECT 1")) {
                rs.next(); System.out.println(rs.getInt(1));
            }
            try (PreparedStatement ps = conn.prepareStatement("SELECT ?::int * 2")) {
                for (int i = 1; i <= 6; i++) {
                    ps.setInt(1, i);
                    try (ResultSet rs = ps.executeQuery()) { rs.next(); System.out.println(rs.getInt(1)); }
                }
            }
        }
    }
}
"""


JAVA_HOLD = """
import java.sql.*;
public class Hold {
    public static void main(String[] args) throws Exception {
        try (Connection conn = DriverManager.getConnection(args[0]);
             PreparedStatement ps = conn.prepareStatement(args[1].replace("$1", "?"))) {
            ps.setInt(1, 1);
            try (ResultSet rs = ps.executeQuery()) { rs.next(); System.out.println(rs.getInt(1)); }
        }
    }
}
"""


@pytest.fixture(scope="module")
def java_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    jvm.require()
    where = tmp_path_factory.mktemp("java")
    (where / "Client.java").write_text(JAVA_CLIENT)
    (where / "Hold.java").write_text(JAVA_HOLD)
    return jvm.compile_clients(where, "Client.java", "Hold.java")


def jdbc_url(proxy: Proxy, server: ServerInfo, name: str) -> str:
    user = str(psycopg.conninfo.conninfo_to_dict(server.dsn)["user"])
    return f"jdbc:postgresql://{proxy.host}:{proxy.port}/postgres?user={user}&sslmode=disable&ApplicationName={name}"


@pytest.mark.slow
def test_pgjdbc(pgrace_server: ServerInfo, java_classes: Path) -> None:
    tmp_path = java_classes
    user = str(psycopg.conninfo.conninfo_to_dict(pgrace_server.dsn)["user"])
    with proxied(pgrace_server) as (proxy, hooks):
        url = f"jdbc:postgresql://{proxy.host}:{proxy.port}/postgres?user={user}&sslmode=disable&ApplicationName=jdbc"
        done = subprocess.run(
            ["java", "-cp", f"{JDBC}:{tmp_path}", "Client", url], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        hooks.wait_closed(1)
    assert done.stdout.split() == ["1", "2", "4", "6", "8", "10", "12"]
    # pgjdbc names itself with a SET after its start-up: the client's name follows the server's ParameterStatus.
    assert hooks.clients[0].application_name == "jdbc"
    steps = hooks.steps("jdbc")
    assert steps[:2] == [("extended", "SET application_name = 'jdbc'"), ("extended", "SELECT 1")]
    # After five executions pgjdbc prepares the statement by name (S_1), then binds it without a Parse,
    # asking for the result in binary: decoded with the columns the earlier Describe gave.
    assert steps[2:] == [("extended", "SELECT $1::int * 2")] * 6
    doubled = [r for r in hooks.of("jdbc") if r.statement.sql == "SELECT $1::int * 2"]
    assert [r.statement.params for r in doubled] == [(str(n),) for n in range(1, 7)]
    assert [r.reply.rows for r in doubled] == [((str(2 * n),),) for n in range(1, 7)]


# ---------------------------------------------------------------------------------------------- holding


HOLD_SQL = "UPDATE proxy_held SET n = n + 1 WHERE id = $1 RETURNING n"


def hold_with_psycopg(proxy: Proxy, server: ServerInfo, how: str) -> str:
    with psycopg.connect(dsn(proxy, server, "held"), autocommit=True) as conn:
        row = conn.execute(HOLD_SQL.replace("$1", "%s"), (1,)).fetchone()
    return str(row[0]) if row else ""


def hold_with_psycopg_async(proxy: Proxy, server: ServerInfo, how: str) -> str:
    async def main() -> str:
        async with await psycopg.AsyncConnection.connect(dsn(proxy, server, "held"), autocommit=True) as conn:
            row = await (await conn.execute(HOLD_SQL.replace("$1", "%s"), (1,))).fetchone()
        return str(row[0]) if row else ""

    return asyncio.run(main())


def hold_with_asyncpg(proxy: Proxy, server: ServerInfo, how: str) -> str:
    import asyncpg

    async def main() -> str:
        user = str(psycopg.conninfo.conninfo_to_dict(server.dsn)["user"])
        conn = await asyncpg.connect(
            host=proxy.host, port=proxy.port, user=user, database="postgres", ssl=False,
            server_settings={"application_name": "held"},
        )  # fmt: skip
        try:
            return str(await conn.fetchval(HOLD_SQL, 1))
        finally:
            await conn.close()

    return asyncio.run(main())


def hold_with_psycopg2(proxy: Proxy, server: ServerInfo, how: str) -> str:
    conn = psycopg2.connect(dsn(proxy, server, "held"))
    try:
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute(HOLD_SQL.replace("$1", "%s"), (1,))
        row = cur.fetchone()
        return str(row[0]) if row else ""
    finally:
        conn.close()


def hold_with_node(proxy: Proxy, server: ServerInfo, where: str) -> str:
    user = str(psycopg.conninfo.conninfo_to_dict(server.dsn)["user"])
    config = {"host": proxy.host, "port": proxy.port, "user": user, "database": "postgres", "application_name": "held"}
    done = subprocess.run(
        ["node", "hold.js", json.dumps(config), HOLD_SQL], cwd=where, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def hold_with_jdbc(proxy: Proxy, server: ServerInfo, where: str) -> str:
    done = subprocess.run(
        ["java", "-cp", f"{JDBC}:{where}", "Hold", jdbc_url(proxy, server, "held"), HOLD_SQL],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


HOLDERS: dict[str, Callable[[Proxy, ServerInfo, str], str]] = {
    "psycopg": hold_with_psycopg,
    "psycopg-async": hold_with_psycopg_async,
    "asyncpg": hold_with_asyncpg,
    "psycopg2": hold_with_psycopg2,
    "node-postgres": hold_with_node,
    "pgjdbc": hold_with_jdbc,
}


@pytest.mark.parametrize("client", list(HOLDERS))
def test_a_held_statement_is_not_on_the_server_until_released(
    pgrace_server: ServerInfo, request: pytest.FixtureRequest, client: str
) -> None:
    """Each client's UPDATE waits in the proxy (its backend idle, the row free) while another client runs."""
    where = ""
    if client == "node-postgres":
        where = str(request.getfixturevalue("node_client"))
    elif client == "pgjdbc":
        where = str(request.getfixturevalue("java_classes"))

    def hold(held: Client, statement: Statement) -> bool:
        return held.application_name == "held" and statement.sql.startswith("UPDATE")

    hooks = Recorder(hold=hold)
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS proxy_held; CREATE TABLE proxy_held (id int PRIMARY KEY, n int)")
        admin.execute("INSERT INTO proxy_held VALUES (1, 0)")
    try:
        with proxied(pgrace_server, hooks) as (proxy, _):
            got: list[str] = []
            failed: list[BaseException] = []

            def run() -> None:
                try:
                    got.append(HOLDERS[client](proxy, pgrace_server, where))
                except BaseException as exc:
                    failed.append(exc)

            worker = threading.Thread(target=run)
            worker.start()
            assert hooks.held.wait(60), failed
            (held,) = [c for c in hooks.clients if c.application_name == "held"]
            state, query = activity(pgrace_server, held.backend_pid) or ("gone", "")
            assert state == "idle" and not query.startswith("UPDATE")
            with psycopg.connect(dsn(proxy, pgrace_server, "free"), autocommit=True) as free:
                # The row is free: a held UPDATE never reached the server, so this one does not wait.
                assert free.execute("UPDATE proxy_held SET n = n + 10 WHERE id = 1 RETURNING n").fetchone() == (10,)
            assert worker.is_alive() and not got
            hooks.release.set()
            worker.join(60)
            assert not failed and got == ["11"]
    finally:
        with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
            admin.execute("DROP TABLE proxy_held")
    # The step that ran it: asyncpg's fetchval reads one row (PortalSuspended, no tag); psycopg2 binds in the text.
    (update,) = [r for r in hooks.of("held") if r.statement.sql.startswith("UPDATE") and r.reply.rows]
    if client == "psycopg2":
        assert (update.statement.sql, update.statement.params) == (HOLD_SQL.replace("$1", "1"), ())
    else:
        assert (update.statement.sql, update.statement.params) == (HOLD_SQL, ("1",))
    assert update.reply.rows == (("11",),)


def test_an_extended_copy_from_is_one_step_with_the_sync_after_its_copy_done(pgrace_server: ServerInfo) -> None:
    """libpq's COPY in the extended protocol: the server ignores the cycle's Sync in COPY; libpq sends another."""
    with (
        proxied(pgrace_server) as (proxy, hooks),
        psycopg.connect(dsn(proxy, pgrace_server, "xcopy"), autocommit=True) as connection,
    ):
        connection.execute("CREATE TEMP TABLE t (n int)")
        conn = connection.pgconn
        conn.send_query_params(b"COPY t FROM STDIN", None)
        statuses: list[int] = []
        while not statuses or statuses[-1] != psycopg.pq.ExecStatus.COPY_IN:
            select.select([conn.socket], [], [], 10)
            conn.consume_input()
            if not conn.is_busy() and (result := conn.get_result()) is not None:
                statuses.append(result.status)  # in COPY IN libpq returns its COPY_IN result again and again
        assert conn.put_copy_data(b"1\n2\n3\n") == 1 and conn.put_copy_end() == 1
        while conn.flush():
            select.select([], [conn.socket], [], 10)
        finished = []
        while True:
            if conn.is_busy():  # wait for bytes only when libpq has none to hand out
                assert select.select([conn.socket], [], [], 10)[0], "no reply in 10 s"
                conn.consume_input()
                continue
            result = conn.get_result()
            if result is None:
                break
            finished.append((result.status, result.command_status))
        assert finished == [(psycopg.pq.ExecStatus.COMMAND_OK, b"COPY 3")]
        assert connection.execute("SELECT sum(n) FROM t").fetchone() == (6,)
    (copy,) = [r for r in hooks.of("xcopy") if r.statement.sql == "COPY t FROM STDIN"]
    assert (copy.statement.kind, copy.reply.tags, copy.reply.status) == ("extended", ("COPY 3",), b"I")
    assert hooks.steps("xcopy")[-1] == ("query", "SELECT sum(n) FROM t")  # the extra Sync was no step of its own
