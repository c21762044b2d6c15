"""The isolationtester ``.spec`` front end: spec text in, :class:`Scenario` out.

The grammar, the exact text kept for SQL blocks, the checks and the order of the
automatic permutations follow PostgreSQL's ``isolationtester`` (PG 14 and later), as
described in ``ISOLATIONTESTER.md`` of the isolation corpus::

    spec        := setup* [teardown] session+ permutation*
    session     := "session" NAME ["setup" SQL] ("step" NAME SQL)+ ["teardown" SQL]
    permutation := "permutation" (NAME ["(" marker ("," marker)* ")"])+
    marker      := "*" | NAME | NAME "notices" INTEGER

The parser is a small hand-written tokenizer plus a recursive-descent reader. Whatever
the input, it raises only :class:`ScenarioError`, always with a line number.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Literal

from pgrace.errors import ScenarioError
from pgrace.frontends import limits
from pgrace.model.orders import Interleavings
from pgrace.model.scenario import CompletionMarker, PermutationStep, Scenario, Session, Step
from pgrace.text import control_in_name

KEYWORDS = frozenset({"notices", "permutation", "session", "setup", "step", "teardown"})
SPACE = " \t\r\f"  # skipped between tokens, and trimmed at both ends of an SQL block
DIGITS = "0123456789"
PUNCTUATION = ",()*"
MAX_INTEGER_DIGITS = 9  # isolationtester reads markers with atoi() into an int
MAX_AUTO_PERMUTATIONS = 10_000

TokenKind = Literal["keyword", "name", "sql", "integer", "punct", "eof"]


@dataclass(frozen=True)
class Token:
    kind: TokenKind
    text: str
    line: int

    def describe(self) -> str:
        if self.kind == "eof":
            return "end of file"
        if self.kind == "sql":
            return "an SQL block"
        if self.kind == "keyword":
            return f'keyword "{self.text}"'
        if self.kind == "name":
            return f'name "{self.text}"'
        return f'"{self.text}"'


# -- tokenizer ---------------------------------------------------------------------------


def _is_name_start(char: str) -> bool:
    # A letter, "_", or any non-ASCII character (a high-bit byte in isolationtester).
    return "a" <= char <= "z" or "A" <= char <= "Z" or char == "_" or char >= "\x80"


def _is_name_char(char: str) -> bool:
    return _is_name_start(char) or char in DIGITS or char == "$"


def tokenize(text: str, path: str) -> list[Token]:
    """Split spec text into tokens; the last one is always ``eof``."""
    tokens: list[Token] = []
    pos, line, end = 0, 1, len(text)
    while pos < end:
        char = text[pos]
        if char == "\n":
            line += 1
            pos += 1
        elif char in SPACE:
            pos += 1
        elif char == "#":  # a comment runs to the end of the line
            newline = text.find("\n", pos)
            pos = end if newline < 0 else newline
        elif char == "{":
            close = text.find("}", pos)
            if close < 0:  # isolationtester reports the last line; the opening one helps more
                raise ScenarioError("unterminated sql block", path, line)
            sql = text[pos + 1 : close].lstrip(SPACE).rstrip(SPACE)
            tokens.append(Token("sql", sql, line))
            line += text.count("\n", pos, close)
            pos = close + 1
        elif char == '"':
            name, pos = _quoted_name(text, pos, line, path)
            tokens.append(Token("name", name, line))
        elif _is_name_start(char):
            start = pos
            while pos < end and _is_name_char(text[pos]):
                pos += 1
            word = text[start:pos]
            tokens.append(Token("keyword" if word in KEYWORDS else "name", word, line))
        elif char in DIGITS:
            start = pos
            while pos < end and text[pos] in DIGITS:
                pos += 1
            tokens.append(Token("integer", text[start:pos], line))
        elif char in PUNCTUATION:
            tokens.append(Token("punct", char, line))
            pos += 1
        else:
            raise ScenarioError(f'unexpected character "{char}"', path, line)
    for token in tokens:
        if token.kind == "name" and (bad := control_in_name(token.text)) is not None:
            raise ScenarioError(f"control character {bad} in a name", path, token.line)
    tokens.append(Token("eof", "", line))
    return tokens


def _quoted_name(text: str, pos: int, line: int, path: str) -> tuple[str, int]:
    """Read ``"..."`` starting at ``pos`` (``""`` is one quote); return name, next pos."""
    chars: list[str] = []
    pos += 1
    while True:
        if pos >= len(text):
            raise ScenarioError("unterminated quoted identifier", path, line)
        char = text[pos]
        if char == "\n":
            raise ScenarioError("unexpected newline in quoted identifier", path, line)
        if char == '"':
            if text.startswith('""', pos):
                chars.append('"')
                pos += 2
                continue
            return "".join(chars), pos + 1
        chars.append(char)
        pos += 1


# -- parser ------------------------------------------------------------------------------


@dataclass
class _SessionDef:
    name: str
    line: int
    setup: str | None = None
    teardown: str | None = None
    steps: list[Step] = field(default_factory=list)


@dataclass
class _MarkerDef:
    marker: CompletionMarker
    line: int


@dataclass
class _PStepDef:
    name: str
    line: int
    markers: list[_MarkerDef] = field(default_factory=list)


@dataclass
class _SpecDef:
    setup: list[str] = field(default_factory=list)
    setup_line: int | None = None
    teardown: list[str] = field(default_factory=list)
    sessions: list[_SessionDef] = field(default_factory=list)
    permutations: list[list[_PStepDef]] = field(default_factory=list)


class _Parser:
    def __init__(self, tokens: list[Token], path: str) -> None:
        self.tokens = tokens
        self.pos = 0
        self.path = path

    def peek(self) -> Token:
        return self.tokens[self.pos]

    def advance(self) -> Token:
        token = self.tokens[self.pos]
        if token.kind != "eof":
            self.pos += 1
        return token

    def at(self, kind: TokenKind, text: str | None = None) -> bool:
        token = self.peek()
        return token.kind == kind and (text is None or token.text == text)

    def fail(self, expected: str) -> ScenarioError:
        token = self.peek()
        message = f"syntax error: expected {expected}, found {token.describe()}"
        if token.kind == "keyword" and "name" in expected:
            message += f' (write "{token.text}" in double quotes to use it as a name)'
        return ScenarioError(message, self.path, token.line)

    def expect(self, kind: TokenKind, expected: str) -> Token:
        if not self.at(kind):
            raise self.fail(expected)
        return self.advance()

    def parse(self) -> _SpecDef:
        spec = _SpecDef()
        while self.at("keyword", "setup"):
            line = self.advance().line
            if spec.setup_line is None:
                spec.setup_line = line
            spec.setup.append(self.expect("sql", "an SQL block after setup").text)
        if self.at("keyword", "teardown"):
            self.advance()
            spec.teardown.append(self.expect("sql", "an SQL block after teardown").text)
        if not self.at("keyword", "session"):
            wanted = '"session"' if spec.teardown else '"setup", "teardown" or "session"'
            raise self.fail(wanted)
        while self.at("keyword", "session"):
            spec.sessions.append(self.session())
        while self.at("keyword", "permutation"):
            self.advance()
            spec.permutations.append(self.permutation())
        if not self.at("eof"):
            if spec.permutations:
                raise self.fail('a step name, "permutation" or end of file')
            raise self.fail('"session", "permutation" or end of file')
        return spec

    def session(self) -> _SessionDef:
        line = self.advance().line
        name = self.expect("name", "a session name").text
        session = _SessionDef(name, line)
        if self.at("keyword", "setup"):
            self.advance()
            session.setup = self.expect("sql", "an SQL block after setup").text
        if not self.at("keyword", "step"):
            expected = '"step"' if session.setup is not None else '"setup" or "step"'
            raise self.fail(expected)
        while self.at("keyword", "step"):
            step_line = self.advance().line
            step_name = self.expect("name", "a step name").text
            sql = self.expect("sql", f'an SQL block for step "{step_name}"').text
            session.steps.append(Step(step_name, name, sql, line=step_line))
        if self.at("keyword", "teardown"):
            self.advance()
            session.teardown = self.expect("sql", "an SQL block after teardown").text
        return session

    def permutation(self) -> list[_PStepDef]:
        steps: list[_PStepDef] = []
        while self.at("name"):
            token = self.advance()
            pstep = _PStepDef(token.text, token.line)
            if self.at("punct", "("):
                self.advance()
                pstep.markers.append(self.marker())
                while self.at("punct", ","):
                    self.advance()
                    pstep.markers.append(self.marker())
                if not self.at("punct", ")"):
                    raise self.fail('"," or ")"')
                self.advance()
            steps.append(pstep)
        if not steps:
            raise self.fail('a step name after "permutation"')
        return steps

    def marker(self) -> _MarkerDef:
        token = self.peek()
        if self.at("punct", "*"):
            self.advance()
            return _MarkerDef(CompletionMarker(None), token.line)
        name = self.expect("name", 'a step name or "*" in the marker').text
        if not self.at("keyword", "notices"):
            return _MarkerDef(CompletionMarker(name), token.line)
        self.advance()
        number = self.expect("integer", 'a number after "notices"')
        if len(number.text.lstrip("0")) > MAX_INTEGER_DIGITS:
            raise ScenarioError(f"notice count {number.text} is out of range", self.path, number.line)
        return _MarkerDef(CompletionMarker(name, int(number.text)), token.line)


# -- checks ------------------------------------------------------------------------------


def _did_you_mean(name: str, candidates: Iterable[str]) -> str:
    matches = [f'"{m}"' for m in difflib.get_close_matches(name, sorted(set(candidates)), n=3)]
    if not matches:
        return ""
    if len(matches) == 1:
        return f"; did you mean {matches[0]}?"
    return f"; did you mean {', '.join(matches[:-1])} or {matches[-1]}?"


def _check(spec: _SpecDef, path: str) -> None:
    """isolationtester's checks, in its order; the first failure is raised.

    One check is pgrace's own: session names must be unique too (isolationtester does
    not check, but events name sessions, so two sessions with one name are ambiguous).
    """
    sessions_seen: set[str] = set()
    steps: dict[str, Step] = {}
    for session in spec.sessions:
        if session.name in sessions_seen:
            message = f"duplicate session name: {session.name}"
            raise ScenarioError(message, path, session.line)
        sessions_seen.add(session.name)
        for step in session.steps:
            if step.name in steps:
                raise ScenarioError(f"duplicate step name: {step.name}", path, step.line)
            steps[step.name] = step

    for permutation in spec.permutations:
        for pstep in permutation:
            if pstep.name not in steps:
                message = f'undefined step "{pstep.name}" specified in permutation'
                message += _did_you_mean(pstep.name, steps)
                raise ScenarioError(message, path, pstep.line)
        in_permutation = {pstep.name for pstep in permutation}
        for pstep in permutation:
            for marker in pstep.markers:
                _check_marker(marker, pstep, steps, in_permutation, path)


def _check_marker(
    marker: _MarkerDef,
    pstep: _PStepDef,
    steps: dict[str, Step],
    in_permutation: set[str],
    path: str,
) -> None:
    name = marker.marker.step
    if name is None:
        return
    if name not in in_permutation:
        message = f'undefined blocking step "{name}" referenced in permutation step "{pstep.name}"'
        if name in steps:
            message += f'; step "{name}" exists but is not in this permutation'
        else:
            message += _did_you_mean(name, in_permutation)
        raise ScenarioError(message, path, marker.line)
    if steps[name].session == steps[pstep.name].session:
        message = f'permutation step "{pstep.name}" cannot block on its own session'
        raise ScenarioError(message, path, marker.line)


# -- automatic permutations --------------------------------------------------------------


def permutation_count(lengths: Sequence[int]) -> int:
    """How many interleavings keep each sequence in order: (Σn)! / Πn!."""
    return Interleavings.count(lengths)


def interleavings(sequences: Sequence[Sequence[str]]) -> Iterator[tuple[str, ...]]:
    """Every interleaving of ``sequences``, each kept in order, in isolationtester's order (:class:`Interleavings`)."""
    return iter(Interleavings(sequences))


