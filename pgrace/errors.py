"""Every error pgrace raises on purpose, each with the exit code the CLI uses for it.

    PgraceError                     exit 1, base class
    ├── ScenarioError               exit 2, a scenario file or option is invalid (file:line)
    │   └── SetupFailed             exit 2, the scenario's own setup SQL failed on the server
    ├── ServerUnavailable           exit 3, no PostgreSQL server could be had
    └── RunAborted                  exit 3, the server (or pgrace's control or observer
                                    connection) went away in the middle of a run

The CLI turns any of these into one line on stderr and the class's exit code; nothing
else in pgrace prints them.  SQL errors raised *by a step* are not exceptions at all:
they are recorded in the timeline as data, with their SQLSTATE.
"""

from __future__ import annotations


class PgraceError(Exception):
    """Base class: a failure that pgrace reports as one line and an exit code."""

    exit_code = 1


class ScenarioError(PgraceError):
    """The input is invalid: a scenario or spec file, or an option value."""

    exit_code = 2

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


class SetupFailed(ScenarioError):
    """The scenario's setup SQL was rejected by the server."""


class ServerUnavailable(PgraceError):
    """No server could be started or reached."""

    exit_code = 3


class RunAborted(PgraceError):
    """The server, or pgrace's control or observer connection, went away during a run.

    A scenario session losing its connection is not an error: it is recorded in the run.
    """

    exit_code = 3
