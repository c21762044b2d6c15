"""The option types the commands share: a duration (``5``, ``1.5s``, ``200ms``), a list (``1,2,4,8``),
a shard (``2/3``) and a setting (``workers=5``, or ``level=a,b`` for a sweep).

click turns a value these refuse into one line naming the option, exit 2; the library gets
numbers and tuples, never the text typed.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

import click


class Duration(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """Seconds, positive and finite: ``5``, ``1.5``, ``5s`` or ``200ms`` (click's FloatRange lets ``nan`` through).

    ``whole``: a whole number of seconds from 1 to ``most`` (pgbench counts whole seconds).
    """

    name = "duration"

    def __init__(self, whole: bool = False, most: float = math.inf) -> None:
        self.whole = whole
        self.most = most

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds = float(value)
        else:
            seconds = self._seconds(str(value), param, ctx)
        if self.whole and not (seconds.is_integer() and 1 <= seconds <= self.most):
            self.fail(f"{value!r} is not a whole number of seconds from 1 to {self.most:g}", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0 or seconds > self.most:
            self.fail(f"{value!r} is not a positive, finite number of seconds", param, ctx)
        return seconds

    def _seconds(self, text: str, param: click.Parameter | None, ctx: click.Context | None) -> float:
        number, scale = text.strip(), 1.0
        if number.endswith("ms"):
            number, scale = number[:-2], 1000.0
        elif number.endswith("s"):
            number = number[:-1]
        try:
            return float(number) / scale
        except ValueError:
            kind = "a whole number of seconds" if self.whole else "a number of seconds"
            self.fail(f"{text!r} is not {kind}, or one ending in s or ms (5, 5s, 200ms)", param, ctx)


class CommaList(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """Items separated by commas, each converted by ``item``: ``1,2,4,8`` as ``(1, 2, 4, 8)``.

    ``what`` and ``example`` say what the list holds when an item is refused.
    """

    name = "list"

    def __init__(self, item: click.ParamType, what: str, example: str) -> None:  # type: ignore[type-arg]
        self.item = item
        self.what = what
        self.example = example

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[Any, ...]:
        if isinstance(value, tuple | list):
            return tuple(value)
        parts = [part.strip() for part in str(value).split(",")]
        try:
            if not all(parts):
                raise click.BadParameter("an empty item")
            return tuple(self.item.convert(part, param, ctx) for part in parts)
        except click.BadParameter:
            self.fail(f"{value!r} is not a list of {self.what}, like {self.example}", param, ctx)


class Shard(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """``K/N``, shard K of N (1 ≤ K ≤ N), as ``(K, N)``."""

    name = "shard"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[int, int]:
        if isinstance(value, tuple):
            return value
        k, sep, n = str(value).partition("/")
        if not sep or not k.isdigit() or not n.isdigit() or not 1 <= int(k) <= int(n):
            _refuse(f"{value!r} is not K/N with 1 ≤ K ≤ N", param, ctx)
        return int(k), int(n)


class Setting(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """``NAME=VALUE`` as ``(NAME, VALUE)``; with ``values``, ``NAME=V1,V2`` as ``(NAME, (V1, V2))``."""

    name = "setting"

    def __init__(self, values: CommaList | None = None) -> None:
        self.values = values

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, Any]:
        if isinstance(value, tuple):
            return value
        name, sep, text = str(value).partition("=")
        shape = "NAME=VALUE" if self.values is None else "NAME=VALUE[,VALUE...]"
        if not sep or not name:
            _refuse(f"{value!r} is not {shape}", param, ctx)
        if self.values is None:
            return name, text
        try:
            return name, self.values.convert(text, param, ctx)
        except click.BadParameter:
            _refuse(f"{value!r} is not {shape}", param, ctx)


def _refuse(message: str, param: click.Parameter | None, ctx: click.Context | None) -> NoReturn:
    """Refused as the option's long name says it (``--shard``), as these options always were."""
    hint = max(param.opts, key=len) if param is not None and param.opts else None
    raise click.BadParameter(message, ctx, param_hint=hint)
