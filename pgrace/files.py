"""The files a command names besides its scenarios: what it reads, and what it must not write over.

Kept light (no psycopg, no runner): the CLI checks its options with it before a server starts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path

from pgrace.errors import OptionError, ScenarioError

__all__ = ["read_input", "refuse_overwriting_inputs", "write_output"]


def refuse_overwriting_inputs(
    output: str | Path | None, inputs: Iterable[str | Path], parameter: str = "output"
) -> None:
    """An output file (the value of ``parameter``) that is one of the files the command reads (itself, or through
    a link) is refused, exit 2.

    ``pgrace run my.toml -o my.toml`` would otherwise replace the scenario with its own timeline.
    Any other existing file is overwritten, as a shell's ``>`` would.
    """
    if output is None:
        return
    for source in inputs:
        with suppress(OSError):  # a file that does not exist (yet) cannot be an input
            if os.path.samefile(output, source):
                raise OptionError(f"{output} would write over {source}, which this command reads", parameter)


def write_output(path: str | Path, text: str) -> None:
    """Write an output file; failing to (a full disk, say) is one line and exit 2, never a traceback."""
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"cannot write: {exc.strerror or exc}", str(path)) from None


def read_input(name: str | Path) -> str:
    """A text file named by the caller (not a scenario): unreadable or not UTF-8 is invalid input."""
    try:
        data = Path(name).read_bytes()
    except OSError as exc:
        raise ScenarioError(f"cannot read: {exc.strerror or exc}", str(name)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ScenarioError(f"not UTF-8: byte 0x{data[exc.start : exc.start + 1].hex()}", str(name), line) from None
