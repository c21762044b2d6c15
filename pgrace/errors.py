"""Every error pgrace raises on purpose, each with the exit code the CLI uses for it.

    PgraceError                     exit 1, base class
    ├── ScenarioError               exit 2, invalid input: a scenario or spec file (file:line),
    │   │                                   an option value, a malformed --dsn
    │   ├── CodeError                       session code run_code/explore_code cannot interleave
    │   ├── ExecError                       an --exec command that connected around the proxy, or never waited
    │   └── OptionError                     a parameter's value, or parameters that exclude each other
    ├── ScenarioFailed              exit 1, the scenario could not run to its end on this server:
    │   ├── SetupFailed                     its setup SQL failed, or
    │   └── StepsStuck                      its steps blocked each other (isolationtester: exit 1)
    ├── ServerUnavailable           exit 3, no PostgreSQL server could be had
    └── RunAborted                  exit 3, the server (or pgrace's control or observer
                                    connection, or a -j worker process) went away in
                                    the middle of a run

    KeyboardInterrupt
    ├── Terminated                  SIGTERM, as Ctrl-C is SIGINT
    └── Interrupted                 either, stopping a command that had results: ``partial`` holds them

Exit codes, one meaning each (the CLI's help and docs/reference/exit-codes.md carry the same table):

    0  ran, and every expectation held
    1  ran, and an expectation did not hold, or the scenario could not run to its end
    2  invalid input
    3  no server could be had (it could not be started or reached, or went away)
    4  internal error: a bug in pgrace (PGRACE_DEBUG=1 shows the traceback)
    130 / 143  interrupted by SIGINT / SIGTERM, after cleaning up
    141  stdout was closed before pgrace finished writing (e.g. piped into `head`)

The CLI turns any of these into one line on stderr and the class's exit code; nothing
else in pgrace prints them.  SQL errors raised *by a step* are not exceptions at all:
they are recorded in the timeline as data, with their SQLSTATE.
"""

from __future__ import annotations

from typing import Generic, TypeVar

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_NO_SERVER = 3
EXIT_INTERNAL = 4
EXIT_BROKEN_PIPE = 141
EXIT_SIGINT = 130
EXIT_SIGTERM = 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an exception so that every context manager cleans up as for Ctrl-C."""


Partial = TypeVar("Partial")


class Interrupted(KeyboardInterrupt, Generic[Partial]):
    """Ctrl-C or SIGTERM (``by``) stopped a command that had results already: ``partial`` holds them.

    Still a KeyboardInterrupt, so that every cleanup on the way up runs as for any interrupt
    and the process ends with 130 or 143, after showing what was measured.
    """

    def __init__(self, partial: Partial, by: KeyboardInterrupt) -> None:
        super().__init__()
        self.partial = partial
        self.by: KeyboardInterrupt = by.by if isinstance(by, Interrupted) else by

    @property
    def terminated(self) -> bool:
        """SIGTERM stopped it, not Ctrl-C."""
        return isinstance(self.by, Terminated)


class PgraceError(Exception):
    """Base class: a failure that pgrace reports as one line and an exit code."""

    exit_code = EXIT_FAILED


class _Located(PgraceError):
    """An error that may name the file and line it is about."""

    def __init__(self, message: str, file: str | None = None, line: int | None = None) -> None:
        self.message = message
        self.file = file
        self.line = line
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.file is None:
            return self.message
        if self.line is None:
            return f"{self.file}: {self.message}"
        return f"{self.file}:{self.line}: {self.message}"


class ScenarioError(_Located):
    """The input is invalid: a scenario or spec file, an option value or a connection string."""

    exit_code = EXIT_INVALID


class OptionError(ScenarioError):
    """A parameter's value (``parameter``: the library function's keyword, e.g. ``"tags"``), or parameters
    that exclude each other (``parameter`` None).

    The message says what is wrong with the value, not whose it is: a Python caller reads
    ``parameter: message``; the CLI names the option that sets the parameter, as click says
    a bad option.
    """

    exit_code = EXIT_INVALID

    def __init__(self, message: str, parameter: str | None = None) -> None:
        self.parameter = parameter
        super().__init__(message)

    def __str__(self) -> str:
        return self.message if self.parameter is None else f"{self.parameter}: {self.message}"


class ScenarioFailed(_Located):
    """The scenario ran on a server but could not reach its end: a property of the scenario.

    ``run`` holds what was recorded up to the failure (set by the runner): a
    :class:`pgrace.model.timeline.Run`, which this bottom layer does not import (check it with ``isinstance``).
    """

    exit_code = EXIT_FAILED
    run: object = None


class SetupFailed(ScenarioFailed):
    """The scenario's setup SQL was rejected by the server (isolationtester: ``setup failed``, exit 1)."""


class StepsStuck(ScenarioFailed):
    """Steps that can never finish: mutually-blocking markers, or a step that outlived its cancel."""


class ServerUnavailable(PgraceError):
    """No server could be started or reached."""

    exit_code = EXIT_NO_SERVER


class RunAborted(PgraceError):
    """The server, pgrace's control or observer connection, or a ``-j`` worker process went away during a run.

    A scenario session losing its connection is not an error: it is recorded in the run.
    """

    exit_code = EXIT_NO_SERVER

    @classmethod
    def server_gone(cls, detail: str) -> RunAborted:
        """The server stopped or crashed mid-run; ``detail`` is what the connection that met it was told."""
        return cls(f"the server went away during the run ({detail})")


class ExecError(ScenarioError):
    """An ``--exec`` command pgrace cannot order: it reached the run's database around the proxy, or never waited."""


class CodeError(ScenarioError):
    """Session code that pgrace cannot interleave (``run_code``/``explore_code``), named by its file:line."""
