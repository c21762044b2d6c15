"""Scenario variables: found where PostgreSQL's own lexer puts them, filled in with psycopg's ``sql``.

One place for the whole life of a ``:variable``: :func:`find` lists the uses in a SQL
text, the TOML front end checks them, and :func:`substitute` fills them in for the runner.

The forms follow psql: ``:name`` (the value: a quoted literal, or a number, or, for a
parameter declared with ``choices``, the chosen SQL words as written in the file),
``:'name'`` (always a string literal) and ``:"name"`` (always a quoted identifier). A
name may be qualified by a session: ``:worker1.claimed_id`` is what worker1 captured,
``:worker1.pid`` its backend's pid.

Uses are found with PostgreSQL's own scanner (pglast wraps it), never a regular
expression: text in comments, string literals of every kind (``E''``, ``$$``, ``U&''``)
and quoted identifiers is left alone, so a value can never land where the scanner
would read it differently from the author. A colon glued to a word or number before it
(an array slice ``a[lo:hi]``) and ``::`` casts are not variables. Text the scanner cannot
read (an unterminated quote) has no variables: it is sent as written and the server
reports the syntax error.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # psycopg is imported when a value is composed: a run imports it while the server boots
    from psycopg import sql

    from pgrace.model.scenario import Scenario

Form = Literal["value", "literal", "identifier"]  # :name, :'name', :"name"

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
QUALIFIED = re.compile(r"(?:(?P<session>[A-Za-z_][A-Za-z0-9_]*)\.)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)")
CHOICE = re.compile(r"(?:[A-Za-z]+(?: [A-Za-z]+)*)?")  # SQL words only: "FOR NO KEY UPDATE", "SKIP LOCKED", ""
FACTS = ("pid",)  # what pgrace itself knows about a session, as :session.fact


@dataclass(frozen=True)
class Use:
    """One ``:variable`` in a SQL text: ``text[start:end]`` is what the author wrote."""

    start: int
    end: int
    form: Form
    name: str
    session: str | None = None

    @property
    def key(self) -> str:
        """``name`` or ``session.name``: how values are looked up."""
        return self.name if self.session is None else f"{self.session}.{self.name}"

    @property
    def written(self) -> str:
        quote = {"value": "", "literal": "'", "identifier": '"'}[self.form]
        return f":{quote}{self.key}{quote}"


@dataclass(frozen=True)
class Value:
    """What a variable stands for.

    ``text`` is the server's own text of a captured value (``:'name'`` uses it, so a
    timestamp reads as PostgreSQL wrote it). ``words`` marks a declared choice: ``:name``
    puts it in unquoted; it can only be one of the file's own choices, checked at load.
    """

    value: Any
    text: str | None = None
    words: bool = False

    def as_text(self) -> str | None:
        if self.value is None:
            return None
        if self.text is not None:
            return self.text
        if isinstance(self.value, bool):
            return "true" if self.value else "false"
        return str(self.value)


def param_values(scenario: Scenario) -> dict[str, Value]:
    """The scenario's params as values: a declared choice goes in as its SQL words, any other as a literal."""
    choices = {name for name, _ in scenario.param_choices}
    return {name: Value(value, words=name in choices) for name, value in scenario.params}


def find(text: str) -> list[Use]:
    """The variables in ``text``, in order, as PostgreSQL's scanner sees the text."""
    if ":" not in text:
        return []
    return list(_scanned(text))


