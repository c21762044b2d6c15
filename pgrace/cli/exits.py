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


def lost_server(exc: BaseException) -> str | None:
    """The one line for a connection the server ended (it stopped, crashed, or takes none), met anywhere.

    pgrace's drivers say so themselves where they expect it; one that reaches the top unsaid is the
    server's doing all the same (exit 3), not a bug of pgrace's to report.
    """
    if "psycopg" not in sys.modules:  # no connection was ever made
        return None
    from pgrace.engine.sqlerrors import lost_connection
    from pgrace.servers import scrub_secrets
    from pgrace.text import visible

    said = lost_connection(exc)
    return None if said is None else visible(scrub_secrets(f"the server went away ({said})"))


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
