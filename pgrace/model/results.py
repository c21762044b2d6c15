"""What the library's drivers return beyond a single run, for a caller or a renderer to read.

Kept apart from the drivers so that a renderer names these types without importing the
runner, and a caller holds everything a format draws in one object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pgrace.model.scenario import Scenario


@dataclass
class Cleaned:
    """What ``clean`` removed from a server and from the temporary folder, and what it left (and why)."""

    server: str
    removed: list[str] = field(default_factory=list)
    work_dirs: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Shown:
    """A scenario told without running it (``show``): ``variant`` of the file whose first variant is ``scenario``."""

    scenario: Scenario
    variant: Scenario
