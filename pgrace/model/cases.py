"""What `pgrace check` runs and what happened to it: the results its renderers draw.

They live below both the check driver (:mod:`pgrace.drivers.check`) and the renderers
(:mod:`pgrace.render.check`, :mod:`pgrace.render.junit`), so drawing a result never
imports the machinery that produced it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pgrace.model.scenario import Scenario
from pgrace.model.timeline import Run
from pgrace.servers.info import ServerInfo

if TYPE_CHECKING:
    from pgrace.drivers.speccheck import PreparedCheck


@dataclass(frozen=True)
class Case:
    """One check to run: a scenario variant, or a spec with its expected output."""

    path: Path
    scenario: Scenario
    golden: Path | None = None  # the text timeline to compare with (pgrace scenarios)
    spec: PreparedCheck | None = None  # isolation specs
    paired: bool = False  # one of a bug and a fix: under --explore, a bug needs one reproducing interleaving

    @property
    def name(self) -> str:
        if self.spec is not None:
            return self.scenario.name
        return f"{self.scenario.name} ({self.scenario.variant})"


@dataclass
class CaseResult:
    """What happened to one case on one server."""

    case: Case
    server: ServerInfo
    ok: bool
    seconds: float
    problems: list[str] = field(default_factory=list)
    diff: str = ""
    run: Run | None = None
    updated: bool = False
    guarantee: str = ""  # what a bounded exploration covered ("every schedule with at most 2 preemptions, ...")

    @property
    def signature(self) -> str:
        """What the case did, to tell servers apart in a matrix: verdict and waits/errors per step."""
        if self.run is None:
            return "not run"
        steps = []
        for step in self.run.step_runs():
            error = step.outcome.error.sqlstate if step.outcome and step.outcome.error else ""
            steps.append(f"{step.step}:{'W' if step.waited else ''}{error}")
        return ("ok" if self.ok else "FAIL") + " " + " ".join(steps)


def differs_across_servers(results: Sequence[CaseResult]) -> bool:
    """True when the same case behaved differently on different servers."""
    return len({r.signature for r in results}) > 1
