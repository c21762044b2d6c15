"""The proxy's pure protocol layer: framing, start-up packets, steps, replies, values; no server.

Messages are built by pygwire, a codec written apart from pgrace, so that each side checks the other.
"""

from __future__ import annotations

import struct
import uuid
from decimal import Decimal

import pygwire
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pygwire import messages as pg

from pgrace.engine.proxy import steps, values, wire

Q = pg.Query


def raw(*messages: pg.PGMessage) -> bytes:
    return b"".join(message.to_wire() for message in messages)


def framed(*messages: pg.PGMessage) -> list[wire.Message]:
    return wire.Framer().feed(raw(*messages))


def group(*messages: pg.PGMessage, memory: steps.Memory | None = None) -> list[steps.GroupedStep]:
    grouper = steps.Grouper(memory or steps.Memory())
    found = [grouper.add(message) for message in framed(*messages)]
    return [step for step in found if step is not None]


# ---------------------------------------------------------------------------------------------- start-up


def test_a_startup_message_of_protocol_3_0_and_3_2() -> None:
    for version in (wire.PROTOCOL_3_0, wire.PROTOCOL_3_2):
        packet = pg.StartupMessage(params={"user": "alice", "database": "shop"}, protocol_version=version).to_wire()
        found = wire.startup_packet(packet + b"extra")
        assert found is not None
        startup, length = found
        assert length == len(packet)
        assert isinstance(startup, wire.Startup)
        assert (startup.version, startup.parameters, startup.raw) == (
            version,
            {"user": "alice", "database": "shop"},
            packet,
        )
        assert not startup.replication


def test_a_startup_packet_waits_until_it_is_whole() -> None:
    packet = pg.StartupMessage(params={"user": "alice"}).to_wire()
    for cut in (0, 3, 4, len(packet) - 1):
        assert wire.startup_packet(packet[:cut]) is None


@pytest.mark.parametrize("value", ["true", "database", "on", "1"])
def test_replication_in_the_startup_parameters(value: str) -> None:
    packet = pg.StartupMessage(params={"user": "a", "replication": value}).to_wire()
    startup = wire.parse_startup(packet)
    assert isinstance(startup, wire.Startup) and startup.replication


