"""The pgbench script and the setup and check files ``pgrace load --emit`` writes, from a scenario's ``[load]``."""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path
from typing import Any

from psycopg import sql

from pgrace.errors import ScenarioError
from pgrace.model.scenario import LoadCommand, Scenario
from pgrace.model.variables import find, meta_command, param_values, substitute

_NAME_CHAR = re.compile(r"[A-Za-z0-9_\x80-\U0010ffff]")


def compose_sql(text: str, scenario: Scenario) -> str:
    """SQL that pgrace itself runs (setup, checks): the scenario's params composed in."""
    return substitute(text, param_values(scenario))


def _pgbench_variables(text: str) -> list[str]:
    """The ``:name`` pgbench's ``-M extended`` will bind in ``text``, by pgbench's own rule (quotes unseen)."""
    found: list[str] = []
    index = 0
    while (index := text.find(":", index)) != -1:
        end = index + 1
        while end < len(text) and _NAME_CHAR.match(text[end]):
            end += 1
        if end == index + 1:
            while index < len(text) and text[index] == ":":
                index += 1
            continue
        found.append(text[index + 1 : end])
        index = end
    return found


def _statement(text: str, scenario: Scenario, command: LoadCommand) -> str:
    """One statement for pgbench: params composed, runtime variables as pgbench's ``:name``."""
    composed = compose_sql(text, scenario)
    pieces: list[str] = []
    names: list[str] = []
    position = 0
    for use in find(composed):
        pieces.append(composed[position : use.start])
        pieces.append(f":{use.name}" if use.form == "value" else f"CAST(:{use.name} AS text)")
        names.append(use.name)
        position = use.end
    pieces.append(composed[position:])
    result = "".join(pieces)
    _no_meta_command(result, scenario, command.line)
    seen = _pgbench_variables(result)
    if seen != names:
        stray = next((n for n in seen if n not in names), seen[0] if seen else "?")
        raise ScenarioError(
            f"load SQL {' '.join(text.split())[:60]!r}: pgbench would read ':{stray}' as a variable"
            " (it does not see quotes or comments); write it without a colon before a name",
            scenario.source,
            command.line,
        )
    return result


def pgbench_script(scenario: Scenario) -> str:
    """The pgbench script of ``scenario``'s ``[load]`` transaction (for ``pgbench -M extended -f``)."""
    from pglast import split
    from pglast.parser import ParseError

    load = load_of(scenario)
    lines = [f"-- pgrace load: {_one_line(scenario.name)} ({scenario.variant}); run with pgbench -n -M extended -f"]
    for command in load.transaction:
        if command.kind == "set":
            lines.append(f"\\set {command.name} random({command.low}, {command.high})")
            continue
        if command.kind == "sleep":
            lines.append(f"\\sleep {max(1, round(command.seconds * 1_000_000))} us")
            continue
        if command.step:
            lines.append(f"-- step {_one_line(command.step)}")
        try:
            statements = [s.strip() for s in split(command.sql, with_parser=False) if s.strip()]
        except ParseError as exc:  # PostgreSQL's scanner cannot read it: pgbench could not either
            raise ScenarioError(
                f"load SQL {' '.join(command.sql.split())[:60]!r} cannot be split into statements: {exc}",
                scenario.source,
                command.line,
            ) from None
        for index, statement in enumerate(statements):
            # A trailing `-- comment` would swallow what pgrace writes after it on its line.
            if _ends_in_line_comment(statement):
                statement += "\n"
            if index == len(statements) - 1 and command.capture:
                if any(variable != column for variable, column in command.capture):
                    columns = sql.SQL(", ").join(
                        sql.SQL("{} AS {}").format(sql.Identifier(column), sql.Identifier(variable))
                        for variable, column in command.capture
                    )
                    statement = (
                        sql.SQL("WITH pgrace_step AS ({}) SELECT {} FROM pgrace_step")
                        .format(sql.SQL(statement), columns)
                        .as_string(None)
                    )
                text = _statement(statement, scenario, command)
                lines.append(f"{text}{'' if text.endswith(chr(10)) else ' '}\\gset")
            else:
                lines.append(f"{_statement(statement, scenario, command)};")
    return "\n".join(lines) + "\n"


