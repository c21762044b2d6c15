"""Cleanup that a signal must not cut short: Ctrl-C and SIGTERM held back, then delivered."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold back Ctrl-C and SIGTERM while cleanup runs, then deliver them.

    A signal during cleanup would otherwise leave a server or a scratch database behind:
    the CLI turns SIGTERM into an exception, just like Ctrl-C, so a SIGTERM in teardown
    would leave the run directory of an embedded server.
    Only the main thread can install signal handlers; elsewhere this is a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def _remember(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous: dict[int, _Handler] = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, _remember)
    except ValueError:  # not the main interpreter
        _restore(previous)
        yield
        return
    try:
        yield
    finally:
        _restore(previous)
        for pending in dict.fromkeys(received):
            handler = previous[pending]
            if callable(handler):
                handler(pending, None)
            elif handler in (signal.SIG_DFL, None):
                os.kill(os.getpid(), pending)


_Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


def _restore(previous: dict[int, _Handler]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