def _auto_permutations(spec: _SpecDef, path: str) -> tuple[tuple[PermutationStep, ...], ...]:
    names = [[step.name for step in session.steps] for session in spec.sessions]
    schedule = Interleavings(names)
    count = schedule.size
    if count > MAX_AUTO_PERMUTATIONS:
        message = (
            f"the spec has no permutation lines and its steps interleave in {count} "
            f"ways (more than {MAX_AUTO_PERMUTATIONS}); list the permutations to run"
        )
        raise ScenarioError(message, path, spec.sessions[0].line)
    pstep = {name: PermutationStep(name) for session in names for name in session}
    return tuple(tuple(pstep[n] for n in order) for order in schedule)


# -- public entry points -----------------------------------------------------------------


def parse_spec(text: str, path: str) -> Scenario:
    """Parse an isolationtester spec; raise :class:`ScenarioError` on any problem."""
    limits.check_text(text, path)
    spec = _Parser(tokenize(text, path), path).parse()
    _check(spec, path)
    if spec.permutations:
        permutations = tuple(
            tuple(PermutationStep(p.name, tuple(m.marker for m in p.markers)) for p in permutation)
            for permutation in spec.permutations
        )
    else:
        permutations = _auto_permutations(spec, path)
    name = PurePath(path).stem
    return Scenario(
        name=name,
        title=name,
        source=path,
        dialect="spec",
        variant="bug",
        setup=tuple(spec.setup),
        setup_line=spec.setup_line,
        teardown=tuple(spec.teardown),
        sessions=tuple(Session(s.name, s.setup, s.teardown, line=s.line) for s in spec.sessions),
        steps=tuple(step for session in spec.sessions for step in session.steps),
        permutations=permutations,
    )


def unused_steps(scenario: Scenario) -> list[str]:
    """Steps that no permutation uses, sorted by name as isolationtester sorts them (``strcmp``).

    isolationtester warns ``unused step name: X`` for each, before anything else.
    Automatic permutations use every step, so this is only ever non-empty for specs
    with explicit permutation lines.
    """
    used = {pstep.step for permutation in scenario.permutations for pstep in permutation}
    unused = [step.name for step in scenario.steps if step.name not in used]
    return sorted(unused, key=lambda name: name.encode("utf-8"))
