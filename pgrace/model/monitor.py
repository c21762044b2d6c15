"""How long work reports progress to whoever watches it, and notes for the user: the drivers never print."""

from __future__ import annotations

from collections.abc import Callable, Sized
from typing import Protocol

from pgrace import bounds

__all__ = ["Monitor", "Note", "Unwatched"]


class Monitor(Protocol):
    """Where long work reports how far it got (the CLI's progress line); the drivers never print."""

    done: int

    def start(self, label: str, total: int, unit: str) -> None: ...

    def update(self, done: int, detail: str = "") -> None: ...

    def note(self, text: str) -> None: ...

    def pause(self) -> None: ...

    def close(self) -> None: ...


class Unwatched:
    """The monitor of a caller that does not watch."""

    done = 0

    def start(self, label: str, total: int, unit: str) -> None:
        self.done = 0

    def update(self, done: int, detail: str = "") -> None:
        self.done = done

    def note(self, text: str) -> None:
        pass

    def pause(self) -> None:
        pass

    def close(self) -> None:
        pass


Note = Callable[[str], None]


def note_long(monitor: Monitor, label: str, total: int, jobs: int) -> None:
    """A long job says how long before it starts, on a terminal or in a CI log."""
    if total > bounds.LONG_INTERLEAVINGS:
        processes = f" in {jobs} processes" if jobs > 1 else ""
        monitor.note(f"pgrace: {label}: {total:,} interleavings to run{processes}")


def following(monitor: Monitor, label: str, done: Sized, jobs: int) -> Callable[[int, int], None]:
    """A job's progress over its interleavings on ``monitor``, after the ``done`` items counted when it is told."""

    def interleaved(ran: int, total: int) -> None:
        if ran == 0:
            note_long(monitor, label, total, jobs)
        monitor.update(len(done), f"{label}: {ran:,}/{total:,} interleavings")

    return interleaved
