"""Beyond complete search: preemption bounding and PCT, for spaces too big even reduced.

Both run real interleavings one at a time on one set of connections (the reduced search's
executor) and say exactly what their result proves, which is less than "every
interleaving":

* **Preemption bounding** (iterative context bounding: Musuvathi and Qadeer, PLDI 2007, as
  in CHESS). A *preemption* is a switch, in the launch order, from session s to another
  while s could have gone on (its previous step had finished and its next one was free to
  go); switching away from a session that waits on the server, or has no steps left, is
  free. Every schedule with at most K preemptions is run: from each run, every other
  session that could have gone at each position, when the prefix with it has at most K
  preemptions, is tried once, the rest of its run keeping the current session while it
  can (no preemption). When the server launched a run in another order than asked (a
  step waited where it did not before), that branch carries no claim and the result says
  the bound was not met. Most known concurrency bugs need two or fewer.
* **PCT** (probabilistic concurrency testing: Burckhardt, Kothari, Musuvathi,
  Nagarakatte, ASPLOS 2010). With n sessions, k steps and depth D, each run gives the
  sessions random distinct priorities D … D+n-1 and picks D-1 random change points among
  the steps 1 … k; the highest-priority session whose next step may go goes, and at the
  i-th change point the session about to go drops to priority i. A session that is blocked
  on the server has its steps deferred by the runner while the next-highest goes, which
  is what PCT's scheduler does. A bug of depth D (D ordering constraints between steps) is
  found by each run with probability at least 1/(n·k^(D-1)), so R runs all miss it with
  probability at most (1-p)^R. The draws come from one seeded generator; a draw that
  repeats an earlier order is counted (it is an independent draw) but not run again.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from pgrace.drivers.searches import Pct, PreemptionBounded, SearchMode
from pgrace.errors import OptionError
from pgrace.model.exploration import Bound
from pgrace.model.orders.space import Space
from pgrace.model.outcomes import Observed
from pgrace.model.scenario import Scenario
from pgrace.servers import ServerInfo

__all__ = [
    "PCT_RUNS",
    "Schedule",
    "check_bounded_jobs",
    "check_bounds",
    "explore_pct",
    "explore_preemptions",
    "pct_order",
    "preemption_search",
]

PCT_RUNS = 100  # schedules drawn when --max does not say: a depth-2 bug of 2 sessions × 8 steps is missed ≤ 0.2%
PREEMPTION_RUNS = 100_000  # a bounded search stops here (as a reduced one does): the bound then is not met


def check_bounds(space: Space, search: SearchMode, shard: tuple[int, int], jobs: int) -> None:
    """Refuse (exit 2) what a bounded search cannot do or mean."""
    if not isinstance(search, PreemptionBounded | Pct):
        return
    if shard != (1, 1):
        raise OptionError("a bounded search runs in one process: no shard of it", "shard")
    if jobs != 1:
        raise OptionError("a bounded search runs in one process: jobs cannot split it", "jobs")
    steps = len(space.where)
    if isinstance(search, PreemptionBounded) and not 0 <= search.bound < max(steps, 1):
        raise OptionError(
            f"{search.bound}: K is 0 or more and below the {steps} steps"
            " (a schedule of N steps has at most N-1 preemptions)",
            "search",
        )
    if isinstance(search, Pct) and not 1 <= search.depth <= steps:
        raise OptionError(f"{search.depth}: the depth D is between 1 and the {steps} steps", "search")


def _continuation(space: Space, prefix: tuple[str, ...]) -> tuple[str, ...]:
    """A whole order: the prefix, then its last session while it can, then the next free one, and so on."""
    at = [0] * len(space.chains)
    for name in prefix:
        at[space.where[name][0]] += 1
    order = list(prefix)
    current = space.where[prefix[-1]][0] if prefix else None
    while len(order) < len(space.where):
        eligible = space._eligible(tuple(at))
        if current not in eligible:
            current = eligible[0]
        order.append(space.chains[current][at[current]])
        at[current] += 1
    return tuple(order)


@dataclass(frozen=True)
class Schedule:
    """One run as the preemption search reads it: the sessions in launch order, and those that could go before each."""

    launched: tuple[str, ...]
    enabled: tuple[frozenset[str], ...]


def preemption_search(
    execute: Callable[[tuple[str, ...]], Schedule],
    bound: int,
    limit: int,
    on_progress: Callable[[int, int], None] | None = None,
) -> tuple[int, int, bool]:
    """Every schedule with at most ``bound`` preemptions, depth first: the runs, those that diverged, and whether
    it stopped at ``limit`` with schedules left.

    ``execute(prefix)`` runs the sessions of ``prefix`` in its order, then the last one while it can
    (no preemption), then the next free one, and says what ran. A prefix is of sessions, so the
    search needs no count of the steps ahead: a scenario file's steps and the statements an
    application sends as it runs are searched alike.
    """
    seen: set[tuple[str, ...]] = set()
    stack: list[tuple[str, ...]] = [()]
    runs = diverged = 0
    while stack:
        if runs >= limit:
            break
        prefix = stack.pop()
        ran = execute(prefix)
        runs += 1
        launched = ran.launched
        if launched[: len(prefix)] != prefix:
            diverged += 1  # the server did not do as asked: nothing is known of this prefix's branch
        seen.update(launched[:i] for i in range(len(launched) + 1))
        cost = 0  # preemptions in launched[:i]
        for i, session in enumerate(launched):
            enabled = ran.enabled[i]
            before = launched[i - 1] if i else None
            for other in sorted(enabled - {session}):
                preempts = before is not None and other != before and before in enabled
                candidate = (*launched[:i], other)
                if cost + preempts <= bound and candidate not in seen:
                    seen.add(candidate)
                    stack.append(candidate)
            cost += before is not None and session != before and before in enabled
        if on_progress is not None:
            on_progress(runs, runs + len(stack))
    return runs, diverged, bool(stack)


def _steps_of(space: Space, sessions: tuple[str, ...]) -> tuple[str, ...]:
    """A prefix of sessions as the steps it launches: each session's next step in the file's order."""
    chain = {space.scenario.step(c[0]).session: c for c in space.chains}
    at: dict[str, int] = {}
    steps = []
    for session in sessions:
        steps.append(chain[session][at.get(session, 0)])
        at[session] = at.get(session, 0) + 1
    return tuple(steps)


def explore_preemptions(
    scenario: Scenario,
    server: ServerInfo,
    step_timeout: float,
    bound: int,
    on_observed: Callable[[Observed], None],
    on_progress: Callable[[int, int], None] | None = None,
    max_runs: int | None = None,
) -> Bound:
    """Run every schedule with at most ``bound`` preemptions (:func:`preemption_search`); ``on_observed`` gets
    each outcome. ``on_progress(runs, runs + prefixes queued)`` after each run.
    """
    from pgrace.drivers.reduce import executor

    space = Space(scenario)
    session_of = {name: scenario.step(name).session for name in space.where}
    limit = max_runs if max_runs is not None else PREEMPTION_RUNS
    with executor(scenario, server, step_timeout, footprints=False) as run_steps:

        def execute(prefix: tuple[str, ...]) -> Schedule:
            trace = run_steps(_continuation(space, _steps_of(space, prefix)))
            on_observed(trace.observed)
            return Schedule(tuple(session_of[s] for s in trace.launched), tuple(trace.enabled))

        runs, diverged, cut = preemption_search(execute, bound, limit, on_progress)
    return Bound("preemptions", bound, len(space.chains), len(space.where), runs, diverged=diverged, cut=cut)


def pct_order(space: Space, rng: random.Random, depth: int) -> tuple[str, ...]:
    """One PCT schedule: random session priorities D … D+n-1, D-1 change points among the k steps."""
    n, k = len(space.chains), len(space.where)
    priority = rng.sample(range(depth, depth + n), n)
    change = {point: i for i, point in enumerate(rng.sample(range(1, k + 1), depth - 1), 1)}
    at = [0] * n
    order: list[str] = []
    for step in range(1, k + 1):
        eligible = space._eligible(tuple(at))
        chosen = max(eligible, key=lambda s: priority[s])
        if step in change:  # the session about to go drops below every other, then the highest goes
            priority[chosen] = change[step]
            chosen = max(eligible, key=lambda s: priority[s])
        order.append(space.chains[chosen][at[chosen]])
        at[chosen] += 1
    return tuple(order)


def explore_pct(
    scenario: Scenario,
    server: ServerInfo,
    step_timeout: float,
    depth: int,
    draws: int,
    seed: int,
    on_observed: Callable[[Observed], None],
    on_progress: Callable[[int, int], None] | None = None,
) -> Bound:
    """Draw ``draws`` PCT schedules of depth ``depth`` with ``seed``; run each distinct one once."""
    from pgrace.drivers.reduce import executor

    space = Space(scenario)
    rng = random.Random(seed)
    ran: set[tuple[str, ...]] = set()
    with executor(scenario, server, step_timeout, footprints=False) as execute:
        for drawn in range(1, draws + 1):
            order = pct_order(space, rng, depth)
            if order not in ran:
                ran.add(order)
                on_observed(execute(order).observed)
            if on_progress is not None:
                on_progress(drawn, draws)
    return Bound("pct", depth, len(space.chains), len(space.where), len(ran), draws, seed)


def check_bounded_jobs(search: SearchMode | None, jobs: int) -> None:
    """A bounded search runs in one process: ``jobs`` refused before a server starts otherwise."""
    if isinstance(search, PreemptionBounded | Pct) and jobs != 1:
        raise OptionError("a bounded search runs in one process: jobs cannot split it", "jobs")
    if isinstance(search, PreemptionBounded) and search.bound < 0:
        raise OptionError(f"{search.bound}: K is 0 or more", "explore")
    if isinstance(search, Pct) and search.depth < 1:
        raise OptionError(f"{search.depth}: the depth D is 1 or more", "explore")
