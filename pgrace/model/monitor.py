"""How long work reports progress to whoever watches it, and notes for the user: the drivers never print."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

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
