"""pgrace: reproduce PostgreSQL concurrency bugs on demand, against a real server.

The pipeline: a scenario file is parsed into a :class:`Scenario`; the runner runs its
sessions' steps in a fixed interleaving against a real PostgreSQL and records a
:class:`Run` (a timeline of typed events); renderers turn the run into text or JSON.

The commands are functions of the same names (:mod:`pgrace.api`): ``run``, ``compare``,
``check``, ``explore``, ``minimize``, ``sweep``, ``matrix``, ``load`` (pgbench), ``from_log``,
``list_scenarios``, ``show`` and ``clean``, each returning what the command's formats draw;
``read_scenario`` reads a scenario file.

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

    from pgrace.api import (
        check,
        clean,
        compare,
        explore,
        from_log,
        list_scenarios,
        load,
        matrix,
        minimize,
        read_scenario,
        run,
        show,
        sweep,
    )
    from pgrace.drivers.code import TracedConnection, explore_code, run_code
    from pgrace.drivers.searches import Exhaustive, Pct, PreemptionBounded, Reduced, Sample
    from pgrace.engine.options import RunOptions
    from pgrace.errors import (
        CodeError,
        Interrupted,
        OptionError,
        PgraceError,
        RunAborted,
        ScenarioError,
        ServerUnavailable,
        SetupFailed,
    )
    from pgrace.model.cases import Checked
    from pgrace.model.exploration import Exploration
    from pgrace.model.fromlog import FromLog
    from pgrace.model.load import Loaded
    from pgrace.model.matrix import Matrix
    from pgrace.model.minimized import Minimized
    from pgrace.model.outcomes import OutcomeClass
    from pgrace.model.results import Cleaned
    from pgrace.model.scenario import Scenario, Session, Step
    from pgrace.model.sweep import Sweep
    from pgrace.model.timeline import CheckResult, Run, StepRun
    from pgrace.proxy import explore_exec, run_exec
    from pgrace.servers import ServerInfo, open_server

_HOMES = {
    "CheckResult": "pgrace.model.timeline",
    "Checked": "pgrace.model.cases",
    "Cleaned": "pgrace.model.results",
    "FromLog": "pgrace.model.fromlog",
    "Loaded": "pgrace.model.load",
    "Matrix": "pgrace.model.matrix",
    "Minimized": "pgrace.model.minimized",
    "Sweep": "pgrace.model.sweep",
    "CodeError": "pgrace.errors",
    "Interrupted": "pgrace.errors",
    "OptionError": "pgrace.errors",
    "Exploration": "pgrace.model.exploration",
    "OutcomeClass": "pgrace.model.outcomes",
    "TracedConnection": "pgrace.drivers.code",
    "explore_code": "pgrace.drivers.code",
    "explore_exec": "pgrace.proxy",
    "run_exec": "pgrace.proxy",
    "run_code": "pgrace.drivers.code",
    "PgraceError": "pgrace.errors",
    "Run": "pgrace.model.timeline",
    "RunAborted": "pgrace.errors",
    "RunOptions": "pgrace.engine.options",
    "Scenario": "pgrace.model.scenario",
    "ScenarioError": "pgrace.errors",
    "ServerInfo": "pgrace.servers",
    "ServerUnavailable": "pgrace.errors",
    "Session": "pgrace.model.scenario",
    "SetupFailed": "pgrace.errors",
    "Step": "pgrace.model.scenario",
    "StepRun": "pgrace.model.timeline",
    "open_server": "pgrace.servers",
    **dict.fromkeys(("Exhaustive", "Pct", "PreemptionBounded", "Reduced", "Sample"), "pgrace.drivers.searches"),
    **dict.fromkeys(
        (
            "check",
            "clean",
            "compare",
            "explore",
            "from_log",
            "list_scenarios",
            "load",
            "read_scenario",
            "matrix",
            "minimize",
            "run",
            "show",
            "sweep",
        ),
        "pgrace.api",
    ),
}

__all__ = [
    "CheckResult",
    "Checked",
    "Cleaned",
    "CodeError",
    "Exhaustive",
    "Exploration",
    "FromLog",
    "Interrupted",
    "Loaded",
    "Matrix",
    "Minimized",
    "OptionError",
    "OutcomeClass",
    "Pct",
    "PgraceError",
    "PreemptionBounded",
    "Reduced",
    "Run",
    "RunAborted",
    "RunOptions",
    "Sample",
    "Scenario",
    "ScenarioError",
    "ServerInfo",
    "ServerUnavailable",
    "Session",
    "SetupFailed",
    "Step",
    "StepRun",
    "Sweep",
    "TracedConnection",
    "check",
    "clean",
    "compare",
    "explore",
    "explore_code",
    "explore_exec",
    "from_log",
    "list_scenarios",
    "load",
    "matrix",
    "minimize",
    "open_server",
    "read_scenario",
    "run",
    "run_code",
    "run_exec",
    "show",
    "sweep",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'pgrace' has no attribute {name!r}")
    import importlib  # here, not at the top: importing the package stays next to free

    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
