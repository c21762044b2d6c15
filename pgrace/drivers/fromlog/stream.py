"""Reading a stderr log as one forward stream: only the lines of the processes an incident names are parsed.

Each chunk kept while an incident could still need it is indexed once by process (one regular
expression over the chunk, in C); for each group of nearby reports, the report's own lines say
which processes it names, and only those processes' lines in the window are parsed. Logs whose
prefix has no ``%p``, csvlog and jsonlog are read around each hit instead (:func:`records.window`).
"""

from __future__ import annotations

import bisect
import os
import re
from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate, compress
from typing import Protocol

from pgrace.drivers.fromlog.prefix import PID, Prefix
from pgrace.drivers.fromlog.records import (
    AHEAD,
    BACK,
    CHUNK,
    SPAN,
    Hit,
    LogFormat,
    Record,
    Scanned,
    Window,
    open_regular,
    scan,
    scan_chunk,
    stderr_records,
    window,
)

__all__ = ["Group", "around", "groups"]


class Group(Protocol):
    """Hits close together, read together: each hit's report first, then the records of the processes they name."""

    hits: list[Hit]

    def report(self, hit: Hit) -> list[Record] | None:
        """The first records of the process that logged ``hit``, from its line on; None: every process may matter."""

    def window(self, pids: set[int], before: int, after: int) -> Window:
        """The records of ``pids`` near the hits: ``before`` of each before the first, ``after`` after the last."""


def groups(path: str, fmt: LogFormat, out: Scanned) -> Iterator[Group]:
    """The file's hits in groups that share one read, in log order; ``out`` has the line count once they are all given.

    A stderr log whose prefix has ``%p`` is streamed: one forward pass that keeps the few
    MiB an incident may need. Other formats are scanned, then read around each group.
    """
    pattern = _pid_pattern(fmt)
    if pattern is None:
        scanned = scan(path)
        out.lines, out.size = scanned.lines, scanned.size
        yield from _windowed(path, fmt, scanned.hits)
        return
    yield from _Stream(path, fmt, pattern).groups(out)


def around(path: str, fmt: LogFormat, hit: Hit) -> Group:
    """The one-hit group of ``hit``, read from the stretch of log around it only."""
    pattern = _pid_pattern(fmt)
    if pattern is None:
        return _Whole([hit], window(path, fmt, hit))
    start = max(0, hit.offset - BACK)
    want = hit.offset - start + AHEAD
    with open_regular(path) as f:
        f.seek(start)
        data = f.read(want)
    eof = len(data) < want
    if start > 0:
        cut = data.find(b"\n") + 1
        data, start = data[cut:], start + cut
    if not eof:
        data = data[: max(data.rfind(b"\n") + 1, hit.offset - start)]
    stream = _Stream(path, fmt, pattern)
    count = data.count(b"\n") + (eof and bool(data) and not data.endswith(b"\n"))
    stream.blocks.append(_Block(start, hit.line - data.count(b"\n", 0, hit.offset - start), data, count))
    return _Near(stream, [hit])


@dataclass
class _Whole:
    """Hits that share one window, parsed whole: every process's records (csvlog, jsonlog, a prefix without %p)."""

    hits: list[Hit]
    read: Window

    def report(self, hit: Hit) -> list[Record] | None:
        return None

    def window(self, pids: set[int], before: int, after: int) -> Window:
        return self.read


def _windowed(path: str, fmt: LogFormat, hits: list[Hit]) -> Iterator[Group]:
    """Hits grouped by the window that covers them: a hit beyond the last window starts the next, ``SPAN`` wide."""
    offsets = [hit.offset for hit in hits]
    at = 0
    while at < len(hits):
        last = bisect.bisect_right(offsets, hits[at].offset + SPAN, lo=at) - 1
        read = window(path, fmt, hits[at], offsets[last])
        members = [hits[at]]
        at += 1
        while at < len(hits) and read.covers(hits[at]):
            members.append(hits[at])
            at += 1
        yield _Whole(members, read)
        del read  # the last window's records go before the next is read


#: Lines of one process read for each record wanted: a record is its line and at most six
#: more of the same process (DETAIL, HINT, CONTEXT, STATEMENT, QUERY, LOCATION).
LINES_PER_RECORD = 7


