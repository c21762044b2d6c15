"""Small typed readers over the plain TOML data, each refusal told at its key's line."""

from __future__ import annotations

import re
from typing import Any

from pgrace.frontends.names import KeyPath, did_you_mean
from pgrace.frontends.scenario_toml.locator import Locator

# \Z, not $: "$" also matches before a trailing newline, which a name must not hold.
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*\Z")  # "." joins a step name to its session
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*$")
MAX_SLEEP = 60.0
SQLSTATE = re.compile(r"^[0-9A-Z]{5}$")


class Reader:
    """The document and its locator, shared by every part of the build: one place says what a value must be."""

    def __init__(self, data: dict[str, Any], locator: Locator) -> None:
        self.data = data
        self.loc = locator
        self.source = locator.source

    def check_keys(
        self,
        table: dict[str, Any],
        allowed: set[str],
        where: tuple[str | int, ...],
        what: str,
    ) -> None:
        for key in table:
            if key not in allowed:
                raise self.loc.error(f"unknown {what} {key!r}{did_you_mean(key, allowed)}", *where, key)

    def text(self, value: Any, *path: str | int, what: str | None = None) -> str:
        label = what or str(path[-1])
        if value is None:
            raise self.loc.error(f"missing {label}", *path[:-1] if len(path) > 1 else path)
        if not isinstance(value, str):
            raise self.loc.error(f"{label} must be a string", *path)
        return value

    def opt_text(self, value: Any, *path: str | int) -> str | None:
        return None if value is None else self.text(value, *path)

    def sql_list(self, value: Any, *path: str | int) -> tuple[str, ...]:
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise self.loc.error(f"{path[-1]} must be SQL text or a list of SQL texts", *path)

    def duration(self, raw: Any, where: KeyPath) -> float:
        match = DURATION.match(raw) if isinstance(raw, str) else None
        seconds = (float(match[1]) / (1000 if match[2] == "ms" else 1)) if match else 0.0
        if not 0.001 <= seconds <= MAX_SLEEP:
            raise self.loc.error(f'sleep is a duration from 1ms to {MAX_SLEEP:g}s, such as "300ms" or "1.5s"', *where)
        return seconds

    def capture(self, raw: Any, where: tuple[str | int, ...]) -> tuple[tuple[str, str], ...]:
        if raw is None:
            return ()
        if isinstance(raw, str):
            raw = [raw]
        if isinstance(raw, list) and all(isinstance(c, str) for c in raw):
            pairs = [(c, c) for c in raw]
        elif isinstance(raw, dict) and all(isinstance(v, str) for v in raw.values()):
            pairs = list(raw.items())
        else:
            raise self.loc.error(
                'capture is a column name, a list of them, or a table {variable = "column"}',
                *where,
                "capture",
            )
        for variable, _ in pairs:
            if not re.match(r"^[A-Za-z_]\w*\Z", variable):
                raise self.loc.error(
                    f"variable name {variable!r} must be an identifier",
                    *where,
                    "capture",
                )
        return tuple(pairs)
