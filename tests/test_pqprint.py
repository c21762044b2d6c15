"""libpq PQprint emulation: the rules of ISOLATIONTESTER.md §3.3, and the corpus tables."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from corpus import CORPUS, needs_corpus

from pgrace.model.timeline import ResultSet
from pgrace.render.isolation import pqprint


def table(columns: tuple[str, ...], *rows: tuple[str | None, ...]) -> ResultSet:
    return ResultSet(columns=columns, text_rows=tuple(rows))


def test_numeric_columns_are_right_aligned() -> None:
    assert pqprint(table(("key", "value"), ("1", "1"))) == ("key|value\n---+-----\n  1|    1\n(1 row)\n\n")


def test_text_column_is_left_aligned_and_last_column_padded() -> None:
    result = table(("key", "val"), ("1", "donothing1"))
    assert pqprint(result) == "key|val       \n---+----------\n  1|donothing1\n(1 row)\n\n"
    result = table(("id", "data", "status"), ("1", "foo", "NEW"))
    assert pqprint(result) == ("id|data|status\n--+----+------\n 1|foo |NEW   \n(1 row)\n\n")


def test_void_result_prints_spaces() -> None:
    result = table(("pg_advisory_lock",), ("",))
    assert pqprint(result) == ("pg_advisory_lock\n----------------\n                \n(1 row)\n\n")


def test_null_prints_like_empty_and_keeps_separators() -> None:
    result = table(("pg_advisory_lock", "sess", "lock"), (None, "1", "1"))
    assert pqprint(result) == (
        "pg_advisory_lock|sess|lock\n----------------+----+----\n                |   1|   1\n(1 row)\n\n"
    )


def test_zero_rows() -> None:
    assert pqprint(table(("id",))) == "id\n--\n(0 rows)\n\n"


def test_plural_footer() -> None:
    assert pqprint(table(("n",), ("1",), ("2",))).endswith("(2 rows)\n\n")


def test_zero_columns_print_nothing() -> None:
    assert pqprint(table((), (), ())) == ""


@pytest.mark.parametrize(
    ("values", "numeric"),
    [
        (("1", "-2.5", "1e10", " 3"), True),
        (("1.5E3",), True),
        (("E5",), False),  # starts with E
        (("e5",), False),
        (("5-",), True),  # only the characters and the last digit are checked
        (("5.",), False),  # ends with a non-digit
        (("1", "t"), False),
        (("0x1",), False),
        (("", None), True),  # empty and NULL are skipped
        (("1 2",), True),
    ],
)
def test_numeric_rule(values: tuple[str | None, ...], numeric: bool) -> None:
    result = table(("column",), *((v,) for v in values))
    name_line = pqprint(result).splitlines()[0]
    width = max(len(v or "") for v in (*values, "column"))
    assert name_line == ("column".rjust(width) if numeric else "column".ljust(width))


def test_width_counts_bytes_not_characters() -> None:
    # "é" is two bytes in UTF-8, "⨝" three: libpq pads by strlen().
    result = table(("name", "n"), ("é", "1"), ("⨝", "22"))
    assert pqprint(result) == ("name| n\n----+--\né  | 1\n⨝ |22\n(2 rows)\n\n")
    # A column name wider in bytes than in characters sets the width too.
    assert pqprint(table(("ñññ",), ("x",))) == "ñññ\n------\nx     \n(1 row)\n\n"


def test_non_ascii_value_is_not_numeric() -> None:
    assert pqprint(table(("n",), ("1½",))).splitlines()[2] == "1½"


# -- every table of the corpus expected files ------------------------------------------

BORDER = re.compile(r"^-+(\+-+)*$")
FOOTER = re.compile(r"^\((\d+) rows?\)$")


@dataclass
class CorpusTable:
    where: str
    text: str
    widths: list[int]
    lines: list[str]  # header and data lines, without the border


def corpus_tables() -> list[CorpusTable]:
    found = []
    for path in sorted((CORPUS / "expected").glob("*.out")):
        lines = path.read_text(encoding="utf-8").split("\n")
        for i, border in enumerate(lines):
            if i == 0 or not BORDER.match(border):
                continue
            header = lines[i - 1]
            if len(header.encode()) != len(border):
                continue
            end = i + 1
            while end < len(lines) and not FOOTER.match(lines[end]):
                end += 1
            assert end < len(lines) and lines[end + 1] == "", f"{path.name}:{i}"
            text = "\n".join(lines[i - 1 : end + 2]) + "\n"
            widths = [len(run) for run in border.split("+")]
            data = [header, *lines[i + 1 : end]]
            found.append(CorpusTable(f"{path.name}:{i}", text, widths, data))
    return found


def split_cells(line: str, widths: list[int]) -> list[str]:
    raw = line.encode()
    cells, pos = [], 0
    for width in widths:
        cells.append(raw[pos : pos + width].decode())
        pos += width + 1  # the "|"
    assert pos == len(raw) + 1
    return cells


def right_aligned(cells: list[str]) -> bool:
    """Padded on the left: the header (or any value) starts with a space."""
    return any(cell.startswith(" ") and not cell.endswith(" ") for cell in cells)


def rebuild(corpus_table: CorpusTable) -> ResultSet:
    grid = [split_cells(line, corpus_table.widths) for line in corpus_table.lines]
    columns = list(zip(*grid, strict=True)) if grid else []
    stripped = []
    for cells in columns:
        right = right_aligned(list(cells))
        stripped.append([c.lstrip(" ") if right else c.rstrip(" ") for c in cells])
    names = tuple(column[0] for column in stripped)
    rows = tuple(tuple(column[r] or None for column in stripped) for r in range(1, len(corpus_table.lines)))
    return ResultSet(columns=names, text_rows=rows)


@needs_corpus
def test_corpus_has_750_tables() -> None:
    assert len(corpus_tables()) == 750


@needs_corpus
def test_every_corpus_table_reprints_exactly() -> None:
    failures = []
    for corpus_table in corpus_tables():
        rendered = pqprint(rebuild(corpus_table))
        if rendered != corpus_table.text:
            failures.append(f"{corpus_table.where}:\n{corpus_table.text}---\n{rendered}")
    assert not failures, "\n".join(failures[:5])
