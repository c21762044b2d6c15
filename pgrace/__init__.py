"""pgrace: reproduce PostgreSQL concurrency bugs on demand, against a real server.

The pipeline: a scenario file is parsed into a :class:`Scenario`; the runner runs its
sessions' steps in a fixed interleaving against a real PostgreSQL and records a
:class:`Run` (a timeline of typed events); renderers turn the run into text or JSON.
"""

from pgrace.api import run
from pgrace.catalog import load
from pgrace.errors import PgraceError, RunAborted, ScenarioError, ServerUnavailable, SetupFailed
from pgrace.model import Scenario, Session, Step
from pgrace.runner import RunOptions
from pgrace.servers import ServerInfo, open_server
from pgrace.timeline import CheckResult, Run, StepRun

__all__ = [
    "CheckResult",
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
    "load",
    "open_server",
    "run",
]
