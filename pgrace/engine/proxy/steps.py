"""Which client messages make one step, and when the server has answered it: pure, message by message.

A step is what the scheduler holds and lets go as one: a Query; an extended cycle up to and
including its Sync (buffered whole, since Parse alone takes locks); a prefix ending in Flush
(asyncpg prepares with Parse/Describe/Flush), which the server answers without a Sync. The
proxy never adds a Sync or a ReadyForQuery of its own, so a step ends where the client ended it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pgrace.engine.proxy import wire
from pgrace.engine.proxy.values import shown

Kind = Literal["query", "extended", "flush", "other"]

#: Rows a Reply keeps for the timeline; the client gets them all.
MAX_ROWS = 100


@dataclass(frozen=True)
class Statement:
    """One step's worth of client messages, held before anything goes upstream."""

    sql: str
    """The SQL as the client sent it: a Query's text, or the text of each statement the cycle executes (or parses)."""
    params: tuple[str | None, ...]
    """The bound parameters as sent, text or decoded binary, for display (every Bind of the step, in order)."""
    kind: Kind
    """``query`` (a Query), ``extended`` (a cycle ending in Sync), ``flush`` (a prefix ending in Flush),
    ``other`` (a FunctionCall)."""
    data: bytes
    """The raw frontend bytes of the step, forwarded verbatim."""
    prepares_only: bool = False
    """Its messages parse, describe or close and nothing more (asyncpg's Parse/Describe/Flush): nothing is
    planned or run, so no row is read or locked; parsing still locks the tables the SQL names."""


#: A DataRow as it came, with what decodes it: its body, its columns, their formats.
RawRow = tuple[bytes, tuple[wire.Column, ...], tuple[int, ...]]


class Reply:
    """What came back for a step, once it was complete.

    Its rows are decoded when first read, not as they pass: most replies (every one between runs,
    and the proxy's bench) are never looked at, and decoding a hundred rows costs more than relaying them.
    """

    __slots__ = ("_pending", "_rows", "columns", "error", "status", "tags")

    def __init__(
        self,
        tags: tuple[str, ...] = (),
        rows: tuple[tuple[str | None, ...], ...] = (),
        columns: tuple[str, ...] = (),
        error: dict[str, str] | None = None,
        status: bytes | None = None,
        *,
        pending: tuple[RawRow, ...] = (),
    ) -> None:
        self.tags = tags
        self._rows = rows
        self._pending = pending
        self.columns = columns
        """The result's column names."""
        self.error = error
        """ErrorResponse fields by code letter (``C``: the SQLSTATE, ``M``: the message)."""
        self.status = status
        """ReadyForQuery's transaction status, ``b"I"``, ``b"T"`` or ``b"E"``; None for a Flush prefix."""

    @property
    def rows(self) -> tuple[tuple[str | None, ...], ...]:
        """DataRows as text, the first :data:`MAX_ROWS`."""
        if self._pending:
            self._rows, self._pending = tuple(_decoded(row) for row in self._pending), ()
        return self._rows

    def _fields(self) -> tuple[object, ...]:
        return (self.tags, self.rows, self.columns, self.error, self.status)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Reply) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash((self.tags, self.rows, self.columns, self.status))

    def __repr__(self) -> str:
        return "Reply(tags={!r}, rows={!r}, columns={!r}, error={!r}, status={!r})".format(*self._fields())


def _decoded(row: RawRow) -> tuple[str | None, ...]:
    body, columns, formats = row
    return tuple(
        shown(
            value,
            columns[index].type_oid if index < len(columns) else 0,
            wire.format_at(formats, index) == 1,
        )
        for index, value in enumerate(wire.data_row(body))
    )


@dataclass
class Prepared:
    """What the connection knows of a named (or the unnamed) prepared statement, for display."""

    sql: str
    types: tuple[int, ...] = ()
    columns: tuple[wire.Column, ...] = ()


@dataclass
class Memory:
    """A connection's prepared statements and portals: a Bind names a statement parsed steps before."""

    statements: dict[str, Prepared] = field(default_factory=dict)
    portals: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    """Portal name → (its statement's name, the Bind's result formats)."""


