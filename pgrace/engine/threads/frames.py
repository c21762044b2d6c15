"""Where in the application's code a step is: its frames, past the frameworks' and the standard library's.

A step's note, an escaped exception's place and a session's name and definition are the
application's own, never a line of psycopg, SQLAlchemy, Django or pgrace: the frames of
:data:`FRAMEWORK_MODULES`, of the standard library (by name and by place) and of the
module prefixes a run names besides are passed over.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import sysconfig
from typing import Any

# Their frames are never the application's line a step is noted at (the standard library's neither).
FRAMEWORK_MODULES = (
    "psycopg",
    "psycopg_pool",
    "psycopg_binary",
    "psycopg_c",
    "psycopg2",
    "asyncpg",
    "sqlalchemy",
    "django",
    "pgrace",
)
_STDLIB_PLACES = (*{sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}, "<frozen ")


def caller(framework: tuple[str, ...] = ()) -> tuple[str, int | None]:
    """The innermost frame of the application's own code: its line."""
    frame = sys._getframe(1)
    while frame is not None:
        if not is_framework(str(frame.f_globals.get("__name__", "")), frame.f_code.co_filename, framework):
            return shown_path(frame.f_code.co_filename), frame.f_lineno
        frame = frame.f_back  # type: ignore[assignment]
    return "?", None


def is_framework(module: str, filename: str, framework: tuple[str, ...] = ()) -> bool:
    """Whether a frame of ``module`` (from ``filename``) is library code: the standard library,
    :data:`FRAMEWORK_MODULES`, or under one of ``framework``'s dotted prefixes.

    The standard library by name and by place, so that an application's own ``email`` or
    ``test`` module stays the application's.
    """
    if module.split(".")[0] in sys.stdlib_module_names and filename.startswith(_STDLIB_PLACES):
        return True
    return any(module == prefix or module.startswith(prefix + ".") for prefix in (*FRAMEWORK_MODULES, *framework))


def shown_path(path: str) -> str:
    """Relative to the working directory when under it: the text timeline must not depend on the machine."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


def raised_at(exc: BaseException, framework: tuple[str, ...] = ()) -> tuple[str, int | None]:
    """The innermost frame of the traceback in the application's code."""
    found: tuple[str, int | None] = ("?", None)
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if not is_framework(str(frame.f_globals.get("__name__", "")), frame.f_code.co_filename, framework):
            found = (shown_path(tb.tb_frame.f_code.co_filename), tb.tb_lineno)
        tb = tb.tb_next
    return found


def _underlying(fn: Any) -> Any:
    """The function a session callable runs: through ``functools.partial``, decorators and bound methods."""
    seen = 0
    while seen < 100:  # a partial of a partial of ...; never a loop forever
        seen += 1
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        elif inspect.ismethod(fn):
            fn = fn.__func__
        elif not inspect.isfunction(fn) and not inspect.isbuiltin(fn) and callable(fn):
            fn = type(fn).__call__
            break
        else:
            break
    return fn


def display_name(fn: Any) -> str:
    """A session callable's name: its function's, or its class's for an object with ``__call__``."""
    target = _underlying(fn)
    if getattr(target, "__name__", "") == "__call__":
        return str(target.__qualname__.rsplit(".", 1)[0])
    return str(getattr(target, "__name__", ""))


def where_defined(fn: Any) -> tuple[str, int | None]:
    """Where a session's code is, as ``path`` and line; its name when the source cannot be found (never a repr,
    which carries a memory address that changes every run)."""
    target = _underlying(fn)
    try:
        path = inspect.getsourcefile(target) or inspect.getfile(target)
        _, line = inspect.getsourcelines(target)
    except (TypeError, OSError):
        return str(getattr(target, "__qualname__", type(target).__qualname__)), None
    return shown_path(path), line
