"""Which interleavings explore runs: one value, so no two searches can be asked for at once.

* :class:`Reduced` (the default): every interleaving, one run of each set of equivalent ones
  (partial-order reduction, :mod:`pgrace.drivers.reduce`), or each one where the steps show
  that every order matters;
* :class:`Exhaustive`: every interleaving, each run;
* :class:`Sample`: a seeded sample of the numbered interleavings;
* :class:`PreemptionBounded`: every schedule with at most ``bound`` preemptions;
* :class:`Pct`: ``runs`` PCT schedules of depth ``depth`` (:mod:`pgrace.drivers.bounded`).

Splitting the work (a shard, ``jobs`` processes) is not a search: it stays beside it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = [
    "REDUCED",
    "Exhaustive",
    "Pct",
    "PreemptionBounded",
    "Reduced",
    "Sample",
    "SearchMode",
    "fitted",
    "runs_asked",
]


@dataclass(frozen=True)
class Reduced:
    """Every interleaving, one run of each set of equivalent ones (the default search)."""


@dataclass(frozen=True)
class Exhaustive:
    """Every interleaving, each one run."""


@dataclass(frozen=True)
class Sample:
    """A seeded sample of ``size`` interleavings of the numbered space, each one run.

    A size at least the space's is the whole space, run reduced (``reduce``) or every interleaving.
    """

    size: int
    seed: int = 0
    reduce: bool = True


@dataclass(frozen=True)
class PreemptionBounded:
    """Every schedule with at most ``bound`` preemptions (switches away from a session that could go on).

    ``runs``: at most that many runs (None: the bounded search's own cap).
    """

    bound: int
    runs: int | None = None


@dataclass(frozen=True)
class Pct:
    """``runs`` PCT schedules of depth ``depth``, drawn from ``seed`` (None: 100 of them)."""

    depth: int
    runs: int | None = None
    seed: int = 0


SearchMode = Reduced | Exhaustive | Sample | PreemptionBounded | Pct
"""The search explore runs: one of the five."""

REDUCED = Reduced()
"""The default search."""


def runs_asked(search: SearchMode) -> int | None:
    """The runs ``search`` asks for at most: a sample's size, a bounded search's cap (None: the search's own)."""
    if isinstance(search, Sample):
        return search.size
    if isinstance(search, PreemptionBounded | Pct):
        return search.runs
    return None


def fitted(search: SearchMode, steps: int) -> SearchMode:
    """``search`` for a scenario of ``steps`` steps: K and D at most what they allow, where they mean every schedule."""
    if isinstance(search, PreemptionBounded):
        return dataclasses.replace(search, bound=min(search.bound, max(steps - 1, 0)))
    if isinstance(search, Pct):
        return dataclasses.replace(search, depth=min(search.depth, max(steps, 1)))
    return search
