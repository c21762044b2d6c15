"""pgrace: reproduce PostgreSQL concurrency bugs on demand, against a real server.

The pipeline: a scenario file is parsed into a :class:`Scenario`; the runner runs its
sessions' steps in a fixed interleaving against a real PostgreSQL and records a
:class:`Run` (a timeline of typed events); renderers turn the run into text or JSON.

The public names are imported on first use (PEP 562), so that importing a submodule,
such as the console entry point, does not pay for psycopg (and cannot be caught by
Ctrl-C half-way through importing it).
"""

from __future__ import annotations

__version__ = "0.1.0"
"""pgrace's version: the one place it is written (the build reads it from here)."""

# Not `from typing import TYPE_CHECKING`: typing pulls in re, enum and collections (~10 ms),
# and the console entry can only take over Ctrl-C once this package is imported.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from pgrace.api import run
    from pgrace.catalog import load
    from pgrace.code import CodeClass, CodeExploration, TracedConnection, explore_code, run_code
    from pgrace.errors import CodeError, PgraceError, RunAborted, ScenarioError, ServerUnavailable, SetupFailed
    from pgrace.model import Scenario, Session, Step
    from pgrace.runner import RunOptions
    from pgrace.servers import ServerInfo, open_server
    from pgrace.timeline import CheckResult, Run, StepRun

_HOMES = {
    "CheckResult": "pgrace.timeline",
    "CodeClass": "pgrace.code",
    "CodeError": "pgrace.errors",
    "CodeExploration": "pgrace.code",
    "TracedConnection": "pgrace.code",
    "explore_code": "pgrace.code",
    "run_code": "pgrace.code",
    "PgraceError": "pgrace.errors",
    "Run": "pgrace.timeline",
    "RunAborted": "pgrace.errors",
    "RunOptions": "pgrace.runner",
    "Scenario": "pgrace.model",
    "ScenarioError": "pgrace.errors",
    "ServerInfo": "pgrace.servers",
    "ServerUnavailable": "pgrace.errors",
    "Session": "pgrace.model",
    "SetupFailed": "pgrace.errors",
    "Step": "pgrace.model",
    "StepRun": "pgrace.timeline",
    "load": "pgrace.catalog",
    "open_server": "pgrace.servers",
    "run": "pgrace.api",
}

__all__ = [
    "CheckResult",
    "CodeClass",
    "CodeError",
    "CodeExploration",
    "PgraceError",
    "Run",
    "RunAborted",
    "RunOptions",
    "Scenario",
    "ScenarioError",
    "ServerInfo",
    "ServerUnavailable",
    "Session",
    "SetupFailed",
    "Step",
    "StepRun",
    "TracedConnection",
    "explore_code",
    "load",
    "open_server",
    "run",
    "run_code",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'pgrace' has no attribute {name!r}")
    import importlib  # here, not at the top: importing the package stays next to free

    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
