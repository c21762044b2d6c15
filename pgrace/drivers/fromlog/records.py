"""Server log records, read from the stderr format (with its ``log_line_prefix``), csvlog and jsonlog.

Logs are big and mostly unrelated to any incident. The file is read once, forward, in large
binary chunks: ``bytes.find`` finds the few phrases that announce an incident (``deadlock
detected``, ``still waiting for``). A stderr log whose prefix has ``%p`` is then read as a
stream (:func:`groups`): each chunk kept while an incident could still need it is indexed
once by process (one regular expression over the chunk, in C), and only the lines of the
processes an incident's report names are parsed. Other formats are parsed line by line
around each hit (:func:`window`), after a first pass (:func:`scan`).
"""

from __future__ import annotations

import bisect
import csv
import io
import json
import os
import re
import stat
from array import array
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate, compress
from typing import BinaryIO, Protocol

from pgrace.drivers.fromlog.prefix import Prefix, detect_prefix
from pgrace.errors import ScenarioError

__all__ = [
    "Group",
    "Hit",
    "LogFormat",
    "Record",
    "Window",
    "around",
    "groups",
    "open_log",
    "open_regular",
    "scan",
    "window",
]

#: Bytes read at a time: large enough that the per-chunk Python work is noise.
CHUNK = 4 << 20
#: How much log before a hit is parsed for the incident's transactions, and after it; and
#: how far ahead later hits share the parse of an earlier one.
BACK = 4 << 20
AHEAD = 1 << 20
SPAN = 2 << 20
#: Phrases PostgreSQL writes (untranslated, lc_messages C or English) when an incident happens.
MARKERS = (b"deadlock detected", b"still waiting for")
_SECONDARY = frozenset({"DETAIL", "HINT", "CONTEXT", "STATEMENT", "QUERY", "LOCATION"})
#: How gzip, xz and zstd files start: logs rotated and compressed by logrotate.
_COMPRESSED = (b"\x1f\x8b", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd")
_CSV_COLUMNS = 23  # csvlog has had at least these since PostgreSQL 13 (application_name is the 23rd)


@dataclass(slots=True)
class Record:
    """One log message with the fields an incident needs (``None``: the log does not say)."""

    line: int
    severity: str
    message: str
    pid: int | None = None
    app: str | None = None
    vxid: str | None = None
    xid: str | None = None
    database: str | None = None
    user: str | None = None
    time: str | None = None
    sqlstate: str | None = None
    detail: str = ""
    hint: str = ""
    context: str = ""
    statement: str = ""


@dataclass(frozen=True)
class LogFormat:
    """How a file's records are written: ``stderr`` with its prefix, ``csvlog`` or ``jsonlog``."""

    kind: str
    prefix: Prefix | None = None

    @property
    def fields(self) -> frozenset[str]:
        """Which of ``a`` (application), ``v`` (virtual xid), ``x`` (xid), ``p`` (pid) the log carries."""
        if self.prefix is not None:
            return self.prefix.fields
        return frozenset({"a", "v", "x", "p", "u", "d", "m"})


@dataclass
class Hit:
    """Where a marker phrase was found: the byte offset of its line, and the line's number."""

    offset: int
    line: int


@dataclass
class Scanned:
    """What one pass over a file found: the hits, and how many lines it has."""

    hits: list[Hit] = field(default_factory=list)
    lines: int = 0
    size: int = 0


_CSV_START = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?(?: [A-Za-z0-9+:-]+)?,")


def _looks_csv(line: str) -> bool:
    """A csvlog record starts with its timestamp, then a comma (a stderr prefix has no comma there)."""
    return _CSV_START.match(line) is not None


def open_regular(path: str) -> BinaryIO:
    """``path`` opened for reading, refused unless what was opened is a regular file.

    A pipe or a device (/dev/zero) may never end, and a log is opened more than once (its
    head, the pass over it, the stretch around the incident written): each opening is checked, never the path
    beforehand, which could be replaced by a FIFO in between. ``O_NONBLOCK`` makes opening a
    FIFO that has no writer return at once instead of waiting for one.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise ScenarioError(f"cannot read: {exc.strerror or exc}", path) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ScenarioError("not a regular file: a log is read from a file", path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_log(path: str, given_prefix: str | None) -> LogFormat:
    """Tell a file's format from its first lines; a stderr log's prefix is the given one or detected.

    Invalid input (not a log, a binary file, a prefix that does not match) is one
    :class:`ScenarioError` naming the file and, where there is one, the line.
    """
    with open_regular(path) as f:
        try:
            head = f.read(64 << 10)
        except OSError as exc:
            raise ScenarioError(f"cannot read: {exc.strerror or exc}", path) from None
    if not head:
        raise ScenarioError("empty file: no server log to read", path)
    if head.startswith(_COMPRESSED):
        raise ScenarioError("a compressed file, not a server log: decompress it first (zcat, xzcat, zstdcat)", path)
    if b"\0" in head:
        nul = head.index(b"\0")
        raise ScenarioError("a binary file, not a server log (a NUL byte)", path, head.count(b"\n", 0, nul) + 1)
    text = head.decode("utf-8", errors="replace")
    lines = [ln for ln in text.split("\n")[:200] if ln and not ln.startswith("\t")]
    if len(head) == 64 << 10 and len(lines) > 1:
        lines = lines[:-1]  # the last may be cut by the read, not by the server
    if lines and lines[0].startswith("{"):
        try:
            json.loads(lines[0])
        except ValueError:
            raise ScenarioError("starts like a jsonlog file but its first line is not JSON", path, 1) from None
        except RecursionError:
            raise ScenarioError(_TOO_DEEP, path, 1) from None
        return LogFormat("jsonlog")
    if lines and _looks_csv(lines[0]) and given_prefix is None:
        return LogFormat("csvlog")
    if given_prefix is not None:
        prefix = Prefix.compile(given_prefix)
        matched = [i for i, line in enumerate(lines) if prefix.match(line)]
        if len(matched) * 2 < len(lines):
            first = next(i for i, line in enumerate(lines) if not prefix.match(line))
            raise ScenarioError(
                f"line does not start with the log_line_prefix {given_prefix!r} then a severity "
                f"({len(lines) - len(matched)} of the first {len(lines)} lines do not)",
                path,
                text.split("\n").index(lines[first]) + 1,
            )
        return LogFormat("stderr", prefix)
    detected = detect_prefix(lines)
    if detected is None:
        raise ScenarioError(
            "not a PostgreSQL log pgrace can read: its lines match no common log_line_prefix "
            "(give it with --prefix, or use csvlog or jsonlog)",
            path,
            1,
        )
    return LogFormat("stderr", detected[0])


def scan(path: str) -> Scanned:
    """Stream the file once: every line holding a marker phrase, and the line count.

    A NUL byte anywhere means it is not a text log: invalid input, at its line.
    """
    out = Scanned()
    lines = 0
    offset = 0
    carry = b""
    with open_regular(path) as f:
        left = os.fstat(f.fileno()).st_size  # a live server's log grows: read what it held when opened
        while left > 0:
            block = f.read(min(CHUNK, left))
            if not block:
                break
            left -= len(block)
            chunk = carry + block if carry else block
            end = chunk.rfind(b"\n") + 1
            if end == 0 and len(chunk) < 4 * CHUNK:
                carry = chunk
                continue
            if end == 0:
                end = len(chunk)  # one enormous line: scanned as it is
            carry = chunk[end:]
            _scan_chunk(chunk, end, offset, lines, out, path)
            lines += chunk.count(b"\n", 0, end)
            offset += end
        if carry:
            _scan_chunk(carry, len(carry), offset, lines, out, path)
            lines += 1
            offset += len(carry)
    out.lines = lines
    out.size = offset
    return out


def _scan_chunk(chunk: bytes, end: int, base: int, lines: int, out: Scanned, path: str) -> None:
    nul = chunk.find(b"\0", 0, end)
    if nul >= 0:
        raise ScenarioError(
            "a binary file, not a server log (a NUL byte)", path, lines + chunk.count(b"\n", 0, nul) + 1
        )
    found: list[int] = []
    for marker in MARKERS:
        pos = chunk.find(marker, 0, end)
        while pos >= 0:
            found.append(chunk.rfind(b"\n", 0, pos) + 1)
            newline = chunk.find(b"\n", pos, end)
            pos = chunk.find(marker, newline, end) if newline >= 0 else -1
    last_start, last_line = 0, lines + 1
    for start in sorted(set(found)):
        last_line += chunk.count(b"\n", last_start, start)
        last_start = start
        out.hits.append(Hit(base + start, last_line))


@dataclass
class Window:
    """The records of a stretch of log (bytes ``start`` to ``end``), and how many lines in it were not records."""

    records: list[Record]
    skipped: int
    start: int
    end: int

    def covers(self, hit: Hit) -> bool:
        """Whether ``hit`` has enough log after it in this window to be read from it, instead of a new one."""
        return self.start <= hit.offset and hit.offset + AHEAD // 2 <= self.end


def window(path: str, fmt: LogFormat, hit: Hit, until: int = 0) -> Window:
    """The records logged around ``hit`` (``BACK`` bytes before, ``AHEAD`` after it or ``until``), lines skipped.

    ``until`` is the offset of a later hit the same parse should serve: hits close together
    are read in one window, so that each byte of a log dense with incidents is parsed about
    twice, not ``BACK / AHEAD`` times. A skipped line is one that is not a record of the
    file's format: cut short, or another program's output mixed in.
    """
    start = max(0, hit.offset - BACK)
    want = max(hit.offset, until) - start + AHEAD
    with open_regular(path) as f:
        f.seek(start)
        data = f.read(want)
    eof = len(data) < want  # the whole rest of the file is in this window
    if start > 0:
        cut = data.find(b"\n") + 1
        data, start = data[cut:], start + cut
    if not eof and len(data) > hit.offset - start + 1:
        last = data.rfind(b"\n")
        if last > hit.offset - start:
            data = data[: last + 1]
    first_line = hit.line - data.count(b"\n", 0, hit.offset - start)
    text = data.decode("utf-8", errors="replace")
    if fmt.kind == "jsonlog":
        records, skipped = _json_records(text, first_line, path)
    elif fmt.kind == "csvlog":
        records, skipped = _csv_records(text, first_line)
    else:
        assert fmt.prefix is not None
        lines = (ln[:-1] if ln.endswith("\n") else ln for ln in io.StringIO(text, newline="\n"))
        numbered = enumerate(lines, first_line)
        records, skipped = _stderr_records(numbered, fmt.prefix)
    end = start + len(data)
    return Window(records, skipped, start, end + AHEAD if eof else end)


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
    stream.blocks.append(_Block(start, hit.line - data.count(b"\n", 0, hit.offset - start), data, eof))
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
    """A pattern matching each line once, capturing its ``%p`` when it starts with the prefix up to it.

    None when the log cannot be read by process: not the stderr format, no ``%p``, or
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
            return re.compile((r"(?:(?!\t)" + body + r")?[^\n]*\n").encode())
        i = j + 1
    return None


class _Block:
    """A piece of the file read at once, whole lines (its last may run on in the next piece if it has no newline).

    Indexed once when first needed: its lines, and the process of each (``b""``: none, a
    tab-continued line, or not a record); where each line starts only if a bound falls in it.
    """

    __slots__ = ("count", "data", "first_line", "lines", "offset", "pids", "present", "size", "starts")

    def __init__(self, offset: int, first_line: int, data: bytes, eof: bool) -> None:
        self.offset = offset
        self.first_line = first_line
        self.data = data
        self.size = len(data)
        self.count = data.count(b"\n") + (eof and bool(data) and not data.endswith(b"\n"))
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
        self.pids = pattern.findall(data if data.endswith(b"\n") else data + b"\n")[: self.count]
        self.lines = data.split(b"\n")[: self.count]
        self.present = set(self.pids)
        self.data = b""  # its lines hold it now
        tabs = data.count(b"\n\t") + data.startswith(b"\t")
        return self.pids.count(b"") - self.lines.count(b"") - tabs

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
                    _scan_chunk(piece, len(piece), offset, lines, found, self.path)
                    read = _Block(offset, lines + 1, piece, eof)
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
        return self._indexed(at[0])[at[1]] if at is not None else b""

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
        reach = min(stream.line_from(hit.offset + AHEAD), hit.line + REPORT_REACH)
        lines = stream.next_of(pid, hit.line, reach, REPORT_LINES)
        return _stderr_records(stream.numbered(lines), stream.prefix)[0]

    def window(self, pids: set[int], before: int, after: int) -> Window:
        stream = self.stream
        first, last = self.hits[0], self.hits[-1]
        lo, hi = stream.line_from(first.offset - BACK), stream.line_from(last.offset + AHEAD)
        chosen: list[int] = []
        for lines in stream.lines_of({b"%d" % p for p in pids}, lo, hi).values():
            a, b = bisect.bisect_left(lines, first.line), bisect.bisect_right(lines, last.line)
            chosen += lines[max(0, a - before * LINES_PER_RECORD) : b + after * LINES_PER_RECORD]
        chosen.sort()
        records, _ = _stderr_records(stream.numbered(chosen), stream.prefix)
        skipped, stream.skipped = stream.skipped, 0
        return Window(records, skipped, max(0, first.offset - BACK), last.offset + AHEAD)


def _stderr_records(numbered: Iterable[tuple[int, str]], prefix: Prefix) -> tuple[list[Record], int]:
    """The records of ``numbered`` lines (their number, their text without the newline), and how many were not records.

    The lines need not be consecutive: a stream gives only the lines of the processes an
    incident names, each followed by its tab-continued lines.
    """
    records: list[Record] = []
    skipped = 0
    last: Record | None = None
    last_field = "message"
    more: list[str] = []  # the tab-continued lines of last's last_field, joined once: appending to a str is quadratic
    by_pid: dict[int | None, Record] = {}

    def flush() -> None:
        if more and last is not None and last_field:
            setattr(last, last_field, "\n".join([getattr(last, last_field), *more]))
        more.clear()

    for lineno, line in numbered:  # one line at a time: a list of a million short lines is 60 MB
        if line.startswith("\t"):
            if last is not None:
                more.append(line[1:])
            continue
        m = prefix.match(line)
        if m is None:
            if line:
                skipped += 1
            continue
        flush()
        groups = m.groupdict()
        pid = int(groups["p"]) if groups.get("p") else None
        severity = groups["sev"]
        message = line[m.end() :]
        if severity in _SECONDARY:
            target = by_pid.get(pid, last) if pid is not None else last
            if target is not None:
                last_field = severity.lower() if severity != "QUERY" else "statement"
                if last_field == "location":
                    last, last_field = target, ""  # its continuation lines, if any, belong to no field
                    continue
                setattr(target, last_field, message)
                last = target
            continue
        record = Record(
            lineno,
            severity,
            message,
            pid=pid,
            app=groups.get("a"),
            vxid=groups.get("v"),
            xid=groups.get("x"),
            database=groups.get("d"),
            user=groups.get("u"),
            time=groups.get("m") or groups.get("t"),
        )
        records.append(record)
        by_pid[pid] = record
        last, last_field = record, "message"
    flush()
    return records, skipped


def _csv_records(text: str, first_line: int) -> tuple[list[Record], int]:
    records: list[Record] = []
    skipped = 0
    # Start at a record: the window may begin inside a multi-line field.
    lines = text.split("\n")
    begin = next((i for i, ln in enumerate(lines) if _looks_csv(ln)), len(lines))
    reader = csv.reader(io.StringIO("\n".join(lines[begin:])))
    line = first_line + begin
    while True:
        at = reader.line_num
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error:
            skipped += 1
            continue
        lineno = line + at
        if len(row) < _CSV_COLUMNS or not (row[3].isdigit() and len(row[3]) <= 10):
            skipped += bool(row)
            continue
        records.append(
            Record(
                lineno,
                row[11],
                row[13],
                pid=int(row[3]),
                app=row[22],
                vxid=row[9],
                xid=row[10],
                database=row[2],
                user=row[1],
                time=row[0],
                sqlstate=row[12],
                detail=row[14],
                hint=row[15],
                context=row[18],
                statement=row[19],
            )
        )
    return records, skipped


#: jsonlog writes one flat object a line; JSON nested deeper than Python's decoder recurses is not the server's.
_TOO_DEEP = "a JSON value nested too deep to be a jsonlog record (the server writes one flat object a line)"
_SURROGATE = re.compile("[\ud800-\udfff]")


def _json_text(value: object) -> str | None:
    """A jsonlog field as text: None when absent or not a string or number (the file is not the server's).

    JSON can spell a lone surrogate (``\\ud800``), which no UTF-8 file holds: it is U+FFFD.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    return _SURROGATE.sub("\ufffd", str(value))


def _json_records(text: str, first_line: int, path: str) -> tuple[list[Record], int]:
    records: list[Record] = []
    skipped = 0
    for n, line in enumerate(text.split("\n")):
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        except RecursionError:
            raise ScenarioError(_TOO_DEEP, path, first_line + n) from None
        if not isinstance(obj, dict) or (message := _json_text(obj.get("message"))) is None:
            skipped += 1
            continue
        pid = obj.get("pid")
        records.append(
            Record(
                first_line + n,
                _json_text(obj.get("error_severity")) or "",
                message,
                pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
                app=_json_text(obj.get("application_name")),
                vxid=_json_text(obj.get("vxid")),
                xid=_json_text(obj.get("txid")),
                database=_json_text(obj.get("dbname")),
                user=_json_text(obj.get("user")),
                time=_json_text(obj.get("timestamp")),
                sqlstate=_json_text(obj.get("state_code")),
                detail=_json_text(obj.get("detail")) or "",
                hint=_json_text(obj.get("hint")) or "",
                context=_json_text(obj.get("context")) or "",
                statement=_json_text(obj.get("statement")) or "",
            )
        )
    return records, skipped
