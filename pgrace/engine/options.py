"""How a scenario runs (:class:`RunOptions`): a value of its own, so that saying how costs no import of the engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pgrace.model.scenario import Step
    from pgrace.model.timeline import Event, LockKinds


@dataclass(frozen=True)
class RunOptions:
    """How to run. ``before_step`` lets a presenter pace the run (it may block)."""

    step_timeout: float = 10.0
    track_row_locks: bool = True  # False: observe no locks at all (isolationtester output shows none)
    lock_kinds: LockKinds = "rows"  # what the locks column shows; every kind is recorded
    before_step: Callable[[Step], None] | None = None
    on_event: Callable[[Event], None] | None = None
    on_idle: Callable[[], None] | None = None  # called at most every 100 ms while the runner waits
    # isolationtester's semantics: its wait slices on one socket, its session options, no :variables,
    # no overtaking; a spec's run always has them (the scenario runner sets it from the scenario).
    isolationtester: bool = False
    # For `pgrace explore`, where a permutation is one interleaving among many:
    checks_each_permutation: bool = False  # final checks after every permutation, before its teardown
    defer_busy_sessions: bool = False  # a step whose session is still blocked waits while others go ahead
    reset_sessions: bool = False  # after each permutation: roll back, DISCARD ALL (advisory locks, SETs, temps)
    describe_waits: bool = True  # False: record that a step waited, not on what (explore only classifies)
    footprints: bool = False  # record what every session holds after each step (explore's reduction)