@dataclass
class GroupedStep:
    """A step as grouped: its messages, then the Statement the hooks see."""

    messages: list[wire.Message]
    statement: Statement


_EXTENDED = frozenset((b"P", b"B", b"D", b"E", b"C"))
_COPY = frozenset((b"d", b"c", b"f"))
_PREPARING = frozenset((b"P", b"D", b"C", b"H", b"S"))  # Parse, Describe, Close, Flush, Sync: no Bind, no Execute


class Grouper:
    """Frontend messages in, steps out: a step is returned when its last message arrives."""

    def __init__(self, memory: Memory) -> None:
        self.memory = memory
        self._building: list[wire.Message] = []

    @property
    def building(self) -> bool:
        """Whether messages of an unfinished step are waiting for the rest of it."""
        return bool(self._building)

    def add(self, message: wire.Message) -> GroupedStep | None:
        code = message.code
        if code in _EXTENDED:
            self._building.append(message)
            return None
        if code in (b"S", b"H", b"Q", b"F"):
            self._building.append(message)
            messages, self._building = self._building, []
            return GroupedStep(messages, self._statement(messages))
        raise wire.ProtocolViolation(f"invalid frontend message type {code!r}")

    def _statement(self, messages: list[wire.Message]) -> Statement:
        last = messages[-1].code
        kind: Kind = "flush" if last == b"H" else "extended" if last == b"S" else "query" if last == b"Q" else "other"
        parsed: list[str] = []
        executed: list[str] = []
        params: list[str | None] = []
        memory = self.memory
        for message in messages:
            code = message.code
            if code == b"Q":
                executed.append(wire.query_text(message.body))
            elif code == b"P":
                parse = wire.parse_parse(message.body)
                memory.statements[parse.name] = Prepared(parse.sql, parse.types)
                parsed.append(parse.sql)
            elif code == b"B":
                params.extend(self._bind(wire.parse_bind(message.body)))
            elif code == b"E":
                statement_name = memory.portals.get(wire.execute_portal(message.body), ("", ()))[0]
                prepared = memory.statements.get(statement_name)
                executed.append(prepared.sql if prepared else "")
            elif code == b"C":
                target = wire.parse_target(message.body, "Close")
                (memory.statements if target.kind == "S" else memory.portals).pop(target.name, None)
            elif code == b"D":
                wire.parse_target(message.body, "Describe")
        texts = executed or parsed
        unique = [text for index, text in enumerate(texts) if index == 0 or text != texts[index - 1]]
        data = b"".join(message.raw for message in messages)
        prepares_only = bool(parsed) and all(message.code in _PREPARING for message in messages)
        return Statement("; ".join(unique), tuple(params), kind, data, prepares_only)

    def _bind(self, bind: wire.Bind) -> list[str | None]:
        self.memory.portals[bind.portal] = (bind.statement, bind.result_formats)
        prepared = self.memory.statements.get(bind.statement)
        types = prepared.types if prepared else ()
        return [
            shown(value, types[index] if index < len(types) else 0, bind.format_of(index) == 1)
            for index, value in enumerate(bind.values)
        ]


def is_copy(message: wire.Message) -> bool:
    """CopyData, CopyDone, CopyFail: they belong to the running step, never to one of their own."""
    return message.code in _COPY


