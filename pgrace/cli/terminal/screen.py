"""The terminal a presenter draws on, and the keyboard it listens to.

:class:`Screen` writes plain lines and keeps one status line at the bottom that redraws in
place (plain ANSI, no curses: it works over ssh and inside tmux). :class:`Keyboard` reads Enter,
space or ``q``: in cbreak mode on a terminal (no echo, no line editing; restored on exit),
line by line otherwise.
"""

from __future__ import annotations

import os
import select
import textwrap
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

import click

TICK = 0.1  # seconds between status-line redraws while pausing
CLEAR_LINE = "\r\x1b[2K"


class Screen:
    """Lines above, the status line (what ``status()`` says now) below them, on a terminal only."""

    def __init__(self, out: TextIO, *, tty: bool, colour: bool, width: int, status: Callable[[], str]) -> None:
        self.out = out
        self.tty = tty
        self.colour = colour
        self.width = width
        self.status = status
        self.status_shown = False

    def write(self, line: str, status: bool = True) -> None:
        if not self.colour:
            line = line.rstrip()
        if status:
            self.clear_status()
        self.out.write(line + "\n")
        if status:
            self.draw_status()
        self.out.flush()

    def style(self, text: str, **styles: Any) -> str:
        return click.style(text, **styles) if self.colour else text

    def rule(self, title: str) -> None:
        self.write("")
        head = f"━━ {title} "
        self.write(self.style(head + "━" * max(0, self.width - 1 - len(head)), bold=True))

    def wrap_write(self, text: str, indent: str = "", bold: bool = False) -> None:
        """Wrap to the screen; bullets (``•``) hang, paragraphs do not."""
        hanging = indent + "  " if text.startswith("•") else indent
        for line in textwrap.wrap(text, self.width - 1, initial_indent=indent, subsequent_indent=hanging) or [""]:
            self.write(self.style(line, bold=True) if bold else line)

    def draw_status(self) -> None:
        if not self.tty:
            return
        text = self.status()
        if not text:
            self.clear_status()
            return
        text = text[: self.width - 1]
        styled = self.style(text.ljust(self.width - 1), reverse=True, bold=True)
        self.out.write(CLEAR_LINE + styled)
        self.out.flush()
        self.status_shown = True

    def clear_status(self) -> None:
        if self.tty and self.status_shown:
            self.out.write(CLEAR_LINE)
            self.status_shown = False


class Keyboard:
    """The audience's keyboard: a context manager that puts a terminal in cbreak mode when ``cbreak``."""

    def __init__(self, stream: TextIO, cbreak: bool) -> None:
        self.stream = stream
        self.cbreak = cbreak
        self.fd: int | None = None
        self.saved_mode: list[Any] | None = None

    def __enter__(self) -> Keyboard:
        try:
            fd = self.stream.fileno()
        except (AttributeError, OSError, ValueError):
            fd = None
        self.fd = fd
        if fd is not None and self.cbreak and os.isatty(fd):
            try:
                import termios
                import tty

                self.saved_mode = termios.tcgetattr(fd)
                tty.setcbreak(fd)
            except (ImportError, OSError):
                self.saved_mode = None
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self.saved_mode is not None and self.fd is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved_mode)
            self.saved_mode = None

    def wait(self, tick: Callable[[], None]) -> bool:
        """Until Enter, space or ``q``, calling ``tick`` every :data:`TICK` seconds; True for ``q``."""
        if self.fd is None:
            return _quits(self.stream.readline())
        while True:
            tick()
            ready, _, _ = select.select([self.fd], [], [], TICK)
            if not ready:
                continue
            if self.saved_mode is not None:
                data = os.read(self.fd, 64).decode(errors="replace")
                if any(c in data for c in "qQ"):
                    return True
                if any(c in data for c in "\r\n "):
                    return False
            else:
                return _quits(self.stream.readline())


def _quits(line: str) -> bool:
    return line.strip().lower() in ("q", "quit")
