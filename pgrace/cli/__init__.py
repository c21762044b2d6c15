"""The ``pgrace`` command: thin click commands over :mod:`pgrace.api`.

:mod:`pgrace.cli.base` holds the group, the options the commands share and the one place
errors reach the user; each module beside it holds the commands of one kind; ``terminal/``
the UI that holds a terminal (presenter, playback, progress); :mod:`pgrace.cli.entry` the
console entry and :mod:`pgrace.cli.exits` how the process ends. Each command parses
options, calls one library function and renders.

Importing this package imports nothing: the console entry, inside it, takes over SIGINT
and SIGTERM before click loads. ``main`` and the group are imported on first use, with
every command, and none of the drivers or renderers (tests/test_import_cost.py): each
command imports what it needs when it runs.
"""

from __future__ import annotations

# Not `from typing import TYPE_CHECKING`, nor importlib here: the console entry, inside this
# package, takes over Ctrl-C only once the package is imported (as pgrace/__init__.py says).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from pgrace.cli.base import FORMATS, PgraceGroup, main

__all__ = ["FORMATS", "PgraceGroup", "main"]

COMMAND_MODULES = ("cleaning", "from_log", "loading", "proving", "running")  # each adds its commands to `main`


def __getattr__(name: str) -> Any:
    import importlib

    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    for module in COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{module}")
    return getattr(importlib.import_module(f"{__name__}.base"), name)
