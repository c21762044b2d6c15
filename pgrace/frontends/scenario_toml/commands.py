"""``[exec]``: the commands whose connections are the sessions, as ``--exec NAME='COMMAND'`` gives them.

``NAME = "COMMAND"``, or ``NAME = { command = "...", cwd = "...", env = { ... } }``. A command
is a shell command line run as the user who runs the file (the trust of the file's setup
SQL); it runs in the file's folder, or in ``cwd`` resolved against it, so that the file and
the application beside it move together. ``[fix.exec]`` gives the other variant's: a name
again replaces that command, a new name adds one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pgrace.frontends.names import KeyPath
from pgrace.frontends.scenario_toml.reader import Reader
from pgrace.model.scenario import Command, set_by_pgrace

EXEC_KEYS = {"command", "cwd", "env"}
VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
FORMS = '[exec] holds NAME = "COMMAND" entries, or NAME = { command = "...", cwd = "...", env = { ... } }'


class CommandReader:
    """Reads an ``[exec]`` table (or ``[fix.exec]``) into commands, each refusal at its key's line."""

    def __init__(self, read: Reader) -> None:
        self.read = read
        self.loc = read.loc
        self.folder = Path(read.source).parent

    def parse(self, raw: Any, path: KeyPath) -> tuple[Command, ...]:
        if raw is None:
            return ()
        if not isinstance(raw, dict) or not raw:
            raise self.loc.error(FORMS, *path)
        return tuple(self._command(name, item, (*path, name)) for name, item in raw.items())

    def _command(self, name: str, item: Any, where: KeyPath) -> Command:
        if not name.isidentifier():
            raise self.loc.error(f"command name {name!r} must be a word: letters, digits and '_'", *where)
        if isinstance(item, str):
            item = {"command": item}
        elif not isinstance(item, dict):
            raise self.loc.error(FORMS, *where)
        self.read.check_keys(item, EXEC_KEYS, where, "[exec] key")
        line = self.read.text(item.get("command"), *where, "command", what=f"command of {name!r}")
        if not line.strip():
            raise self.loc.error(f"the command of {name!r} is empty", *where)
        cwd = self.read.text(item.get("cwd", "."), *where, "cwd")
        folder = (self.folder / cwd).resolve()
        if not folder.is_dir():
            raise self.loc.error(f"cwd {cwd!r} of {name!r} is not a folder (relative to this file's)", *where, "cwd")
        env = self._env(item.get("env", {}), where)
        return Command(name, line, str(folder), env, self.read.source, self.loc.line_of(*where))

    def _env(self, raw: Any, where: KeyPath) -> tuple[tuple[str, str], ...]:
        if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
            raise self.loc.error('env is a table of variables, NAME = "value"', *where, "env")
        for variable in raw:
            if not VARIABLE.match(variable):
                raise self.loc.error(f"env: {variable!r} is not a variable name", *where, "env")
            if set_by_pgrace(variable):
                raise self.loc.error(
                    f"env cannot set {variable}: pgrace points DATABASE_URL and the PG* variables at its proxy",
                    *where,
                    "env",
                )
        return tuple(raw.items())