def setup_sql(scenario: Scenario) -> list[str]:
    """The scenario's setup, then the load setup, params composed: run before each client count."""
    load = load_of(scenario)
    texts = [compose_sql(text, scenario) for text in (*scenario.setup, *load.setup)]
    for text in texts:
        _no_meta_command(text, scenario, load.line)
    return texts


def _no_meta_command(text: str, scenario: Scenario, line: int | None) -> None:
    """The last word before pgbench or psql reads ``text``: the file's own text was checked when it was read.

    Composed params are quoted literals or a choice's plain words, so this never fires on a
    scenario that passed; it keeps a future change to composing from opening a shell.
    """
    if (found := meta_command(text)) is not None:
        raise ScenarioError(
            f'load SQL holds the meta-command "{found}" (a backslash outside quotes)', scenario.source, line
        )


def _ends_in_line_comment(text: str) -> bool:
    from pglast.parser import ParseError, scan

    try:
        tokens = scan(text)
    except ParseError:
        return False
    return bool(tokens) and tokens[-1].name == "SQL_COMMENT"


def load_of(scenario: Scenario) -> Any:
    if scenario.load is None:
        raise ScenarioError(
            f"scenario {scenario.name!r} ({scenario.variant}) has no [load] section", scenario.source, None
        )
    return scenario.load


def _one_line(text: str) -> str:
    """File text for a ``--`` comment line of a script: nothing in it may end the line or act on a terminal."""
    from pgrace.text import visible

    return visible(" ".join(text.split()).replace("--", "- -"))


def emit(scenario: Scenario, directory: Path) -> list[Path]:
    """Write the pgbench script, the setup SQL and the checks' SQL, to drive a server with pgbench alone.

    Every file is made before any is written, so invalid input leaves nothing; a file that
    cannot be written is invalid input (exit 2), and a symbolic link in its place is not
    followed (it could point anywhere).
    """
    stem = f"{scenario.name}.{scenario.variant}"
    check_text = []
    for check in load_of(scenario).checks:
        query = compose_sql(check.sql, scenario)
        _no_meta_command(query, scenario, check.line)
        check_text.append(f"-- {_one_line(check.description)}: (expected, actual[, detail])\n")
        check_text.append(_terminated(query))
    files = {
        directory / f"{stem}.pgbench.sql": pgbench_script(scenario),
        directory / f"{stem}.setup.sql": "".join(_terminated(text) for text in setup_sql(scenario)),
        directory / f"{stem}.check.sql": "".join(check_text),
    }
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ScenarioError(f"cannot make the folder: {exc.strerror or exc}", str(directory)) from None
    for path in files:  # all refused before any is written: nothing is left half done
        with contextlib.suppress(FileNotFoundError):
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                raise ScenarioError(
                    "cannot write: a symbolic link is there; pgrace does not write through one", str(path)
                )
            if not stat.S_ISREG(st.st_mode):
                raise ScenarioError("cannot write: something that is not a file is there", str(path))
    for path, text in files.items():
        _write_file(path, text)
    return list(files)


def _write_file(path: Path, text: str) -> None:
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # no FIFO hang
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        why = "a symbolic link is there; pgrace does not write through one" if path.is_symlink() else exc.strerror
        raise ScenarioError(f"cannot write: {why or exc}", str(path)) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:  # a full disk, say
        raise ScenarioError(f"cannot write: {exc.strerror or exc}", str(path)) from None


def _terminated(text: str) -> str:
    text = text.strip()
    if _ends_in_line_comment(text):
        return text + "\n;\n"
    return text + ("\n" if text.endswith(";") else ";\n")