def _pid_pattern(fmt: LogFormat) -> re.Pattern[bytes] | None:
    """A pattern matching at each newline once, capturing what starts the line after it.

    That is the line's ``%p`` when it starts with the prefix up to it, a tab when it is a
    continuation line, else nothing. Each match starts at a newline, which the search finds
    at C speed, and ends where the line's process is known: the rest of the line is never
    stepped through. None when the log cannot be read by process: not the stderr format, no ``%p``, or
    ``%p`` after ``%q`` (a line of a background process has none).
    """
    prefix = fmt.prefix
    if fmt.kind != "stderr" or prefix is None or "p" not in prefix.fields:
        return None
    template = prefix.template
    i = 0
    while i < len(template):
        if template[i] != "%" or i + 1 == len(template):
            i += 1
            continue
        j = i + 1
        while j < len(template) and (template[j].isdigit() or template[j] == "-"):
            j += 1
        escape = template[j] if j < len(template) else ""
        if escape == "q":
            return None
        if escape == "p":
            end = template.find("%", j + 1)  # the literal text after %p closes the number: "[%p]"
            head = Prefix.compile(template[: len(template) if end < 0 else end]).pattern.pattern
            severity = Prefix.compile("").pattern.pattern
            body = re.sub(r"\(\?P<(\w+)>", lambda m: "(" if m.group(1) == "p" else "(?:", head[: -len(severity)])
            before, pid, after = body.partition(f"({PID})")
            assert pid, body
            return re.compile((rf"\n(?:(?:(?!\t){before}|(?=\t))(\t|{PID}(?={after})))?").encode())
        i = j + 1
    return None


class _Block:
    """A piece of the file read at once, whole lines (its last may run on in the next piece if it has no newline).

    Indexed once when first needed: its lines, and the process of each (``b"\t"``: a
    tab-continued line; ``b""``: not a record); where each line starts only if a bound falls in it.
    """

    __slots__ = ("count", "data", "first_line", "lines", "offset", "pids", "present", "size", "starts")

    def __init__(self, offset: int, first_line: int, data: bytes, count: int) -> None:
        self.offset = offset
        self.first_line = first_line
        self.data = data
        self.size = len(data)
        self.count = count
        self.lines: list[bytes] = []
        self.pids: list[bytes] | None = None
        self.present: set[bytes] = set()
        self.starts: array[int] | None = None

    @property
    def end(self) -> int:
        return self.offset + self.size

    def index(self, pattern: re.Pattern[bytes]) -> int:
        """Index the block (once); how many of its lines are not records (0 when it was indexed already)."""
        if self.pids is not None:
            return 0
        data = self.data
        # Each newline's match tells the line after it: the first line's is matched alone, the last newline's dropped.
        of = pattern.findall(b"\n" + data[: data.find(b"\n") + 1 or len(data)])[: min(1, self.count)]
        of += pattern.findall(data)[: self.count - 1]
        self.lines = data.split(b"\n")[: self.count]
        self.data = b""  # its lines hold it now
        unknown = of.count(b"")
        self.pids = of
        self.present = set(of)
        self.present.discard(b"\t")
        return unknown and unknown - self.lines.count(b"")

    def start(self, i: int) -> int:
        """Where line ``i`` starts in the block."""
        if self.starts is None:
            self.starts = array("q", accumulate(map(len, self.lines), initial=0))  # line i starts at starts[i] + i
        return self.starts[i] + i

    def line_from(self, offset: int) -> int:
        """The first line that starts at ``offset`` or after it (``count``: none)."""
        if offset <= self.offset:
            return 0
        return bisect.bisect_left(range(self.count), offset - self.offset, key=self.start)


