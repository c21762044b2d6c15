"""How the process ends: SIGTERM as an exception, the exit code of an interrupt, the one line for a bug.

:mod:`pgrace.errors` holds the error classes only; what the entry point and the CLI do with
them when they reach the top lives here.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import TYPE_CHECKING

from pgrace.errors import EXIT_SIGINT, EXIT_SIGTERM, Interrupted, Terminated

if TYPE_CHECKING:
    from types import FrameType


def raise_terminated(signum: int, frame: FrameType | None) -> None:
    """The SIGTERM handler: raise :class:`Terminated`."""
    raise Terminated()


def exit_code_of_interrupt(exc: KeyboardInterrupt) -> int:
    """130 for Ctrl-C, 143 for SIGTERM: the shell's 128 + signal number (an :class:`Interrupted` carries which)."""
    by = exc.by if isinstance(exc, Interrupted) else exc
    return EXIT_SIGTERM if isinstance(by, Terminated) else EXIT_SIGINT


_SERVER_ENDED = ("57P01", "57P02", "57P03")  # admin shutdown, crash shutdown, cannot connect now


def lost_server(exc: BaseException) -> str | None:
    """The one line for a connection the server ended (it stopped, crashed, or takes none), met anywhere.

    pgrace's drivers say so themselves where they expect it; one that reaches the top unsaid is the
    server's doing all the same (exit 3), not a bug of pgrace's to report. A connection pgrace itself
    closed, or an error of a statement's, is no such thing.
    """
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(exc, psycopg.OperationalError):
        return None
    state = exc.sqlstate
    broken = exc.pgconn is not None and exc.pgconn.status == psycopg.pq.ConnStatus.BAD
    if state in _SERVER_ENDED or (state or "").startswith("08") or (state is None and broken):
        from pgrace.servers import scrub_secrets
        from pgrace.text import visible

        said = str(exc).strip().splitlines()
        return visible(scrub_secrets(f"the server went away ({said[0] if said else type(exc).__name__})"))
    return None


def report_internal_error(exc: BaseException) -> None:
    """A bug in pgrace: one line on stderr naming the exception; the whole traceback with PGRACE_DEBUG=1."""
    from pgrace.servers import scrub_secrets
    from pgrace.text import visible

    def safe(text: str) -> str:  # a libpq message in it may quote a DSN; server text may hold ESC
        return visible(scrub_secrets(text))

    debug = bool(os.environ.get("PGRACE_DEBUG"))
    if debug:
        sys.stderr.write(safe("".join(traceback.format_exception(exc))))
    first = str(exc).strip().splitlines()
    detail = f": {first[0]}" if first else ""
    hint = "" if debug else " (set PGRACE_DEBUG=1 to see the traceback)"
    print(safe(f"pgrace: internal error, please report it: {type(exc).__name__}{detail}{hint}"), file=sys.stderr)
