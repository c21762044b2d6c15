"""Setup text as statements a shrink can drop one at a time, and a multi-row INSERT as rows it can drop."""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["SetupStatement", "join_block", "split_block"]


@dataclass(frozen=True)
class SetupStatement:
    """One setup statement: ``head``, then ``rows`` (a VALUES list's rows) joined by commas, then ``tail``.

    ``block``: which of the scenario's setup blocks it came from (each block is sent as one).
    """

    block: int
    head: str
    rows: tuple[str, ...] = ()
    tail: str = ""

    @property
    def text(self) -> str:
        return self.head + ", ".join(self.rows) + self.tail if self.rows else self.head

    def without_row(self, index: int) -> SetupStatement:
        return replace(self, rows=self.rows[:index] + self.rows[index + 1 :])


def split_block(block: int, text: str) -> list[SetupStatement]:
    """The statements of one setup block (PostgreSQL's scanner ends each); text it cannot scan stays whole."""
    import pglast

    try:
        parts = [p.strip() for p in pglast.split(text, with_parser=False)]
    except Exception:  # pglast's scanner refuses it: one statement, kept as written
        return [SetupStatement(block, text.strip().rstrip(";"))] if text.strip() else []
    return [_rows_of(block, part) for part in parts if part]


_COMMENTS = ("SQL_COMMENT", "C_COMMENT")


def _rows_of(block: int, text: str) -> SetupStatement:
    """An ``INSERT ... VALUES (...), (...)`` split at its rows' top-level commas; any other statement whole."""
    from pglast.parser import scan

    try:
        tokens = [t for t in scan(text) if t.name not in _COMMENTS]  # from-log's setup notes its guesses
    except Exception:
        return SetupStatement(block, text)
    raw = text  # the scanner counts characters
    names = [t.name for t in tokens]
    if not names or names[0] != "INSERT" or "VALUES" not in names:
        return SetupStatement(block, text)
    at = names.index("VALUES") + 1
    depth, start, rows = 0, None, []
    end_of_rows = len(raw)
    for token in tokens[at:]:
        if token.name == "ASCII_40":  # (
            if depth == 0:
                start = token.start
            depth += 1
        elif token.name == "ASCII_41":  # )
            depth -= 1
            if depth == 0 and start is not None:
                rows.append(raw[start : token.end + 1])
                start = None
        elif depth == 0 and token.name != "ASCII_44":  # anything but a comma between rows: ON CONFLICT, RETURNING
            end_of_rows = token.start
            break
    if len(rows) < 2:
        return SetupStatement(block, text)
    head_end = tokens[at].start
    tail = raw[end_of_rows:].strip()
    return SetupStatement(block, raw[:head_end], tuple(rows), f" {tail}" if tail else "")


def join_block(statements: list[SetupStatement]) -> str:
    return "".join(f"{s.text};\n" for s in statements)