class Tracker:
    """Reads the server's answer to one running step: whether it is complete, and the Reply.

    A step that ends with Sync, a Query or a FunctionCall is complete at its ReadyForQuery. A
    Flush prefix is complete when every one of its messages has been answered, or at its first
    error: from there the server discards everything until a Sync (``discarding``), so a later
    Flush prefix before that Sync gets no answer at all and is complete once sent.
    """

    def __init__(self, step: GroupedStep, memory: Memory, *, discarding: bool) -> None:
        self.memory = memory
        self.kind = step.statement.kind
        self.discarding = discarding
        self._describing: list[wire.Target] = []
        self._executes: list[str] = []
        self._unanswered = 0
        for message in step.messages:
            code = message.code
            if code == b"D":
                self._describing.append(wire.parse_target(message.body, "Describe"))
            elif code == b"E":
                self._executes.append(wire.execute_portal(message.body))
            if code in _EXTENDED:
                self._unanswered += 1
        self._row_columns: tuple[wire.Column, ...] | None = None
        self._decoder: tuple[tuple[wire.Column, ...], tuple[int, ...]] | None = None
        self.copy_in = False
        """The server waits for the client's COPY data: CopyData, CopyDone, CopyFail go upstream at once."""
        self.extra_sync = False
        """An extended COPY FROM: the server ignored the cycle's Sync during COPY; the client sends another."""
        self._tags: list[str] = []
        self._rows: list[RawRow] = []
        self._columns: tuple[str, ...] = ()
        self._error: dict[str, str] | None = None
        self._status: bytes | None = None
        self.complete = self.kind == "flush" and (self._unanswered == 0 or discarding)

    def reply(self) -> Reply:
        return Reply(tuple(self._tags), (), self._columns, self._error, self._status, pending=tuple(self._rows))

    def feed(self, message: wire.Message) -> bool:
        """Take one server message; True when it completes the step."""
        code = message.code
        if code == b"D":
            self.row(message)
        elif code == b"C":
            self._tags.append(wire.command_tag(message.body))
            self._executed()
        elif code in (b"I", b"s"):
            self._executed()
        elif code == b"T":
            self._describe(wire.row_description(message.body))
        elif code == b"n":
            self._describe(None)
        elif code == b"t" and self._describing:
            prepared = self.memory.statements.get(self._describing[0].name)
            if prepared is not None:
                prepared.types = wire.parameter_types(message.body)
        elif code in (b"1", b"2", b"3"):
            self._answered()
        elif code == b"E":
            if self._error is None:
                self._error = wire.error_fields(message.body)
            self.copy_in = False
            if self.kind == "flush":
                self.discarding = True
                self.complete = True
        elif code == b"G":
            self.copy_in = True
            self.extra_sync = self.kind == "extended"
        elif code == b"Z":
            self._status = message.body[:1]
            self.discarding = False
            self.complete = True
        return self.complete

    def _answered(self) -> None:
        self._unanswered -= 1
        if self.kind == "flush" and self._unanswered <= 0:
            self.complete = True

    def _executed(self) -> None:
        self.copy_in = False
        if self._executes:
            self._executes.pop(0)
        self._row_columns = self._decoder = None
        self._answered()

    def _describe(self, columns: tuple[wire.Column, ...] | None) -> None:
        """A RowDescription or NoData: the statement's columns are remembered for the Executes that follow."""
        target = self._describing.pop(0) if self._describing else None
        self._decoder = None
        name: str | None = None
        if target is None or target.kind == "P":
            self._row_columns = columns  # a Query's, or a portal's: with the formats its rows come in
            if target is not None:
                name = self.memory.portals.get(target.name, ("", ()))[0]
        else:
            name = target.name
        prepared = self.memory.statements.get(name) if name is not None else None
        if prepared is not None:
            prepared.columns = columns or ()
        if columns and not self._columns:
            self._columns = tuple(column.name for column in columns)
        self._answered()

    def row(self, message: wire.Message) -> None:
        """Take one DataRow (what :meth:`feed` does with it: a row never completes a step)."""
        if len(self._rows) < MAX_ROWS:
            decoder = self._decoder
            if decoder is None:
                decoder = self._decoder = self._row_decoder()
            self._rows.append((message.body, *decoder))

    def _row_decoder(self) -> tuple[tuple[wire.Column, ...], tuple[int, ...]]:
        """The columns and formats the current result's rows are decoded with, looked up once per result."""
        columns = self._row_columns
        formats: tuple[int, ...] = ()
        if columns is None and self._executes:
            name, formats = self.memory.portals.get(self._executes[0], ("", ()))
            prepared = self.memory.statements.get(name)
            columns = prepared.columns if prepared else ()
            if columns and not self._columns:
                self._columns = tuple(column.name for column in columns)
        elif columns is not None:
            formats = tuple(column.format for column in columns)
        return columns or (), formats
