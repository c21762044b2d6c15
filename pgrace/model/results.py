"""What ``clean`` and ``show`` return, for a caller or a renderer to read.

Every command's result is a model type, one module each, so that a renderer names it without
importing the driver that made it: a run's :class:`~pgrace.model.timeline.Run`, explore's
:mod:`~pgrace.model.exploration`, sweep's :mod:`~pgrace.model.sweep`, check's
:mod:`~pgrace.model.cases`, load's :mod:`~pgrace.model.load`, matrix's :mod:`~pgrace.model.matrix`,
minimize's :mod:`~pgrace.model.minimized`, from-log's :mod:`~pgrace.model.fromlog`. Each that judges
says so in ``ok`` and in ``exit_code``, the code the CLI exits with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pgrace.errors import EXIT_OK

if TYPE_CHECKING:
    from pgrace.model.scenario import Scenario


@dataclass
class Cleaned:
    """What ``clean`` removed from a server and from the temporary folder, and what it left (and why)."""

    server: str
    removed: list[str] = field(default_factory=list)
    work_dirs: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Always: what clean left is said (``skipped``: in use by a live run, or not pgrace's), not a failure."""
        return True

    @property
    def exit_code(self) -> int:
        """``pgrace clean``'s: 0 once it swept (a server it cannot reach raises instead)."""
        return EXIT_OK


@dataclass(frozen=True)
class Shown:
    """A scenario told without running it (``show``): ``variant`` of the file whose first variant is ``scenario``."""

    scenario: Scenario
    variant: Scenario
