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

import csv
import io
import json
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import BinaryIO

from pgrace.drivers.fromlog.prefix import Prefix, detect_prefix
from pgrace.errors import ScenarioError

__all__ = [
    "Hit",
    "LogFormat",
    "Record",
    "Window",
    "open_log",
    "open_regular",
    "scan",
    "scan_chunk",
    "stderr_records",
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
            "(give it as the prefix, or use csvlog or jsonlog)",
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
            lines += scan_chunk(chunk, end, offset, lines, out, path)
            offset += end
        if carry:
            scan_chunk(carry, len(carry), offset, lines, out, path)
            lines += 1
            offset += len(carry)
    out.lines = lines
    out.size = offset
    return out


def scan_chunk(chunk: bytes, end: int, base: int, lines: int, out: Scanned, path: str) -> int:
    """Add the hits of ``chunk[:end]`` (at ``base`` in the file, after ``lines`` lines) to ``out``; its newlines.

    The newlines are counted once, from hit to hit, and on to the end.
    """
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
    return last_line - lines - 1 + chunk.count(b"\n", last_start, end)


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
        records, skipped = stderr_records(numbered, fmt.prefix)
    end = start + len(data)
    return Window(records, skipped, start, end + AHEAD if eof else end)


def stderr_records(numbered: Iterable[tuple[int, str]], prefix: Prefix) -> tuple[list[Record], int]:
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

    match = prefix.pattern.match
    has_pid = "p" in prefix.fields
    for lineno, line in numbered:  # one line at a time: a list of a million short lines is 60 MB
        if line[:1] == "\t":
            if last is not None:
                more.append(line[1:])
            continue
        m = match(line)
        if m is None:
            if line:
                skipped += 1
            continue
        if more:
            flush()
        number = m["p"] if has_pid else None
        pid = int(number) if number else None
        severity = m["sev"]
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
        get = m.groupdict().get
        # In the order of Record's fields: positional arguments are the cheaper call, once a record.
        record = Record(
            lineno, severity, message, pid, get("a"), get("v"), get("x"), get("d"), get("u"), get("m") or get("t")
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
