"""What explore's searches share: the scenario as explored, how each interleaving runs, which numbers to run.

:class:`~pgrace.model.orders.space.Space` numbers the interleavings; this module picks the
numbers a search runs (all, a seeded sample, a shard's share) and prepares the scenario and
the run options for running one interleaving after another on one set of connections.
"""

from __future__ import annotations

import dataclasses
import math
import random

from pgrace.engine.options import RunOptions
from pgrace.model.scenario import Scenario
from pgrace.scratch import reaches_other_schemas, schema_reset_sql

EXPLORE_SCHEMA = "pgrace_explore"


def choose(size: int, limit: int | None, seed: int | None, shard: tuple[int, int] = (1, 1)) -> list[int]:
    """The interleavings to run: all, or ``limit`` of them drawn with ``seed``; then this shard's share."""
    if limit is not None and limit < size:
        picked = sorted(sample(random.Random(seed if seed is not None else 0), size, limit))
    else:
        picked = list(range(size))
    k, n = shard
    return picked[k - 1 :: n]


def sample(rng: random.Random, size: int, limit: int) -> list[int]:
    """``limit`` distinct numbers below ``size``, in memory bounded by ``limit`` whatever ``size`` is.

    The very numbers ``rng.sample(range(size), limit)`` draws (CPython's algorithm, which
    needs ``len(range(size))`` to fit a C ``ssize_t``): a seed picks what it always picked.
    """
    setsize = 21  # as random.sample: a pool of all when it is smaller than the set of picks
    if limit > 5:
        setsize += 4 ** math.ceil(math.log(limit * 3, 4))
    picked: list[int] = []
    if size <= setsize:
        pool = list(range(size))
        for i in range(limit):
            j = rng.randrange(size - i)
            picked.append(pool[j])
            pool[j] = pool[size - i - 1]
        return picked
    seen: set[int] = set()
    for _ in range(limit):
        j = rng.randrange(size)
        while j in seen:
            j = rng.randrange(size)
        seen.add(j)
        picked.append(j)
    return picked


def prepared(scenario: Scenario) -> Scenario:
    """The scenario as explore runs it: of its steps' expectations only the errors they declare; a teardown if none."""
    steps = tuple(dataclasses.replace(s, expect=s.expect.declarations()) for s in scenario.steps)
    changed = dataclasses.replace(scenario, steps=steps, other=None)
    if not scenario.teardown:
        texts = [*scenario.setup, *(s.sql for s in scenario.steps), *(c.sql for c in scenario.checks)]
        texts += [text for session in scenario.sessions for text in (session.setup, session.teardown) if text]
        reset = schema_reset_sql(EXPLORE_SCHEMA, others=reaches_other_schemas(texts))
        changed = dataclasses.replace(changed, teardown=(reset,))
    return changed


def explore_options(step_timeout: float, footprints: bool = False) -> RunOptions:
    """How each explored interleaving runs: one permutation after another on one set of connections,
    judged by its final checks alone (no row locks or wait descriptions to pay for)."""
    return RunOptions(
        step_timeout=step_timeout,
        track_row_locks=False,
        checks_each_permutation=True,
        defer_busy_sessions=True,
        describe_waits=False,
        reset_sessions=True,
        footprints=footprints,
    )
