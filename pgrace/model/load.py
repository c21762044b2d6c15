"""What a load is asked to do and what it found: the types ``pgrace load``'s renderers draw."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgrace import bounds
from pgrace.errors import EXIT_FAILED, EXIT_OK, OptionError, ServerUnavailable

SAMPLE_EVERY_S = 0.05
#: The most of the server's log one client count reads back for its lock waits; a load that logs more is cut.
MAX_LOG_BYTES = 256 << 20


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
    """The most clients seen waiting on a lock at once: sampled from pg_locks every 50 ms."""
    lock_waits_on: str | None
    """What the clients waited on most: counted from the log where it was read, else the largest sample's."""
    violations: list[Violation] = field(default_factory=list)
    lock_waits: int | None = None
    """Every lock wait of 1 ms or more, as the server logged it (None: a server whose log pgrace cannot read)."""
    lock_waited_ms: float | None = None
    """Those waits' milliseconds added up (the ones that ended with the lock taken)."""
    lock_waits_by: tuple[tuple[str, int], ...] = ()
    """The logged waits by what they waited on ("a row of jobs"), most first."""
    lock_waits_rows: tuple[tuple[str, str, int], ...] = ()
    """The rows waited on most: (table, ctid, waits), as the log names them."""
    lock_waits_cut: bool = False
    """The log of this count was longer than pgrace reads: the counts are of its start only."""

    def to_json(self) -> dict[str, Any]:
        return {
            "clients": self.clients,
            "tps": self.tps,
            "latency_ms": dict(self.latency_ms),
            "failures": self.failures,
            "retries": self.retries,
            "lock_waiters_max": self.lock_waiters_max,
            "lock_waits": self.lock_waits,
            "lock_waited_ms": self.lock_waited_ms,
            "lock_waits_on": [{"on": on, "waits": n} for on, n in self.lock_waits_by],
            "lock_waits_rows": [{"table": t, "ctid": c, "waits": n} for t, c, n in self.lock_waits_rows],
            "lock_waits_cut": self.lock_waits_cut,
            "violations": [{"check": v.check, "expected": v.expected, "actual": v.actual} for v in self.violations],
        }


@dataclass
class LoadSeries:
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


@dataclass
class Loaded:
    """What ``pgrace load`` found: each variant's measurements, or (with ``emit``) the files written instead."""

    series: list[LoadSeries] = field(default_factory=list)
    emitted: list[Path] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No invariant was violated at any client count (nothing ran: nothing was)."""
        return not any(run.violations for one in self.series for run in one.runs)

    @property
    def exit_code(self) -> int:
        """``pgrace load``'s: 1 when an invariant was violated."""
        return EXIT_OK if self.ok else EXIT_FAILED


@dataclass(frozen=True)
class LoadOptions:
    """``clients``: one pgbench run per count; ``duration`` seconds each (``-T``), or ``transactions`` per client."""

    clients: tuple[int, ...] = (1, 2, 4, 8)
    duration: float | None = 5.0
    transactions: int | None = None
    pgbench: str | None = None
    sample_every: float = SAMPLE_EVERY_S
    setup_timeout: float = 60.0  # the scenario's and the load's setup, and the checks, each cut after this
    on_progress: Callable[[LoadSeries, ClientRun], None] | None = None

    @classmethod
    def asked(
        cls,
        clients: Sequence[int],
        duration: float | None = None,
        transactions: int | None = None,
        setup_timeout: float | None = None,
        pgbench: str | None = None,
        on_progress: Callable[[LoadSeries, ClientRun], None] | None = None,
    ) -> LoadOptions:
        """What a caller asked for, checked as pgbench takes it (whole seconds, whole counts), defaults filled in.

        A value out of its bounds is an :class:`OptionError` naming its parameter.
        """
        counts = tuple(clients)
        if not counts or not all(_whole(c) and 1 <= c <= bounds.MAX_CLIENTS for c in counts):
            raise OptionError(
                f"client counts are whole numbers from 1 to {bounds.MAX_CLIENTS}, like (1, 2, 4, 8); not {clients!r}",
                "clients",
            )
        if transactions is not None and not (_whole(transactions) and 1 <= transactions <= bounds.MAX_TRANSACTIONS):
            raise OptionError(
                f"a whole number from 1 to {bounds.MAX_TRANSACTIONS}, not {transactions!r}", "transactions"
            )
        seconds = _seconds(duration, "duration")
        if seconds is not None and transactions is not None:
            raise OptionError("duration and transactions exclude each other")
        return cls(
            clients=counts,
            duration=None if transactions is not None else float(seconds or 5),
            transactions=transactions,
            pgbench=pgbench,
            setup_timeout=float(_seconds(setup_timeout, "setup_timeout") or 60),
            on_progress=on_progress,
        )


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _seconds(value: float | None, parameter: str) -> int | None:
    """pgbench counts whole seconds: 1 to a day."""
    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and float(value).is_integer() and 1 <= value <= bounds.MAX_LOAD_SECONDS):
        raise OptionError(f"a whole number of seconds from 1 to {bounds.MAX_LOAD_SECONDS}, not {value!r}", parameter)
    return int(value)
