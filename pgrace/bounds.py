"""How much one explore, sweep or check --explore takes on, and why each bound is where it is.

Measured here (2 cores, the embedded server): an interleaving of a 9-step scenario takes
about 5 ms in one process, a sweep combination in the file's order about 0.2 s.

* ``--max N`` is at most :data:`MAX_SAMPLE`: a million interleavings are about an hour and a
  half in one process, and the sample's numbers (held while it runs) about 100 MB.
* ``-j N`` is at most :func:`max_jobs`: a worker spends most of its time waiting for the
  server, so a few per core keep the machine busy; more only compete for it (each one is a
  process, a scratch database and a connection per session).
* A sweep has at most :data:`MAX_COMBINATIONS`: each one is loaded before anything runs,
  and a thousand are a few minutes in the file's order (each an exploration with ``--explore``).
* Sessions tied to each other by captures are counted over their joint positions, at most
  :data:`MAX_TIED_POSITIONS` (about a second); the other sessions interleave freely and
  cost nothing to count.

A job longer than :data:`LONG_INTERLEAVINGS` interleavings or :data:`LONG_COMBINATIONS`
combinations (a minute or more) says so on stderr before it starts.
"""

from __future__ import annotations

import os

from pgrace.errors import OptionError, ScenarioError

MAX_SAMPLE = 1_000_000
MAX_COMBINATIONS = 1_000
MAX_TIED_POSITIONS = 100_000
JOBS_PER_CPU = 4
MAX_CLIENTS = 1000  # pgbench clients at once: a thousand connections is past any machine this runs on
MAX_LOAD_SECONDS = 86400  # a load's -T and --setup-timeout: a day
MAX_TRANSACTIONS = 86400  # a load's -t, per client
LONG_INTERLEAVINGS = 10_000
LONG_COMBINATIONS = 100


def max_jobs() -> int:
    """The most processes ``-j`` may run: a few per CPU this machine has."""
    return JOBS_PER_CPU * (os.cpu_count() or 1)


def check_jobs(jobs: int) -> None:
    if not 1 <= jobs <= max_jobs():
        raise OptionError(
            f"{jobs:,}: at most {max_jobs()} processes on this machine"
            f" ({JOBS_PER_CPU} per CPU, {os.cpu_count() or 1} CPUs)",
            "jobs",
        )


def check_sample(limit: int | None, parameter: str = "limit") -> None:
    """``limit`` runs at most, as the library's ``parameter`` asks for them."""
    if limit is not None and not 1 <= limit <= MAX_SAMPLE:
        raise OptionError(
            f"{limit:,}: a sample is at most {MAX_SAMPLE:,} interleavings (about 90 minutes in one process)", parameter
        )


def check_combinations(count: int) -> None:
    if count > MAX_COMBINATIONS:
        raise ScenarioError(
            f"{count:,} combinations are too many for one sweep (at most {MAX_COMBINATIONS:,}); split it"
        )
