"""Run a scenario's steps in their fixed interleaving: see :mod:`pgrace.engine.runner`.

Kept as the public home of :class:`RunOptions` and :func:`run_scenario` (callers import them from here).
"""

from __future__ import annotations

from pgrace.engine.options import RunOptions
from pgrace.engine.runner import Runner, run_scenario

__all__ = ["RunOptions", "Runner", "run_scenario"]
