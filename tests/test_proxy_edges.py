"""The proxy's edges on a real server: encryption requests, direct TLS, replication, malformed and oversized
messages, cancels (protocol 3.0 and 3.2), authentication passed through, and nothing left when it closes."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import struct
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proxying import RawClient, Recorder, activity, dsn, gone, proxied, wait_for

from pgrace.engine.proxy import wire
from pgrace.engine.proxy.relay import Client, Refused, Statement
from pgrace.servers import ServerInfo

pytestmark = pytest.mark.server  # auth_server starts a server of its own


def user_of(server: ServerInfo) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(server.dsn)["user"])


def error_of(messages: list[wire.Message]) -> dict[str, str]:
    (error,) = [message for message in messages if message.code == b"E"]
    return wire.error_fields(error.body)


def test_an_ssl_request_is_answered_n_and_plain_text_goes_on(pgrace_server: ServerInfo) -> None:
    with proxied(pgrace_server) as (proxy, _hooks):
        raw = RawClient(proxy)
        try:
            for request in (wire.SSL_REQUEST, wire.GSSENC_REQUEST):
                raw.send(struct.pack("!ii", 8, request))
                assert raw.sock.recv(1) == b"N"
            started = raw.start(user_of(pgrace_server), "postgres")
            assert [m.code for m in started][-1] == b"Z" and b"K" in [m.code for m in started]
        finally:
            raw.close()
        # libpq's default, sslmode=prefer, asks first and goes on in plain text.
        with psycopg.connect(dsn(proxy, pgrace_server, "prefer", sslmode="prefer")) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_client_that_requires_tls_gets_one_line(pgrace_server: ServerInfo) -> None:
    with proxied(pgrace_server) as (proxy, hooks), pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(dsn(proxy, pgrace_server, "tls", sslmode="require"))
    assert "server does not support SSL, but SSL was required" in str(caught.value)
    assert "\n" not in str(caught.value).strip()
    assert hooks.clients == []


def test_direct_tls_is_refused_naming_the_setting(pgrace_server: ServerInfo) -> None:
    with proxied(pgrace_server) as (proxy, hooks):
        raw = RawClient(proxy)
        try:
            raw.send(b"\x16\x03\x01\x00\x05hello")
            assert raw.eof()
            (message,) = wire.BackendReader().feed(bytes(raw.received))
        finally:
            raw.close()
    assert hooks.clients == []
    error = wire.error_fields(message.body)
    assert error["C"] == "0A000" and error["M"] == "pgrace's proxy does not accept TLS"
    assert "sslmode=disable" in error["H"] and "sslnegotiation=direct" in error["H"]


def test_a_replication_connection_is_refused_before_it_reaches_the_server(pgrace_server: ServerInfo) -> None:
    with proxied(pgrace_server) as (proxy, hooks), pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(dsn(proxy, pgrace_server, "walsender", replication="database"))
    assert "pgrace's proxy does not relay replication connections" in str(caught.value)
    assert hooks.clients == []


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"Q\0\0\0\2", "invalid message length 2"),
        (b"Q" + struct.pack("!i", 1 << 30), f"invalid message length {1 << 30}"),
        (b"Y\0\0\0\4", "invalid frontend message type b'Y'"),
        (b"P\0\0\0\6\0\0S\0\0\0\4", "Parse message is too short"),  # read whole at its Sync
    ],
)
def test_a_malformed_message_ends_that_connection_only(pgrace_server: ServerInfo, data: bytes, says: str) -> None:
    with (
        proxied(pgrace_server, max_message=1 << 20) as (proxy, hooks),
        psycopg.connect(dsn(proxy, pgrace_server, "bystander"), autocommit=True) as bystander,
    ):
        raw = RawClient(proxy)
        try:
            started = raw.start(user_of(pgrace_server), "postgres", application_name="broken")
            (key,) = [m for m in started if m.code == b"K"]
            pid = wire.backend_key(key.body).pid
            raw.send(data)
            assert raw.eof()
        finally:
            raw.close()
        error = error_of(wire.BackendReader().feed(bytes(raw.received)))
        assert error["C"] == "08P01" and says in error["M"]
        assert gone(pgrace_server, pid)
        assert bystander.execute("SELECT 2").fetchone() == (2,)
        (broken,) = [client.number for client in hooks.clients if client.application_name == "broken"]
        wait_for(lambda: broken in hooks.closed_why, "the broken connection reported closed")
        assert says in str(hooks.closed_why[broken])


def test_an_oversized_query_from_a_driver_ends_its_connection(pgrace_server: ServerInfo) -> None:
    with proxied(pgrace_server, max_message=1024) as (proxy, _hooks):
        with psycopg.connect(dsn(proxy, pgrace_server, "big"), autocommit=True) as big:
            pid = big.info.backend_pid
            with pytest.raises(psycopg.OperationalError, match="invalid message length"):
                big.execute(("SELECT '" + "x" * 2000 + "'").encode())
        assert gone(pgrace_server, pid)
        with psycopg.connect(dsn(proxy, pgrace_server, "small"), autocommit=True) as small:
            assert small.execute("SELECT 'fits'").fetchone() == ("fits",)


def sleeping(conn: psycopg.Connection[tuple[object, ...]], failed: list[BaseException]) -> threading.Thread:
    def sleep() -> None:
        try:
            conn.execute("SELECT pg_sleep(30)")
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=sleep)
    thread.start()
    return thread


def active(server: ServerInfo, pid: int) -> bool:
    found = activity(server, pid)
    return found is not None and found[0] == "active" and "pg_sleep" in found[1]


def test_a_cancel_through_the_proxy_reaches_the_right_backend(pgrace_server: ServerInfo) -> None:
    with (
        proxied(pgrace_server) as (proxy, _hooks),
        psycopg.connect(dsn(proxy, pgrace_server, "first"), autocommit=True) as first,
        psycopg.connect(dsn(proxy, pgrace_server, "second"), autocommit=True) as second,
    ):
        failed_first: list[BaseException] = []
        failed_second: list[BaseException] = []
        threads = [sleeping(first, failed_first), sleeping(second, failed_second)]
        pids = [first.info.backend_pid, second.info.backend_pid]
        wait_for(lambda: all(active(pgrace_server, pid) for pid in pids), "pg_sleep running in both")
        first.cancel_safe()
        threads[0].join(10)
        assert [type(exc) for exc in failed_first] == [psycopg.errors.QueryCanceled]
        assert active(pgrace_server, second.info.backend_pid) and not failed_second
        second.cancel_safe()
        threads[1].join(10)
        assert [type(exc) for exc in failed_second] == [psycopg.errors.QueryCanceled]


def test_protocol_3_2_gets_a_long_cancel_key_of_the_proxys_own_mapped_to_the_servers(
    pgrace_server: ServerInfo,
) -> None:
    with proxied(pgrace_server) as (proxy, _hooks):
        with psycopg.connect(dsn(proxy, pgrace_server, "new", max_protocol_version="3.2"), autocommit=True) as conn:
            assert conn.pgconn.full_protocol_version == 30002
            failed: list[BaseException] = []
            thread = sleeping(conn, failed)
            wait_for(lambda: active(pgrace_server, conn.info.backend_pid), "pg_sleep running")
            conn.cancel_safe()
            thread.join(10)
            assert [type(exc) for exc in failed] == [psycopg.errors.QueryCanceled]
        raw = RawClient(proxy)
        try:
            started = raw.start(user_of(pgrace_server), "postgres", version=wire.PROTOCOL_3_2)
            (key,) = [wire.backend_key(m.body) for m in started if m.code == b"K"]
            assert len(key.key) == 32  # PostgreSQL 18's length: the proxy's key is as long as the server's
            raw.send(wire.message(b"Q", b"SELECT pg_sleep(30)\0"))
            wait_for(lambda: active(pgrace_server, key.pid), "pg_sleep running")
            for wrong in (secrets.token_bytes(32), key.key[:4]):
                with socket.create_connection((proxy.host, proxy.port)) as cancel:
                    cancel.sendall(wire.cancel_request(key.pid, wrong))
                    assert cancel.recv(1) == b""
            assert active(pgrace_server, key.pid)  # a key the proxy did not give cancels nothing
            with socket.create_connection((proxy.host, proxy.port)) as cancel:
                cancel.sendall(wire.cancel_request(key.pid, key.key))
                assert cancel.recv(1) == b""
            assert error_of(raw.read_messages(b"Z"))["C"] == "57014"
        finally:
            raw.close()


def test_a_newer_protocol_minor_is_negotiated_by_the_server_through_the_proxy(pgrace_server: ServerInfo) -> None:
    with proxied(pgrace_server) as (proxy, _hooks):
        raw = RawClient(proxy)
        try:
            started = raw.start(user_of(pgrace_server), "postgres", version=(3 << 16) | 9, **{"_pq_.x": "1"})
        finally:
            raw.close()
    (negotiated,) = [m for m in started if m.code == b"v"]
    assert struct.unpack_from("!i", negotiated.body)[0] == wire.PROTOCOL_3_2  # the newest the server speaks
    assert b"_pq_.x\0" in negotiated.body  # and the protocol option it does not know
    assert started[-1].code == b"Z"


def test_leaving_the_proxy_closes_every_connection_and_leaves_no_backend(pgrace_server: ServerInfo) -> None:
    def hold(client: Client, statement: Statement) -> bool:
        return client.application_name == "held"

    hooks = Recorder(hold=hold)
    failures: list[BaseException] = []
    with proxied(pgrace_server, hooks) as (proxy, _):
        idle = psycopg.connect(dsn(proxy, pgrace_server, "idle"), autocommit=True)
        busy = psycopg.connect(dsn(proxy, pgrace_server, "busy"), autocommit=True)
        held = psycopg.connect(dsn(proxy, pgrace_server, "held"), autocommit=True)
        pids = [conn.info.backend_pid for conn in (idle, busy, held)]
        threads = [sleeping(busy, failures), sleeping(held, failures)]
        wait_for(lambda: active(pgrace_server, pids[1]), "pg_sleep running")
        assert hooks.held.wait(10)
    try:
        for thread in threads:
            thread.join(10)
            assert not thread.is_alive()
        assert all(gone(pgrace_server, pid) for pid in pids)
        assert [type(exc) for exc in failures] == [psycopg.OperationalError] * 2
        assert set(hooks.closed_why) == {1, 2, 3}
    finally:
        for conn in (idle, busy, held):
            conn.close()


# ---------------------------------------------------------------------------------------------- authentication

HBA = """
local all scram_user scram-sha-256
local all md5_user md5
local all password_user password
local all all trust
"""


@pytest.fixture(scope="module")
def auth_server() -> Iterator[ServerInfo]:
    """A server of its own whose roles log in with SCRAM, md5 or a clear-text password (pg_hba.conf)."""
    from pgrace.servers.embedded import embedded_server

    where = Path(tempfile.mkdtemp(prefix="pgrace-hba-"))
    try:
        where.chmod(0o755)
        hba = where / "pg_hba.conf"
        hba.write_text(HBA)
        hba.chmod(0o644)
        with embedded_server({"hba_file": str(hba)}) as server:
            with psycopg.connect(server.dsn, autocommit=True) as conn:
                conn.execute("CREATE ROLE scram_user LOGIN PASSWORD 'scram-secret'")
                conn.execute("CREATE ROLE password_user LOGIN PASSWORD 'clear-secret'")
                conn.execute("SET password_encryption = 'md5'")
                conn.execute("CREATE ROLE md5_user LOGIN PASSWORD 'md5-secret'")
            yield server
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.mark.parametrize(
    ("user", "password"),
    [("scram_user", "scram-secret"), ("md5_user", "md5-secret"), ("password_user", "clear-secret")],
)
def test_authentication_passes_through_byte_for_byte(auth_server: ServerInfo, user: str, password: str) -> None:
    with proxied(auth_server) as (proxy, hooks):
        base = f"host={proxy.host} port={proxy.port} dbname=postgres user={user} application_name={user}"
        with psycopg.connect(f"{base} password={password}") as conn:
            assert conn.execute("SELECT current_user").fetchone() == (user,)
        with pytest.raises(psycopg.OperationalError, match=f'password authentication failed for user "{user}"'):
            psycopg.connect(f"{base} password=wrong")
    assert [client.application_name for client in hooks.clients] == [user]


def test_asyncpg_logs_in_with_scram_through_the_proxy(auth_server: ServerInfo) -> None:
    import asyncio

    import asyncpg

    async def main(port: int) -> object:
        conn = await asyncpg.connect(
            host="127.0.0.1", port=port, user="scram_user", password="scram-secret", database="postgres", ssl=False
        )
        try:
            return await conn.fetchval("SELECT current_user")
        finally:
            await conn.close()

    with proxied(auth_server) as (proxy, hooks):
        assert asyncio.run(main(proxy.port)) == "scram_user"
    assert len(hooks.clients) == 1


def test_a_unix_socket_beside_the_tcp_port_knows_its_clients_process(pgrace_server: ServerInfo) -> None:
    where = tempfile.mkdtemp(prefix="pgrace-proxy-")
    try:
        with proxied(pgrace_server, socket_dir=where) as (proxy, hooks):
            conninfo = dsn(proxy, pgrace_server, "local").replace(f"host={proxy.host}", f"host={where}")
            with psycopg.connect(conninfo) as conn:
                assert conn.execute("SELECT 3").fetchone() == (3,)
            assert Path(proxy.socket_path).is_socket()
        assert not Path(proxy.socket_path).exists()
        assert [(client.application_name, client.peer_pid) for client in hooks.clients] == [("local", os.getpid())]
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_a_client_that_leaves_mid_statement_leaves_no_backend_behind(pgrace_server: ServerInfo) -> None:
    """Its running statement is cancelled and its connection closed at once, not when the statement ends."""
    with proxied(pgrace_server) as (proxy, hooks):
        raw = RawClient(proxy)
        started = raw.start(user_of(pgrace_server), "postgres", application_name="leaver")
        (pid,) = [wire.backend_key(m.body).pid for m in started if m.code == b"K"]
        raw.send(wire.message(b"Q", b"SELECT pg_sleep(30)\0") + wire.message(b"Q", b"SELECT 1\0"))
        wait_for(lambda: active(pgrace_server, pid), "pg_sleep running")
        raw.close()
        assert gone(pgrace_server, pid, timeout=5)
        wait_for(lambda: len(hooks.closed_why) == 1, "the connection reported closed")
    assert [r.statement.sql for r in hooks.records] == []  # neither statement completed


def test_a_backend_terminated_by_the_server_ends_its_client_with_the_servers_words(pgrace_server: ServerInfo) -> None:
    with proxied(pgrace_server) as (proxy, hooks):
        with psycopg.connect(dsn(proxy, pgrace_server, "victim"), autocommit=True) as victim:
            with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", [victim.info.backend_pid])
            with pytest.raises(psycopg.OperationalError, match="terminating connection due to administrator command"):
                victim.execute("SELECT 1")
        wait_for(lambda: len(hooks.closed_why) == 1, "the connection reported closed")
    assert hooks.closed_why[1] == "terminating connection due to administrator command"


class Refusing(Recorder):
    """Turns away any statement that mentions ``forbidden``."""

    def ready(self, client: Client, statement: Statement) -> None:
        if "forbidden" in statement.sql:
            raise Refused("pgrace refused this statement: the run is over", "57P01")


def test_a_statement_the_hooks_refuse_ends_its_connection_with_their_words(pgrace_server: ServerInfo) -> None:
    hooks = Refusing()
    with proxied(pgrace_server, hooks) as (proxy, _):
        with psycopg.connect(dsn(proxy, pgrace_server, "refused"), autocommit=True) as conn:
            pid = conn.info.backend_pid
            assert conn.execute("SELECT 'allowed'").fetchone() == ("allowed",)
            with pytest.raises(psycopg.errors.AdminShutdown, match="pgrace refused this statement: the run is over"):
                conn.execute("SELECT 'forbidden'")
        assert gone(pgrace_server, pid)
        wait_for(lambda: len(hooks.closed_why) == 1, "the connection reported closed")
    assert hooks.closed_why[1] == "pgrace refused this statement: the run is over"
    assert [r.statement.sql for r in hooks.records] == ["SELECT 'allowed'"]


MESSAGE_TYPES = b"QPBDECSHXdcfFpYz\x00\xff"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(st.sampled_from(list(MESSAGE_TYPES)), st.binary(max_size=40), st.integers(-2, 60)),
        min_size=1,
        max_size=6,
    )
)
def test_hostile_bytes_after_the_start_up_end_only_that_connection(
    pgrace_server: ServerInfo, messages: list[tuple[int, bytes, int]]
) -> None:
    """Any type byte, body and length: the relay answers, or ends the connection; it never dies or leaves a backend."""
    with proxied(pgrace_server) as (proxy, hooks):
        raw = RawClient(proxy)
        try:
            started = raw.start(user_of(pgrace_server), "postgres")
            (pid,) = [wire.backend_key(m.body).pid for m in started if m.code == b"K"]
            stream = b"".join(bytes([code]) + struct.pack("!i", length) + body for code, body, length in messages)
            raw.send(stream)
            raw.sock.shutdown(socket.SHUT_WR)
            assert raw.eof()
        finally:
            raw.close()
        assert gone(pgrace_server, pid)
        wait_for(lambda: len(hooks.closed_why) == 1, "the connection reported closed")
        why = hooks.closed_why[1]
        assert why is None or "invalid" in why or "message" in why or "Terminate" in why, why


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(
        st.binary(max_size=40),
        st.builds(
            lambda length, code, rest: struct.pack("!ii", length, code) + rest,
            st.integers(-1, 70),
            st.sampled_from([wire.PROTOCOL_3_0, wire.PROTOCOL_3_2, wire.SSL_REQUEST, wire.CANCEL_REQUEST, 0, 4 << 16]),
            st.binary(max_size=60),
        ),
    )
)
def test_hostile_start_up_packets_end_only_that_connection(pgrace_server: ServerInfo, packet: bytes) -> None:
    with proxied(pgrace_server) as (proxy, hooks):
        raw = RawClient(proxy)
        try:
            raw.send(packet)
            raw.sock.shutdown(socket.SHUT_WR)
            assert raw.eof()
        finally:
            raw.close()
        with psycopg.connect(dsn(proxy, pgrace_server, "after")) as conn:  # the proxy serves the next client
            assert conn.execute("SELECT 1").fetchone() == (1,)
    assert [client.application_name for client in hooks.clients] == ["after"]


def test_a_lock_that_a_ctrl_c_left_held_does_not_hang_the_runs_cleanup() -> None:
    """A KeyboardInterrupt can land just as ``with cond`` acquires (CPython looks for signals between the two): the
    main thread then holds the lock outside every block. Stopping the hooks gives it up, so a relay thread that
    needs it to end its connection ends, and the cleanup that joins it does too (seen: a Ctrl-C'd run hung)."""
    from pgrace.engine.proxy.session import ProxyHooks

    cond = threading.Condition()
    hooks = ProxyHooks(cond, lambda pid: None, 1.0)
    cond.acquire()  # what the interrupted `with` left behind
    ended = threading.Event()

    def relay() -> None:
        with cond:  # as a relay thread does when its client closes
            ended.set()

    thread = threading.Thread(target=relay, daemon=True)
    thread.start()
    assert not ended.wait(0.2)  # it waits for the lock this thread holds
    hooks.stop()
    assert ended.wait(10), "the relay thread still waits for the lock"
    thread.join(10)
