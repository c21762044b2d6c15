"""What `pgrace check` runs and what happened to it: what its renderers draw.

They live below both the check driver (:mod:`pgrace.drivers.check`) and the renderers
(:mod:`pgrace.render.check`, :mod:`pgrace.render.junit`), so drawing a result never
imports the machinery that produced it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pgrace.errors import EXIT_FAILED, EXIT_INVALID, EXIT_OK
from pgrace.model.scenario import Scenario
from pgrace.model.timeline import Run
from pgrace.servers.info import ServerInfo

if TYPE_CHECKING:
    from pgrace.errors import ScenarioError


@dataclass(frozen=True)
class PreparedCheck:
    """A parsed scenario, its expected files, and how its output is rendered."""

    path: Path
    scenario: Scenario
    expected: tuple[Path, ...]
    render: Callable[[Run], str]

    @property
    def name(self) -> str:
        return self.scenario.name


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
class CaseVerdict:
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


def differs_across_servers(verdicts: Sequence[CaseVerdict]) -> bool:
    """True when the same case behaved differently on different servers."""
    return len({v.signature for v in verdicts}) > 1


@dataclass
class Checked:
    """What ``pgrace check`` found: every case's verdict on every server, and the files that could not be read."""

    verdicts: list[CaseVerdict] = field(default_factory=list)
    invalid: list[ScenarioError] = field(default_factory=list)
    servers: list[ServerInfo] = field(default_factory=list)
    updated: int = 0

    @property
    def failed(self) -> int:
        return sum(1 for v in self.verdicts if not v.ok)

    @property
    def ok(self) -> bool:
        """Every file read, and every case passed on every server."""
        return not self.invalid and not self.failed

    @property
    def exit_code(self) -> int:
        """``pgrace check``'s: 2 when a file could not be read (the others still ran), else 1 when a case failed."""
        return EXIT_INVALID if self.invalid else EXIT_FAILED if self.failed else EXIT_OK