@functools.lru_cache(maxsize=4096)
def _scanned(text: str) -> tuple[Use, ...]:
    """The uses in ``text``, scanned once: explore sends the same steps thousands of times."""
    from pglast.parser import ParseError, scan  # imported on first use: a CLI start need not pay for it

    try:
        tokens = scan(text)
    except ParseError:
        return ()
    uses: list[Use] = []
    index = 0
    while index < len(tokens) - 1:
        colon = tokens[index]
        index += 1
        if colon.name != "ASCII_58" or (
            colon.start > 0 and (text[colon.start - 1].isalnum() or text[colon.start - 1] in "_$")
        ):
            continue
        first = tokens[index]
        if first.start != colon.end + 1:
            continue
        word = text[first.start : first.end + 1]
        if word[0] in "'\"":
            form: Form = "literal" if word[0] == "'" else "identifier"
            if first.name not in ("SCONST", "IDENT") or len(word) < 3 or word[-1] != word[0]:
                continue
            match = QUALIFIED.fullmatch(word[1:-1])
            if match is None:
                continue
            uses.append(Use(colon.start, first.end + 1, form, match["name"], match["session"]))
            index += 1
            continue
        if not NAME.fullmatch(word):
            continue
        end, name, session = first.end + 1, word, None
        if index + 2 < len(tokens):
            dot, second = tokens[index + 1], tokens[index + 2]
            qualified = text[second.start : second.end + 1]
            if dot.name == "ASCII_46" and dot.start == end and second.start == end + 1 and NAME.fullmatch(qualified):
                end, name, session = second.end + 1, qualified, word
                index += 2
        uses.append(Use(colon.start, end, "value", name, session))
        index += 1
    return tuple(uses)


def substitute(text: str, values: Mapping[str, Value], context: Any = None) -> str:
    """``text`` with each known variable replaced by its value, composed by psycopg's ``sql``.

    An unknown variable is left as written (validation reports it before a run; the
    server's syntax error says the rest). ``context`` is a psycopg connection, for
    quoting by its settings, or None.
    """
    from psycopg import sql

    parts: list[sql.Composable] = []
    position = 0
    for use in find(text):
        value = values.get(use.key)
        if value is None:
            continue
        parts.append(sql.SQL(text[position : use.start]))
        parts.append(compose(use.form, value))
        position = use.end
    if not parts:
        return text
    parts.append(sql.SQL(text[position:]))
    return sql.Composed(parts).as_string(context)


def compose(form: Form, value: Value) -> sql.Composable:
    """The SQL for one use: never text glued in, except a declared choice's own words."""
    from psycopg import sql

    if form == "value":
        if value.words:
            return sql.SQL(str(value.value))
        return sql.Literal(value.value)
    text = value.as_text()
    if text is None:
        return sql.SQL("NULL")
    return sql.Literal(text) if form == "literal" else sql.Identifier(text)


def valid_choice(word: str) -> bool:
    """A choice is SQL words and spaces (or nothing): put in raw, it cannot end a statement or open a quote."""
    return CHOICE.fullmatch(word) is not None


# Tokens whose text is SQL's own: a backslash in them is data, not a psql or pgbench command.
_QUOTED = frozenset({"SCONST", "USCONST", "BCONST", "XCONST", "IDENT", "UIDENT", "C_COMMENT", "SQL_COMMENT"})


def scan_error(text: str) -> str | None:
    """Why PostgreSQL's scanner cannot read ``text`` (an unterminated quote), or None if it can."""
    from pglast.parser import ParseError, scan

    try:
        scan(text)
    except ParseError as exc:
        return str(exc)
    return None


def meta_command(text: str) -> str | None:
    """The first backslash command psql or pgbench would run in ``text`` (``\\shell rm ...``), or None.

    Their lexer stops at a backslash outside string literals (``E''``, ``U&''``, dollar
    quotes), quoted identifiers and comments, and runs what follows as a meta-command:
    ``\\shell`` and ``\\!`` run a shell. PostgreSQL's scanner finds those backslashes as
    it finds variables. Text it cannot read (an unterminated quote) is judged by its first
    backslash anywhere: no reading of it can be trusted to keep that one inside quotes.
    """
    if "\\" not in text:
        return None
    from pglast.parser import ParseError, scan

    try:
        tokens = scan(text)
    except ParseError:
        return _command_at(text, text.index("\\"))
    for token in tokens:
        if token.name not in _QUOTED and "\\" in text[token.start : token.end + 1]:
            return _command_at(text, token.start + text[token.start : token.end + 1].index("\\"))
    return None


def _command_at(text: str, index: int) -> str:
    """The command starting at ``index`` as written, on one line and short: what an error message quotes."""
    return " ".join(text[index:].split("\n", 1)[0].split())[:40]
