"""What a load is asked to do and what it found: the types ``pgrace load``'s renderers draw."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pgrace.errors import ServerUnavailable

SAMPLE_EVERY_S = 0.05


class NoPgbench(ServerUnavailable):
    """No pgbench could be found for this server (exit 3, as a server that cannot be had)."""


@dataclass(frozen=True)
class Violation:
    """An invariant that did not hold after a load run."""

    check: str
    expected: str
    actual: str


@dataclass
class ClientRun:
    """What one pgbench run at one client count measured."""

    clients: int
    tps: float
    latency_ms: dict[str, float | None]
    failures: int
    retries: int
    transactions: int
    lock_waiters_max: int
    lock_waits_on: str | None
    violations: list[Violation] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "clients": self.clients,
            "tps": self.tps,
            "latency_ms": dict(self.latency_ms),
            "failures": self.failures,
            "retries": self.retries,
            "lock_waiters_max": self.lock_waiters_max,
            "violations": [{"check": v.check, "expected": v.expected, "actual": v.actual} for v in self.violations],
        }


@dataclass
class LoadResult:
    """One variant under load: a run per client count (fewer when interrupted)."""

    scenario: str
    variant: str
    server_version: str
    runs: list[ClientRun] = field(default_factory=list)
    interrupted: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "variant": self.variant,
            "server_version": self.server_version,
            "runs": [r.to_json() for r in self.runs],
        }


@dataclass(frozen=True)
class LoadOptions:
    """``clients``: one pgbench run per count; ``duration`` seconds each (``-T``), or ``transactions`` per client."""

    clients: tuple[int, ...] = (1, 2, 4, 8)
    duration: float | None = 5.0
    transactions: int | None = None
    pgbench: str | None = None
    sample_every: float = SAMPLE_EVERY_S
    setup_timeout: float = 60.0  # the scenario's and the load's setup, and the checks, each cut after this
    on_progress: Callable[[LoadResult, ClientRun], None] | None = None
