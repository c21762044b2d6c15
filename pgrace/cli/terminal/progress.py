"""Progress of long work on a terminal: one line on stderr, redrawn in place, cleared at the end.

Off a terminal (a CI log, a pipe) :class:`Progress` draws nothing, so logs stay clean; only
:meth:`Progress.note` lines (the size of a long job, before it starts) are written there.
The drivers report counts through callbacks; they never print.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from typing import TextIO

from pgrace.text import visible

CLEAR = "\r\x1b[K"  # back to the line's start, erase to its end


class Progress:
    """``label: done/total unit · rate · time left · detail`` on ``stream`` when it is a terminal."""

    def __init__(
        self,
        stream: TextIO,
        *,
        clock: Callable[[], float] = time.monotonic,
        width: int | None = None,
        interval: float = 0.1,
    ) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self.clock = clock
        self.width = width
        self.interval = interval  # redraw at most this often (seconds), but always the first and last count
        self.label = ""
        self.unit = ""
        self.total = 0
        self.done = 0
        self.detail = ""
        self.started = clock()
        self.drawn_at = -math.inf
        self.drawn = False

    def start(self, label: str, total: int, unit: str) -> None:
        """A new job of ``total`` units: its clock starts now."""
        self.label, self.total, self.unit = visible(label), total, unit
        self.done, self.detail = 0, ""
        self.started = self.clock()
        self._draw(force=True)

    def update(self, done: int, detail: str = "") -> None:
        self.done, self.detail = done, visible(detail)
        self._draw(force=done >= self.total)

    def note(self, text: str) -> None:
        """A line that stays (on a terminal or not), above the progress line."""
        self.pause()
        self.stream.write(visible(text) + "\n")
        self.stream.flush()
        if self.total:
            self._draw(force=True)

    def close(self) -> None:
        self.pause()
        self.total = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def line(self) -> str:
        """The progress line as it reads now."""
        parts = [f"{self.label}: {self.done:,}/{self.total:,} {self.unit}"]
        elapsed = self.clock() - self.started
        if self.done and elapsed > 0:
            rate = self.done / elapsed
            parts.append(f"{rate:,.1f}/s" if rate < 100 else f"{rate:,.0f}/s")
            if self.done < self.total:
                parts.append(f"{duration((self.total - self.done) / rate)} left")
        if self.detail:
            parts.append(self.detail)
        return " · ".join(parts)

    def _draw(self, force: bool) -> None:
        if not self.live:
            return
        now = self.clock()
        if not force and now - self.drawn_at < self.interval:
            return
        width = self.width or shutil.get_terminal_size(fallback=(80, 24)).columns
        self.stream.write(CLEAR + self.line()[: max(width - 1, 10)])  # never wrap: \r returns to one line only
        self.stream.flush()
        self.drawn_at, self.drawn = now, True

    def pause(self) -> None:
        """Erase the line (to write something else on the terminal); the next update draws it again."""
        if self.drawn:
            self.stream.write(CLEAR)
            self.stream.flush()
            self.drawn = False


def duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3 h 20 min``: as precise as a reader of time left needs."""
    if seconds < 60:
        return f"{max(math.ceil(seconds), 1)} s"
    minutes = math.ceil(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"
