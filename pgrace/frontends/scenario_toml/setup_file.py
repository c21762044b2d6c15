"""``setup_file``: a team's schema as the scenario's setup, as ``pg_dump --schema-only`` writes it.

The dump is run as it is, with three exceptions that a run in a scratch database needs:
``pg_dump``'s ``\\restrict``/``\\unrestrict`` lines (psql meta-commands that fence the dump,
not SQL) are left out; any other meta-command is refused, since reading a scenario must never
run anything; and ownership and privileges (``OWNER TO``, ``GRANT``, ``REVOKE``) are refused
with the ``pg_dump`` options that leave them out, since they name roles of the team's server
that a scratch database does not have. The dump's own ``SET``s (``check_function_bodies =
false``, an empty ``search_path``) stay, and are undone after it by one ``RESET`` each, so
the scenario's own setup runs as it would without the dump.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

from pgrace.errors import ScenarioError
from pgrace.model.variables import meta_command

#: A schema dump of thousands of tables is a few MB; anything bigger is not a schema.
MAX_SETUP_FILE_BYTES = 32 * 1024 * 1024
_FENCE = re.compile(r"^\\(un)?restrict [A-Za-z0-9]+[ \t]*$")
_RIGHTS_HINT = "dump the schema with pg_dump --schema-only --no-owner --no-privileges"


def read_setup_file(name: str, scenario_source: str, line: int) -> tuple[str, ...]:
    """The dump's SQL for the setup, then the ``RESET``s of what it set; refused with the dump's file and line."""
    base = Path(scenario_source).parent if scenario_source and not scenario_source.startswith("<") else Path()
    path = str(base / name)
    text = _read(path, scenario_source, line)
    kept = "\n".join("" if _FENCE.match(raw) else raw for raw in text.split("\n"))
    if (found := meta_command(kept)) is not None:
        at = _line_of(kept, found)
        raise ScenarioError(f'holds the psql meta-command "{found}", which a setup cannot run', path, at)
    settings = _check_statements(kept, path)
    resets = "".join(f"RESET {name};" for name in settings)
    return (kept, resets) if resets else (kept,)


def _read(path: str, scenario_source: str, line: int) -> str:
    """The file's text: a regular file, UTF-8, bounded; what was opened is checked, not the path beforehand."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise ScenarioError(f"setup_file {path}: cannot read: {exc.strerror or exc}", scenario_source, line) from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ScenarioError(f"setup_file {path} is not a regular file", scenario_source, line)
        data = file.read(MAX_SETUP_FILE_BYTES + 1)
    if len(data) > MAX_SETUP_FILE_BYTES:
        raise ScenarioError(
            f"setup_file {path} is larger than {MAX_SETUP_FILE_BYTES >> 20} MiB: a schema is not", scenario_source, line
        )
    try:
        return data.decode("utf-8").replace("\r\n", "\n")
    except UnicodeDecodeError as exc:
        at = data.count(b"\n", 0, exc.start) + 1
        raise ScenarioError(f"not UTF-8: byte 0x{data[exc.start : exc.start + 1].hex()}", path, at) from None


def _line_of(text: str, fragment: str) -> int:
    index = text.find(fragment.split()[0]) if fragment else -1
    return text.count("\n", 0, max(index, 0)) + 1


def _check_statements(text: str, path: str) -> list[str]:
    """What the dump ``SET``s, in order (to reset afterwards); ownership and privileges refused."""
    from pglast import parse_sql
    from pglast.parser import ParseError

    try:
        statements = parse_sql(text)
    except ParseError as exc:
        at = text.count("\n", 0, getattr(exc, "location", 0) or 0) + 1
        raise ScenarioError(f"is not SQL PostgreSQL can read: {exc.args[0] if exc.args else exc}", path, at) from None
    settings: list[str] = []
    for raw in statements:
        node: Any = raw.stmt
        kind = type(node).__name__
        if kind in ("AlterOwnerStmt", "GrantStmt", "GrantRoleStmt", "AlterDefaultPrivilegesStmt") or (
            kind == "AlterTableStmt" and any(type(cmd).__name__ == "AlterTableCmd" and _owner(cmd) for cmd in node.cmds)
        ):
            what = "privileges" if "Grant" in kind or "Privileges" in kind else "ownership"
            raise ScenarioError(
                f"sets {what}, which names roles of another server: {_RIGHTS_HINT}", path, _first_line(text, raw)
            )
        if kind == "VariableSetStmt" and node.name and node.name not in settings:
            settings.append(node.name)
        if kind == "SelectStmt" and (name := _set_config_name(node)) and name not in settings:
            settings.append(name)
    return settings


def _first_line(text: str, raw: Any) -> int:
    """The line a statement starts on, past the blank lines and comments before it."""
    start = raw.stmt_location or 0
    body = text[start:]
    skipped = 0
    for line in body.split("\n"):
        stripped = line.strip()
        if stripped and not stripped.startswith("--"):
            break
        skipped += 1
    return text.count("\n", 0, start) + 1 + skipped


def _owner(cmd: Any) -> bool:
    from pglast.enums import AlterTableType

    return bool(cmd.subtype == AlterTableType.AT_ChangeOwner)


def _set_config_name(node: Any) -> str | None:
    """``SELECT pg_catalog.set_config('search_path', '', false)``: the setting it sets for the session."""
    targets: Any = node.targetList or ()
    if len(targets) != 1 or type(targets[0].val).__name__ != "FuncCall":
        return None
    call = targets[0].val
    name = ".".join(part.sval for part in call.funcname)
    args: Any = call.args or ()
    if name not in ("set_config", "pg_catalog.set_config") or len(args) != 3:
        return None
    first, last = args[0], args[2]
    if type(first).__name__ != "A_Const" or type(last).__name__ != "A_Const":
        return None
    is_local = getattr(last.val, "boolval", None)
    value = getattr(first.val, "sval", None)
    return str(value) if isinstance(value, str) and not is_local else None
