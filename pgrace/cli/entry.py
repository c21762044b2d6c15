"""The ``pgrace`` console command, kept tiny so it answers signals from the first instant.

It only imports the standard library before it takes over SIGINT and SIGTERM: Ctrl-C
half-way through importing psycopg or click then ends in one line and exit 130, never a
traceback: importing :mod:`pgrace.cli`, its package, imports nothing. The commands live beside it.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # C module: `signal` first imports enum (ms of traceback-prone Ctrl-C)

_early: list[int] = []


def _remember(signum: int, frame: object) -> None:
    _early.append(signum)


# From here until main() is ready, a signal is remembered rather than raised mid-import.
_signal.signal(_signal.SIGINT, _remember)
_signal.signal(_signal.SIGTERM, _remember)

import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from typing import NoReturn  # noqa: E402

from pgrace.cli.exits import exit_code_of_interrupt, raise_terminated, report_internal_error  # noqa: E402
from pgrace.errors import (  # noqa: E402
    EXIT_BROKEN_PIPE,
    EXIT_INTERNAL,
    EXIT_SIGTERM,
    Terminated,
)


def main() -> NoReturn:
    """Run the command line; every way out is one of the documented exit codes."""
    code: int
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, raise_terminated)
        if _early:
            raise Terminated() if _early[0] == signal.SIGTERM else KeyboardInterrupt()
        from pgrace.cli import main as cli

        cli.main(prog_name="pgrace")
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if isinstance(done.code, str):
            print(done.code, file=sys.stderr)
    except KeyboardInterrupt as exc:
        code = exit_code_of_interrupt(exc)
        print(f"pgrace: {'terminated' if code == EXIT_SIGTERM else 'interrupted'}", file=sys.stderr)
    except BrokenPipeError:  # stdout closed early (`pgrace run x | head`): nothing more to say
        code = EXIT_BROKEN_PIPE
    except BaseException as exc:  # a bug in pgrace: one line, unless asked for the traceback
        code = EXIT_INTERNAL
        report_internal_error(exc)
    # Past this point nothing needs cleaning up: a late signal just ends the process.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _exit(code)


def _exit(code: int) -> NoReturn:
    """End the process, skipping the interpreter's own teardown when nothing else runs.

    Tearing down the modules and psycopg's libraries (libpq, OpenSSL) costs ~40 ms, more than
    a tenth of a whole run, and frees only memory the kernel takes back anyway. The exit
    handlers still run and the streams are flushed; every file, connection and server was
    closed by the command itself. With another thread alive, the ordinary exit waits for it.
    """
    import atexit
    import threading

    if threading.active_count() > 1:
        _flush()
        sys.exit(code)
    atexit._run_exitfuncs()
    _flush()
    os._exit(code)


def _flush() -> None:
    """Flush now, so that a closed pipe is not reported by the interpreter at exit."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # nobody reads any more: send the rest nowhere
            with open(os.devnull, "w") as devnull:
                os.dup2(devnull.fileno(), stream.fileno())