class _Stream:
    """One forward pass over a stderr log with ``%p``: the blocks an incident may still need, indexed by process."""

    def __init__(self, path: str, fmt: LogFormat, pattern: re.Pattern[bytes]) -> None:
        assert fmt.prefix is not None
        self.path = path
        self.prefix = fmt.prefix
        self.pattern = pattern
        self.blocks: deque[_Block] = deque()
        self.skipped = 0

    def groups(self, out: Scanned) -> Iterator[Group]:
        pending: deque[Hit] = deque()
        lines = offset = 0
        carry = b""
        with open_regular(self.path) as f:
            left = os.fstat(f.fileno()).st_size  # a live server's log grows: read what it held when opened
            while True:
                block = f.read(min(CHUNK, left)) if left > 0 else b""
                left -= len(block)
                eof = not block
                chunk = carry + block if carry else block
                end = chunk.rfind(b"\n") + 1
                if not eof and end == 0 and len(chunk) < 4 * CHUNK:
                    carry = chunk
                    continue
                if eof or end == 0:
                    end = len(chunk)  # the last line, or one enormous line: read as it is
                piece, carry = chunk[:end], chunk[end:]
                if piece:
                    found = Scanned()
                    newlines = scan_chunk(piece, len(piece), offset, lines, found, self.path)
                    read = _Block(offset, lines + 1, piece, newlines + (eof and not piece.endswith(b"\n")))
                    self.blocks.append(read)
                    pending.extend(found.hits)
                    lines += read.count
                    offset += len(piece)
                yield from self._ready(pending, offset, eof)
                if eof:
                    break
        out.lines, out.size = lines, offset

    def _ready(self, pending: deque[Hit], read: int, eof: bool) -> Iterator[Group]:
        """The groups whose hits are all known and the log after them read; then the blocks no later one needs go."""
        while pending and (eof or pending[0].offset + SPAN + AHEAD <= read):
            first = pending[0].offset
            hits = []
            while pending and pending[0].offset <= first + SPAN:
                hits.append(pending.popleft())
            yield _Near(self, hits)
        need = (pending[0].offset if pending else read) - BACK
        while self.blocks and self.blocks[0].end <= need:
            self.blocks.popleft()

    def _indexed(self, block: _Block) -> list[bytes]:
        self.skipped += block.index(self.pattern)
        assert block.pids is not None
        return block.pids

    def line_from(self, offset: int) -> int:
        """The number of the first line kept that starts at ``offset`` or after it."""
        for block in self.blocks:
            if offset < block.end:
                self._indexed(block)
                return block.first_line + block.line_from(offset)
        return self.blocks[-1].first_line + self.blocks[-1].count if self.blocks else 1

    def _at(self, line: int) -> tuple[_Block, int] | None:
        """The block that holds ``line``, indexed, and the line's place in it."""
        for block in self.blocks:
            if block.first_line <= line < block.first_line + block.count:
                self._indexed(block)
                return block, line - block.first_line
        return None

    def pid_at(self, line: int) -> bytes:
        """The process that logged ``line`` (``b""``: not a record)."""
        at = self._at(line)
        pid = self._indexed(at[0])[at[1]] if at is not None else b""
        return b"" if pid == b"\t" else pid

    def lines_of(self, pids: set[bytes], lo: int, hi: int) -> dict[bytes, list[int]]:
        """The numbers of the lines of ``pids`` from line ``lo`` up to (not including) ``hi``, by process."""
        out: dict[bytes, list[int]] = {}
        for block in self.blocks:
            first = block.first_line
            if first + block.count <= lo or first >= hi:
                continue
            of = self._indexed(block)
            present = pids & block.present
            if not present:
                continue
            i, j = max(lo - first, 0), min(hi - first, block.count)
            for at in compress(range(i, j), map(present.__contains__, of[i:j])):
                out.setdefault(of[at], []).append(first + at)
        return out

    def next_of(self, pid: bytes, lo: int, hi: int, count: int) -> list[int]:
        """The numbers of the first ``count`` lines of ``pid`` from line ``lo`` up to (not including) ``hi``."""
        out: list[int] = []
        for block in self.blocks:
            first = block.first_line
            if first + block.count <= lo or first >= hi:
                continue
            of = self._indexed(block)
            at, end = max(lo - first, 0), min(hi - first, block.count)
            while len(out) < count:
                try:
                    at = of.index(pid, at, end)  # a list's own search: the next line of pid is usually close
                except ValueError:
                    break
                out.append(first + at)
                at += 1
        return out

    def numbered(self, chosen: list[int]) -> Iterator[tuple[int, str]]:
        """Lines ``chosen`` (numbers, ascending), each followed by its tab-continued lines, as text."""
        block: _Block | None = None
        for number in chosen:
            if block is None or not block.first_line <= number < block.first_line + block.count:
                at = self._at(number)
                if at is None:
                    continue
                block = at[0]
            i = number - block.first_line
            yield number, block.lines[i].decode("utf-8", errors="replace")
            while True:
                number += 1
                i += 1
                if i == block.count:
                    following = self._at(number)
                    if following is None:
                        break
                    block, i = following
                if not block.lines[i].startswith(b"\t"):
                    break
                yield number, block.lines[i].decode("utf-8", errors="replace")


#: How many of its first lines a report may take: its own, and its DETAIL, HINT, CONTEXT, STATEMENT.
REPORT_LINES = LINES_PER_RECORD + 1
#: How far after its first line those are looked for, in lines: a process writes a message's lines at
#: once, so others' lines between them are few however busy the server.
REPORT_REACH = 1_000


@dataclass
class _Near:
    """Hits of a stream close together: only the lines of the processes their reports name are parsed."""

    stream: _Stream
    hits: list[Hit]

    def report(self, hit: Hit) -> list[Record] | None:
        stream = self.stream
        pid = stream.pid_at(hit.line)
        if not pid:
            return []  # not a record's line: no report starts there
        lines = stream.next_of(pid, hit.line, hit.line + REPORT_REACH, REPORT_LINES)
        return stderr_records(stream.numbered(lines), stream.prefix)[0]

    def window(self, pids: set[int], before: int, after: int) -> Window:
        stream = self.stream
        first, last = self.hits[0], self.hits[-1]
        lo, hi = stream.line_from(first.offset - BACK), stream.line_from(last.offset + AHEAD)
        chosen: list[int] = []
        for lines in stream.lines_of({b"%d" % p for p in pids}, lo, hi).values():
            a, b = bisect.bisect_left(lines, first.line), bisect.bisect_right(lines, last.line)
            chosen += lines[max(0, a - before * LINES_PER_RECORD) : b + after * LINES_PER_RECORD]
        chosen.sort()
        records, _ = stderr_records(stream.numbered(chosen), stream.prefix)
        skipped, stream.skipped = stream.skipped, 0
        return Window(records, skipped, max(0, first.offset - BACK), last.offset + AHEAD)