def test_encryption_requests_and_direct_tls() -> None:
    assert isinstance(wire.parse_startup(pg.SSLRequest().to_wire()), wire.SSLRequest)
    assert isinstance(wire.parse_startup(pg.GSSEncRequest().to_wire()), wire.GSSENCRequest)
    found = wire.startup_packet(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
    assert found is not None and isinstance(found[0], wire.DirectTLS)


@pytest.mark.parametrize("key", [b"\x01\x02\x03\x04", bytes(range(32)), bytes(256)])
def test_a_cancel_request_with_a_key_of_any_allowed_length(key: bytes) -> None:
    packet = pg.CancelRequest(process_id=4242, secret_key=key).to_wire()
    assert wire.parse_startup(packet) == wire.CancelRequest(4242, key)
    assert wire.cancel_request(4242, key) == packet


@pytest.mark.parametrize(
    ("packet", "says"),
    [
        (struct.pack("!i", 3), "invalid length of startup packet: 3"),
        (struct.pack("!i", 10_001), "invalid length of startup packet: 10001"),
        (struct.pack("!ii", 8, 2 << 16), "unsupported frontend protocol 2.0"),
        (struct.pack("!iii", 12, wire.CANCEL_REQUEST, 1), "invalid length of cancel request packet"),
        (struct.pack("!iii", 12 + 257, wire.CANCEL_REQUEST, 1) + bytes(257), "invalid length of cancel request"),
        (struct.pack("!ii", 13, wire.PROTOCOL_3_0) + b"user\0", "does not end with a NUL"),
        (struct.pack("!ii", 14, wire.PROTOCOL_3_0) + b"user\0\0", "a parameter name without a value"),
    ],
)
def test_a_malformed_startup_packet_is_a_protocol_violation(packet: bytes, says: str) -> None:
    with pytest.raises(wire.ProtocolViolation, match=says) as caught:
        wire.startup_packet(packet + bytes(max(0, 16 - len(packet))))
    assert caught.value.sqlstate == "08P01"


# ---------------------------------------------------------------------------------------------- framing

FRONTEND = st.one_of(
    st.builds(
        pg.Query, query_string=st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\0"), max_size=40)
    ),
    st.builds(pg.Parse, statement=st.sampled_from(["", "s1"]), query=st.just("SELECT $1"), param_types=st.just([23])),
    st.builds(pg.Bind, param_formats=st.just([0]), param_values=st.lists(st.one_of(st.none(), st.binary(max_size=9)))),
    st.builds(pg.Execute, max_rows=st.integers(0, 5)),
    st.builds(pg.Sync),
    st.builds(pg.Flush),
    st.builds(pg.Describe, kind=st.sampled_from("SP"), name=st.sampled_from(["", "s1"])),
    st.builds(pg.Close, kind=st.sampled_from("SP"), name=st.sampled_from(["", "s1"])),
)


@given(st.lists(FRONTEND, max_size=12), st.lists(st.integers(1, 50), max_size=30))
def test_framing_agrees_with_pygwire_whatever_the_chunks(messages: list[pg.PGMessage], cuts: list[int]) -> None:
    stream = raw(*messages)
    framer, found, at = wire.Framer(), [], 0
    for cut in [*cuts, len(stream)]:
        found += framer.feed(stream[at : at + cut])
        at += cut
    found += framer.feed(stream[at:])
    assert [message.raw for message in found] == [message.to_wire() for message in messages]
    assert framer.pending == 0
    decoder = pygwire.FrontendMessageDecoder()
    decoder.phase = pygwire.ConnectionPhase.READY
    decoder.feed(stream)
    assert [type(message).__name__ for message in decoder] == [type(message).__name__ for message in messages]


@pytest.mark.parametrize("length", [0, 3, 1025])
def test_a_length_below_4_or_above_the_cap_is_refused_before_more_is_read(length: int) -> None:
    with pytest.raises(wire.ProtocolViolation, match=f"invalid message length {length}"):
        wire.Framer(max_message=1024).feed(b"Q" + struct.pack("!i", length))


def test_the_backend_reader_keeps_a_bounded_head_of_a_long_message() -> None:
    long_row = pg.DataRow(columns=[b"x" * 5000]).to_wire()
    stream = raw(pg.RowDescription(fields=[])) + long_row + raw(pg.CommandComplete(tag="SELECT 1"))
    reader = wire.BackendReader(keep=100)
    found = [message for at in range(0, len(stream), 7) for message in reader.feed(stream[at : at + 7])]
    assert [message.code for message in found] == [b"T", b"D", b"C"]
    assert not found[1].whole and len(found[1].body) == 100
    assert wire.command_tag(found[2].body) == "SELECT 1"


def test_the_proxys_refusal_is_an_error_response_pygwire_reads() -> None:
    refusal = wire.Refusal("0A000", "pgrace's proxy does not accept TLS", "connect with sslmode=disable")
    decoder = pygwire.BackendMessageDecoder()
    decoder.phase = pygwire.ConnectionPhase.READY
    decoder.feed(refusal.encode())
    (error,) = list(decoder)
    assert isinstance(error, pg.ErrorResponse)
    assert error.fields == {
        "S": "FATAL",
        "V": "FATAL",
        "C": "0A000",
        "M": "pgrace's proxy does not accept TLS",
        "H": "connect with sslmode=disable",
    }


def test_backend_key_data_of_3_0_and_3_2() -> None:
    for key in (b"abcd", bytes(range(32))):
        body = pg.BackendKeyData(process_id=77, secret_key=key).to_wire()[5:]
        assert wire.backend_key(body) == wire.BackendKey(77, key)
        assert wire.backend_key_data(77, key) == pg.BackendKeyData(process_id=77, secret_key=key).to_wire()


# ---------------------------------------------------------------------------------------------- steps


def test_a_query_is_a_step() -> None:
    (step,) = group(Q(query_string="SELECT 1"))
    assert step.statement == steps.Statement("SELECT 1", (), "query", Q(query_string="SELECT 1").to_wire())


def test_an_extended_cycle_is_one_step_up_to_its_sync() -> None:
    memory = steps.Memory()
    grouper = steps.Grouper(memory)
    cycle = [
        pg.Parse(query="UPDATE t SET v = $1 WHERE id = $2", param_types=[23, 25]),
        pg.Bind(param_formats=[1, 0], param_values=[struct.pack("!i", -7), b"abc"]),
        pg.Describe(kind="P"),
        pg.Execute(),
    ]
    for message in framed(*cycle):
        assert grouper.add(message) is None
    assert grouper.building
    (sync,) = framed(pg.Sync())
    step = grouper.add(sync)
    assert step is not None and not grouper.building
    assert step.statement.sql == "UPDATE t SET v = $1 WHERE id = $2"
    assert step.statement.params == ("-7", "abc")
    assert step.statement.kind == "extended"
    assert step.statement.data == raw(*cycle, pg.Sync())


def test_a_flush_prefix_is_a_step_and_a_named_statement_is_remembered() -> None:
    memory = steps.Memory()
    prepare, execute = group(
        pg.Parse(statement="claim", query="SELECT id FROM jobs WHERE id = $1 FOR UPDATE SKIP LOCKED"),
        pg.Describe(kind="S", name="claim"),
        pg.Flush(),
        pg.Bind(statement="claim", param_formats=[1], param_values=[struct.pack("!q", 12)], result_formats=[1]),
        pg.Execute(),
        pg.Sync(),
        memory=memory,
    )
    assert (prepare.statement.kind, prepare.statement.sql) == ("flush", memory.statements["claim"].sql)
    # Before the server described it, the parameter's type is unknown: binary shown as hex.
    assert execute.statement.params == ("\\x000000000000000c",)
    assert execute.statement.sql == "SELECT id FROM jobs WHERE id = $1 FOR UPDATE SKIP LOCKED"
    assert (prepare.statement.prepares_only, execute.statement.prepares_only) == (True, False)


def test_only_a_step_with_no_bind_execute_or_query_prepares_only() -> None:
    """What the reduction takes to read no row: Parse, Describe, Close, Flush and Sync, and at least one Parse."""
    found = group(
        pg.Parse(statement="s", query="SELECT 1"),
        pg.Describe(kind="S", name="s"),
        pg.Sync(),
        pg.Parse(query="SELECT 2"),
        pg.Bind(),
        pg.Describe(kind="P"),
        pg.Flush(),
        pg.Flush(),
        Q(query_string="SELECT 3"),
    )
    assert [step.statement.prepares_only for step in found] == [True, False, False, False]


def test_a_pipeline_is_one_step_per_sync() -> None:
    found = group(
        pg.Parse(query="SELECT 1"),
        pg.Bind(),
        pg.Execute(),
        pg.Sync(),
        pg.Parse(query="SELECT 2"),
        pg.Bind(),
        pg.Execute(),
        pg.Sync(),
    )
    assert [(step.statement.sql, step.statement.kind) for step in found] == [
        ("SELECT 1", "extended"),
        ("SELECT 2", "extended"),
    ]


def test_an_unknown_frontend_message_is_a_protocol_violation() -> None:
    (message,) = wire.Framer().feed(b"Y\0\0\0\4")
    with pytest.raises(wire.ProtocolViolation, match="invalid frontend message type"):
        steps.Grouper(steps.Memory()).add(message)


@pytest.mark.parametrize(
    "body",
    [b"", b"name-without-nul", b"\0SELECT 1\0\xff", b"\0SELECT 1\0\x00\x02\x00\x00\x00\x17"],
)
def test_a_truncated_parse_is_a_protocol_violation(body: bytes) -> None:
    grouper = steps.Grouper(steps.Memory())
    grouper.add(wire.Message(b"P", body, wire.message(b"P", body)))
    with pytest.raises(wire.ProtocolViolation, match="Parse message"):
        grouper.add(framed(pg.Sync())[0])


# ---------------------------------------------------------------------------------------------- replies


def feed(tracker: steps.Tracker, *messages: pg.PGMessage) -> list[bool]:
    return [tracker.feed(message) for message in wire.BackendReader().feed(raw(*messages))]


def test_a_query_is_complete_at_ready_for_query() -> None:
    (step,) = group(Q(query_string="SELECT 1; SELECT 'x'"))
    tracker = steps.Tracker(step, steps.Memory(), discarding=False)
    ints = pg.RowDescription(fields=[pg.FieldDescription(name="n", type_oid=23)])
    done = feed(
        tracker,
        ints,
        pg.DataRow(columns=[b"1"]),
        pg.CommandComplete(tag="SELECT 1"),
        pg.NoticeResponse(fields={"S": "NOTICE", "M": "hi"}),
        pg.CommandComplete(tag="SELECT 1"),
        pg.ReadyForQuery(status=pygwire.TransactionStatus.IDLE),
    )
    assert done == [False] * 5 + [True]
    assert tracker.reply() == steps.Reply(("SELECT 1", "SELECT 1"), (("1",),), ("n",), None, b"I")


def test_rows_are_decoded_when_the_reply_is_read_not_as_they_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoding rows cost the relay more than relaying them; a reply nobody reads decodes none."""
    decoded: list[bytes] = []
    data_row = wire.data_row

    def counted(body: bytes) -> tuple[bytes | None, ...]:
        decoded.append(body)
        return data_row(body)

    monkeypatch.setattr(wire, "data_row", counted)
    (step,) = group(Q(query_string="SELECT n FROM generate_series(1, 3) n"))
    tracker = steps.Tracker(step, steps.Memory(), discarding=False)
    ints = pg.RowDescription(fields=[pg.FieldDescription(name="n", type_oid=23)])
    rows = [pg.DataRow(columns=[str(n).encode()]) for n in (1, 2, 3)]
    ready = pg.ReadyForQuery(status=pygwire.TransactionStatus.IDLE)
    feed(tracker, ints, *rows, pg.CommandComplete(tag="SELECT 3"), ready)
    reply = tracker.reply()
    assert decoded == []
    assert reply.rows == (("1",), ("2",), ("3",))
    assert reply.rows == (("1",), ("2",), ("3",))
    assert len(decoded) == 3


def test_an_error_is_in_the_reply_and_the_step_ends_at_its_ready_for_query() -> None:
    (step,) = group(pg.Parse(query="SELECT 1/0"), pg.Bind(), pg.Execute(), pg.Sync())
    tracker = steps.Tracker(step, steps.Memory(), discarding=False)
    error = pg.ErrorResponse(fields={"S": "ERROR", "C": "22012", "M": "division by zero"})
    assert feed(tracker, pg.ParseComplete(), pg.BindComplete(), error) == [False, False, False]
    assert feed(tracker, pg.ReadyForQuery(status=pygwire.TransactionStatus.IDLE)) == [True]
    assert tracker.reply().error == {"S": "ERROR", "C": "22012", "M": "division by zero"}


def test_a_flush_prefix_is_complete_when_each_message_is_answered_and_binary_results_are_decoded() -> None:
    memory = steps.Memory()
    prepare, execute = group(
        pg.Parse(statement="s", query="SELECT $1::int8 AS n, $2::uuid AS u"),
        pg.Describe(kind="S", name="s"),
        pg.Flush(),
        pg.Bind(statement="s", param_formats=[1], param_values=[struct.pack("!q", 5), uuid.UUID(int=1).bytes]),
        pg.Execute(),
        pg.Sync(),
        memory=memory,
    )
    tracker = steps.Tracker(prepare, memory, discarding=False)
    described = pg.RowDescription(
        fields=[pg.FieldDescription(name="n", type_oid=20), pg.FieldDescription(name="u", type_oid=2950)]
    )
    assert feed(tracker, pg.ParseComplete(), pg.ParameterDescription(type_oids=[20, 2950])) == [False, False]
    assert feed(tracker, described) == [True]
    assert tracker.reply().status is None
    assert memory.statements["s"].types == (20, 2950)
    # The Bind was grouped before the server described the statement; a Bind grouped after shows the values.
    (again,) = group(
        pg.Bind(statement="s", param_formats=[1], param_values=[struct.pack("!q", 5), uuid.UUID(int=1).bytes]),
        pg.Bind(statement="s", portal="p", result_formats=[1]),
        pg.Execute(portal="p"),
        pg.Sync(),
        memory=memory,
    )
    assert again.statement.params[:2] == ("5", str(uuid.UUID(int=1)))
    tracker = steps.Tracker(again, memory, discarding=False)
    row = pg.DataRow(columns=[struct.pack("!q", 5), uuid.UUID(int=1).bytes])
    feed(tracker, pg.BindComplete(), pg.BindComplete(), row, pg.CommandComplete(tag="SELECT 1"))
    assert feed(tracker, pg.ReadyForQuery(status=pygwire.TransactionStatus.IDLE)) == [True]
    assert tracker.reply().rows == (("5", str(uuid.UUID(int=1))),)
    assert tracker.reply().columns == ("n", "u")
    del execute


def test_after_an_error_in_a_flush_prefix_the_next_prefix_gets_no_answer_until_a_sync() -> None:
    first, second, synced = group(
        pg.Parse(query="SELEC"),
        pg.Flush(),
        pg.Parse(query="SELECT 1"),
        pg.Flush(),
        pg.Sync(),
    )
    tracker = steps.Tracker(first, steps.Memory(), discarding=False)
    assert feed(tracker, pg.ErrorResponse(fields={"S": "ERROR", "C": "42601", "M": "syntax error"})) == [True]
    assert tracker.discarding
    assert steps.Tracker(second, steps.Memory(), discarding=True).complete
    last = steps.Tracker(synced, steps.Memory(), discarding=True)
    assert not last.complete
    assert feed(last, pg.ReadyForQuery(status=pygwire.TransactionStatus.IDLE)) == [True]
    assert not last.discarding


def test_an_extended_copy_from_waits_for_the_sync_after_copy_done() -> None:
    (step,) = group(pg.Parse(query="COPY t FROM STDIN"), pg.Bind(), pg.Execute(), pg.Sync())
    tracker = steps.Tracker(step, steps.Memory(), discarding=False)
    feed(tracker, pg.ParseComplete(), pg.BindComplete(), pg.CopyInResponse())
    assert tracker.copy_in and tracker.extra_sync
    assert feed(tracker, pg.CommandComplete(tag="COPY 2")) == [False]
    assert not tracker.copy_in


def test_rows_kept_are_bounded() -> None:
    (step,) = group(Q(query_string="SELECT generate_series(1, 1000)"))
    tracker = steps.Tracker(step, steps.Memory(), discarding=False)
    feed(tracker, pg.RowDescription(fields=[pg.FieldDescription(name="g", type_oid=23)]))
    feed(tracker, *[pg.DataRow(columns=[str(n).encode()]) for n in range(1000)])
    assert len(tracker.reply().rows) == steps.MAX_ROWS


# ---------------------------------------------------------------------------------------------- values


@pytest.mark.parametrize(
    ("oid", "data", "text"),
    [
        (values.INT2, struct.pack("!h", -3), "-3"),
        (values.INT4, struct.pack("!i", 42), "42"),
        (values.INT8, struct.pack("!q", 2**40), str(2**40)),
        (values.BOOL, b"\x01", "true"),
        (values.TEXT, "né".encode(), "né"),
        (values.VARCHAR, b"x", "x"),
        (values.UUID, uuid.UUID(int=7).bytes, str(uuid.UUID(int=7))),
        (values.FLOAT8, struct.pack("!d", 1.5), "1.5"),
        (values.JSONB, b'\x01{"a": 1}', '{"a": 1}'),
        (values.DATE, struct.pack("!i", 1), "2000-01-02"),
        (values.INT4, b"\x01\x02\x03", "\\x010203"),
        (99999, b"\xde\xad", "\\xdead"),
    ],
)
def test_binary_values_are_decoded_for_the_common_types_else_shown_as_hex(oid: int, data: bytes, text: str) -> None:
    assert values.shown(data, oid, binary=True) == text


def numeric(value: str) -> bytes:
    """PostgreSQL's binary numeric for ``value``, built digit group by digit group."""
    number = Decimal(value)
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    scale = max(0, -exponent)
    text = ("".join(map(str, digits)) or "0").zfill(scale + 1)
    integer, fraction = (text[: len(text) - scale] or "0"), text[len(text) - scale :]
    integer = integer.zfill((len(integer) + 3) // 4 * 4)
    fraction = fraction.ljust((len(fraction) + 3) // 4 * 4, "0")
    groups = [int(part[i : i + 4]) for part in (integer,) for i in range(0, len(part), 4)]
    weight = len(groups) - 1
    groups += [int(fraction[i : i + 4]) for i in range(0, len(fraction), 4)]
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    return struct.pack(f"!hhHh{len(groups)}H", len(groups), weight, 0x4000 if sign else 0, scale, *groups)


@pytest.mark.parametrize("value", ["0", "1", "-12.50", "10000", "123456789.000001", "0.0001", "-0.00012"])
def test_numeric_binary_is_decoded(value: str) -> None:
    assert values.shown(numeric(value), values.NUMERIC, binary=True) == value


def test_text_values_as_sent_and_null() -> None:
    assert values.shown(b"\xff 42", 0, binary=False) == "\\xff 42"
    assert values.shown(None, values.INT4, binary=True) is None
