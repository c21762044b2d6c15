"""``pgrace minimize``: from a failing run to the smallest scenario that still fails the same way.

A *failure* is what a run of one order ended in, step by step: which final checks failed,
which step raised which SQLSTATE, and which steps waited (:class:`Failure`). A candidate
(some sessions, steps, setup statements or seed rows left out) is kept only when a run of
it in a reset scratch schema fails the same way: the same failing checks, the same
SQLSTATEs on the same steps, and a wait wherever the original waited.

The shrink tries, in this order, and again until a whole round keeps nothing (then no
single removal still fails: the result is *locally minimal*): each session; each
transaction of a session (BEGIN through COMMIT), then each step, a step that captures a
variable going with the steps that read it; each setup statement; each row of a multi-row
``INSERT ... VALUES``. Then the order: of the pairs of steps of different sessions the
interleaving orders, only those the reduction's dependence relation
(:func:`pgrace.drivers.reduce.dependent`, read from a run's footprints) says do not commute
need keeping; the remaining order is laid out with the fewest session switches and kept
when it fails the same way.

A failure that hangs on timing or chance (``pg_sleep``, ``random()``, a sleep step, a
timeout) is run :data:`CHANCY_REPEATS` times per candidate; a candidate is kept when it
fails the same way at least as often as the original did.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from pgrace.drivers.minimize.statements import Statement, join_block, split_block
from pgrace.errors import OptionError, PgraceError, ScenarioError, ScenarioFailed
from pgrace.model import variables
from pgrace.model.outcomes import classify, verdict_of
from pgrace.model.scenario import PermutationStep, Scenario, Step
from pgrace.model.timeline import Run, StepCancelled
from pgrace.servers import ServerInfo

__all__ = ["Failure", "Minimized", "Trial", "failing_order", "minimize"]

CHANCY_REPEATS = 5  # runs per candidate when the failure may hang on timing or chance
MAX_RUNS = 2_000  # a shrink stops here (then it does not claim local minimality)
CHANCE = re.compile(
    r"\b(pg_sleep\w*|random|random_normal|gen_random_uuid|setseed|statement_timeout|lock_timeout|"
    r"idle_in_transaction_session_timeout|transaction_timeout|clock_timestamp|now)\b",
    re.IGNORECASE,
)
BEGINS = re.compile(r"^\s*(BEGIN|START\s+TRANSACTION)\b", re.IGNORECASE)
ENDS = re.compile(r"\b(COMMIT|END|ABORT|ROLLBACK)(?!\s+TO\b)(\s+(WORK|TRANSACTION))?\s*;?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Failure:
    """How a run failed, step by step: what a candidate must do again to be kept."""

    checked: bool  # the scenario has final checks
    failed_checks: tuple[str, ...]
    errors: tuple[tuple[str, str], ...]  # (step, SQLSTATE), sorted
    waits: tuple[str, ...]  # steps that waited, sorted

    def fails(self, variant: str) -> bool:
        """Bad news: a bug variant's checks held (the bug happened), a fix's failed, or a step raised an error."""
        return verdict_of(not self.failed_checks, variant, self.checked)[1] or bool(self.errors)

    def kept_by(self, other: Failure) -> bool:
        return (
            self.failed_checks == other.failed_checks
            and self.errors == other.errors
            and set(self.waits) <= set(other.waits)
        )

    def difference(self, other: Failure) -> str:
        """Why ``other`` does not fail the way this does, in a few words."""
        if other.failed_checks != self.failed_checks:
            gone = [c for c in self.failed_checks if c not in other.failed_checks]
            new = [c for c in other.failed_checks if c not in self.failed_checks]
            return "; ".join([*(f"«{c}» held" for c in gone), *(f"«{c}» failed" for c in new)])
        if other.errors != self.errors:
            return f"errors {_errors_text(other.errors)} instead of {_errors_text(self.errors)}"
        lost = sorted(set(self.waits) - set(other.waits))
        return f"{', '.join(lost)} did not wait"

    def describe(self, variant: str) -> str:
        parts = []
        if self.checked:
            if variant == "bug":
                parts.append("the bug's checks hold" if not self.failed_checks else "")
            if self.failed_checks:
                parts.append("fails " + "; ".join(f"«{c}»" for c in self.failed_checks))
        if self.errors:
            parts.append("errors " + _errors_text(self.errors))
        if self.waits:
            parts.append("waits " + ", ".join(self.waits))
        return " · ".join(p for p in parts if p) or "no checks, no errors"

    def to_dict(self) -> dict[str, Any]:
        return {
            "failed_checks": list(self.failed_checks),
            "errors": [{"step": step, "sqlstate": code} for step, code in self.errors],
            "waits": list(self.waits),
        }


def _errors_text(errors: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{code} on {step}" for step, code in errors) or "none"


def failure_of(run: Run) -> Failure:
    steps = run.step_runs()
    errors = sorted(
        (s.step, s.outcome.error.sqlstate)
        for s in steps
        if s.outcome is not None and s.outcome.error is not None and not s.retried
    )
    observed = classify(run)
    return Failure(
        bool(run.scenario.checks),
        observed.failed_checks,
        tuple(errors),
        tuple(sorted({s.step for s in steps if s.waited})),
    )


@dataclass(frozen=True)
class Shape:
    """What a candidate keeps of the original: sessions, steps (in the failing order) and setup statements."""

    sessions: tuple[str, ...]
    order: tuple[str, ...]
    setup: tuple[Statement, ...]

    def scenario(self, original: Scenario) -> Scenario:
        kept = set(self.order)
        blocks = sorted({s.block for s in self.setup})
        return dataclasses.replace(
            original,
            sessions=tuple(s for s in original.sessions if s.name in self.sessions),
            steps=tuple(s for s in original.steps if s.name in kept),
            setup=tuple(join_block([s for s in self.setup if s.block == b]) for b in blocks),
            permutations=(tuple(PermutationStep(name) for name in self.order),),
            other=None,
            load=None,
        )

    @property
    def rows(self) -> int:
        return sum(len(s.rows) for s in self.setup)


@dataclass(frozen=True)
class Trial:
    """One removal tried: what, and whether the candidate without it failed the same way (then it was removed)."""

    kind: str  # session, transaction, step, setup, row, order
    what: str
    removed: bool
    reason: str
    runs: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Minimized:
    """The smallest scenario found, how it fails, and every removal tried on the way."""

    original: Scenario
    scenario: Scenario  # the minimized one, its one permutation the failing order
    failure: Failure
    trials: list[Trial]
    runs: int
    seconds: float
    locally_minimal: bool
    repeats: int  # runs per candidate
    failed_before: int  # of ``repeats`` runs of the original, how many failed the same way
    failed_after: int
    before: dict[str, int]
    after: dict[str, int]
    orders_total: int = 0  # pairs of steps of different sessions the final interleaving orders
    orders_kept: int = 0  # of those, the pairs that do not commute
    race: bool = False  # the original did not fail with its sessions one after another: nor may the result
    timeline: Run | None = field(default=None, repr=False)
    written: list[tuple[str, str]] = field(default_factory=list)  # (kind, path) of each verified export

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(p.step for p in self.scenario.permutations[0])

    def to_dict(self) -> dict[str, Any]:
        from pgrace.render.json import run_to_dict

        return {
            "scenario": self.original.name,
            "variant": self.original.variant,
            "failure": self.failure.to_dict(),
            "runs": self.runs,
            "seconds": round(self.seconds, 3),
            "locally_minimal": self.locally_minimal,
            "race": self.race,
            "repeats": self.repeats,
            "failed": {"before": self.failed_before, "after": self.failed_after, "of": self.repeats},
            "before": self.before,
            "after": self.after,
            "order": list(self.order),
            "orders": {"total": self.orders_total, "kept": self.orders_kept},
            "trials": [t.to_dict() for t in self.trials],
            "written": [{"kind": kind, "path": path} for kind, path in self.written],
            "timeline": run_to_dict(self.timeline) if self.timeline is not None else None,
        }


def sizes(scenario: Scenario, shape: Shape) -> dict[str, int]:
    return {
        "sessions": len(shape.sessions),
        "steps": len(shape.order),
        "setup_statements": len(shape.setup),
        "seed_rows": shape.rows,
    }


def failing_order(
    scenario: Scenario, server: ServerInfo, cls: int | None, order: tuple[str, ...] | None, step_timeout: float
) -> tuple[str, ...]:
    """The order to start from: ``order``, class ``cls``'s example (numbered from 1, as explore does), or the file's."""
    if order is not None:
        return check_order(scenario, order)
    if cls is not None:
        from pgrace.drivers.explore import explore

        found = explore(scenario, server, step_timeout=step_timeout)
        if not 1 <= cls <= len(found.classes):
            n = len(found.classes)
            raise OptionError(f"there {'is' if n == 1 else 'are'} {n} class{'' if n == 1 else 'es'}", "--class")
        return tuple(found.classes[cls - 1].example)
    if len(scenario.permutations) != 1:
        raise OptionError(
            f"{scenario.name} has {len(scenario.permutations)} permutations: choose one with --order", "--order"
        )
    return tuple(p.step for p in scenario.permutations[0])


def check_order(scenario: Scenario, order: tuple[str, ...]) -> tuple[str, ...]:
    """Every name a step of the scenario, each once, each session's steps in the file's order."""
    from pgrace.formats.names import did_you_mean

    names = [s.name for s in scenario.steps]
    for name in order:
        if name not in names:
            raise OptionError(f"no step {name!r}{did_you_mean(name, names)}", "--order")
    if len(set(order)) != len(order):
        twice = next(n for n in order if order.count(n) > 1)
        raise OptionError(f"step {twice!r} is named twice", "--order")
    for session in scenario.session_names:
        mine = [n for n in order if scenario.step(n).session == session]
        if mine != [n for n in names if n in mine]:
            raise OptionError(f"session {session}'s steps are out of their order: {', '.join(mine)}", "--order")
    return order


def chancy(scenario: Scenario) -> bool:
    """Whether the failure may hang on timing or chance: a sleep step, the clock, random(), a timeout."""
    texts = [*scenario.setup, *(s.sql for s in scenario.steps), *(c.sql for c in scenario.checks)]
    texts += [t for s in scenario.sessions for t in (s.setup, s.teardown) if t]
    return any(s.sleep is not None for s in scenario.steps) or any(CHANCE.search(t) for t in texts)


class Bench:
    """Runs candidates, each one order in the reused scratch database (its schema reset after each run)."""

    def __init__(self, original: Scenario, server: ServerInfo, step_timeout: float, stack: ExitStack) -> None:
        self.original = original
        self.server = server
        self.step_timeout = step_timeout
        self.stack = stack
        self.runs = 0
        self._db: Any = None

    def _database(self) -> Any:
        from pgrace.drivers.space import EXPLORE_SCHEMA
        from pgrace.scratch import scratch_database_with_schema

        if self._db is None:
            inner = ExitStack()
            self._db = (
                inner,
                inner.enter_context(
                    scratch_database_with_schema(self.server, f"minimize_{self.original.name}", EXPLORE_SCHEMA)
                ),
            )
            self.stack.callback(self._drop)
        return self._db[1]

    def _drop(self) -> None:
        if self._db is not None:
            inner, self._db = self._db[0], None
            inner.close()

    def run(self, scenario: Scenario) -> Run | str:
        """One run of the scenario's permutation, or why it could not run (its setup failed ...)."""
        from pgrace.drivers.space import explore_options, prepared
        from pgrace.engine.runner import run_scenario

        self.runs += 1
        db = self._database()
        try:
            return run_scenario(
                prepared(scenario),
                db.dsn,
                server_version=self.server.version,
                server_label=self.server.label,
                row_locks_available=False,
                options=explore_options(self.step_timeout),
                observer_dsn=db.observer_dsn,
            )
        except ScenarioFailed as exc:
            self._drop()  # what the broken candidate left: a fresh scratch database for the next
            return exc.message


def minimize(
    scenario: Scenario,
    server: ServerInfo,
    order: tuple[str, ...],
    *,
    step_timeout: float = 10.0,
    repeats: int | None = None,
    on_trial: Callable[[Trial], None] | None = None,
) -> Minimized:
    """Shrink ``scenario`` run in ``order`` to a locally minimal scenario that fails the same way.

    ``repeats``: runs per candidate (by default 1, or :data:`CHANCY_REPEATS` when the
    failure may hang on timing or chance). Raises :class:`ScenarioError` when the order does
    not fail.
    """
    check_order(scenario, order)
    started = time.monotonic()
    with ExitStack() as stack:
        bench = Bench(scenario, server, step_timeout, stack)
        shrink = _Shrink(scenario, bench, repeats, on_trial)
        start = Shape(
            tuple(s.name for s in scenario.sessions if any(scenario.step(n).session == s.name for n in order)),
            order,
            tuple(st for b, text in enumerate(scenario.setup) for st in split_block(b, text)),
        )
        failure, failed_before, last = shrink.measure(start)
        if failure is None:
            raise ScenarioError(
                f"{scenario.name} ({scenario.variant}) does not fail in this order: nothing to minimize"
                f" ({last}); choose a failing class with --class N (see pgrace explore) or an order with --order",
                scenario.source,
            )
        shrink.failure, shrink.needed = failure, failed_before
        shrink.race = shrink.serial_failure(start) is not None
        shape, minimal = shrink.shrink(start)
        shape, total, kept = shrink.reorder(shape)
        final_failures = shrink.repeat_count(shape)
    result = Minimized(
        original=scenario,
        scenario=shape.scenario(scenario),
        failure=failure,
        trials=shrink.trials,
        runs=bench.runs,
        seconds=0.0,
        locally_minimal=minimal,
        repeats=shrink.repeats,
        failed_before=failed_before,
        failed_after=final_failures,
        before=sizes(scenario, start),
        after=sizes(scenario, shape),
        orders_total=total,
        orders_kept=kept,
        race=shrink.race,
    )
    result.timeline = replay(result.scenario, server, step_timeout)
    result.seconds = time.monotonic() - started
    return result


def replay(scenario: Scenario, server: ServerInfo, step_timeout: float) -> Run:
    """The minimized scenario's run, fully observed (waits described, row locks), without expectations."""
    from pgrace.drivers.one_run import run_in_scratch
    from pgrace.engine.options import RunOptions
    from pgrace.model.scenario import StepExpectation

    steps = tuple(dataclasses.replace(s, expect=StepExpectation()) for s in scenario.steps)
    return run_in_scratch(
        dataclasses.replace(scenario, steps=steps),
        server,
        RunOptions(step_timeout=step_timeout, defer_busy_sessions=True),
    )


class _Shrink:
    def __init__(
        self, original: Scenario, bench: Bench, repeats: int | None, on_trial: Callable[[Trial], None] | None
    ) -> None:
        self.original = original
        self.bench = bench
        self.repeats = repeats if repeats is not None else (CHANCY_REPEATS if chancy(original) else 1)
        self.on_trial = on_trial
        self.trials: list[Trial] = []
        self.failure: Failure | None = None
        self.needed = 1
        self._seen: dict[Shape, tuple[int, str]] = {}
        self.race = False  # the original fails in its order and not when its sessions run one after another

    def serial_orders(self, shape: Shape) -> list[tuple[str, ...]]:
        """The sessions one after another, in the order they first go, then the other way round."""
        first = list(dict.fromkeys(self.original.step(n).session for n in shape.order))
        orders = []
        for sessions in (first, first[::-1]) if len(first) > 1 else ():
            order = tuple(n for s in sessions for n in shape.order if self.original.step(n).session == s)
            if order != shape.order and order not in orders:
                orders.append(order)
        return orders

    def serial_failure(self, shape: Shape) -> tuple[str, ...] | None:
        """A serial order in which ``shape`` does not fail the same way (None: every one does, or there is none)."""
        assert self.failure is not None
        for order in self.serial_orders(shape):
            got = self.bench.run(dataclasses.replace(shape, order=order).scenario(self.original))
            if isinstance(got, str) or not self.failure.kept_by(failure_of(got)):
                return order
        return None

    def measure(self, shape: Shape) -> tuple[Failure | None, int, str]:
        """The original's failure (the one most of its runs show) and how many of ``repeats`` runs show it."""
        seen: dict[Failure, int] = {}
        last = ""
        for _ in range(self.repeats):
            got = self.bench.run(shape.scenario(self.original))
            if isinstance(got, str):
                last = got
                continue
            found = failure_of(got)
            if any(isinstance(e, StepCancelled) for e in got.events) and self.repeats == 1:
                self.repeats = CHANCY_REPEATS  # a step timed out: timing decides, run each candidate again
            if found.fails(self.original.variant):
                seen[found] = seen.get(found, 0) + 1
            else:
                last = "it " + (found.describe(self.original.variant) if found.errors or found.waits else "passes")
        if not seen:
            return None, 0, last or "it passes"
        failure = max(seen, key=lambda f: seen[f])
        return failure, seen[failure], last

    def repeat_count(self, shape: Shape) -> int:
        return self._failures(shape, stop_early=False)[0]

    def _failures(self, shape: Shape, stop_early: bool = True) -> tuple[int, str]:
        """How many of ``repeats`` runs fail the same way, and why the last one that did not, did not."""
        assert self.failure is not None
        count, why = 0, ""
        for done in range(self.repeats):
            got = self.bench.run(shape.scenario(self.original))
            if isinstance(got, str):
                return count, got  # a setup that fails fails every time
            found = failure_of(got)
            if self.failure.kept_by(found):
                count += 1
            else:
                why = (
                    "it passes"
                    if not found.fails(self.original.variant)
                    else "fails differently: " + self.failure.difference(found)
                )
            if stop_early and count + (self.repeats - done - 1) < self.needed:
                break
        if count >= self.needed and self.race and self.serial_failure(shape) is None:
            sessions = list(dict.fromkeys(self.original.step(n).session for n in shape.order))
            return (
                0,
                f"fails the same way with its sessions one after another ({', then '.join(sessions)}): no race left",
            )
        return count, why

    def _try(self, shape: Shape, kind: str, what: str) -> bool:
        before = self.bench.runs
        if shape in self._seen:
            count, why = self._seen[shape]
        else:
            count, why = self._seen[shape] = self._failures(shape)
        kept = count >= self.needed
        if kept:
            reason = "fails the same way" + (f" ({count} of {self.repeats} runs)" if self.repeats > 1 else "")
        else:
            reason = why + (f" ({count} of {self.repeats} runs failed the same way)" if self.repeats > 1 else "")
        trial = Trial(kind, what, kept, reason, self.bench.runs - before)
        self.trials.append(trial)
        if self.on_trial is not None:
            self.on_trial(trial)
        return kept

    def shrink(self, shape: Shape) -> tuple[Shape, bool]:
        """Rounds of every kind of removal until one keeps nothing: then no single removal fails the same way.

        Within a round, a kind's removals are made again from the smaller shape after each one
        kept, leaving out those this round already tried; a shape tried before is not run again.
        """
        while True:
            changed = False
            for candidates in (self._sessions, self._transactions, self._steps, self._setup, self._rows):
                tried: set[str] = set()
                while True:
                    found = None
                    for kind, what, smaller in candidates(shape):
                        if what in tried:
                            continue
                        if self.bench.runs >= MAX_RUNS:
                            return shape, False
                        tried.add(what)
                        if self._try(smaller, kind, what):
                            found = smaller
                            break
                    if found is None:
                        break
                    shape, changed = found, True
            if not changed:
                return shape, True

    # Each generator yields (kind, what, the shape without it); the first kept restarts the round.

    def _sessions(self, shape: Shape) -> Iterator[tuple[str, str, Shape]]:
        if len(shape.sessions) <= 1:
            return
        for session in shape.sessions:
            gone = {n for n in shape.order if self.original.step(n).session == session}
            gone |= self._readers(shape, gone)
            yield (
                "session",
                session,
                dataclasses.replace(
                    shape,
                    sessions=tuple(s for s in shape.sessions if s != session),
                    order=tuple(n for n in shape.order if n not in gone),
                ),
            )

    def _transactions(self, shape: Shape) -> Iterator[tuple[str, str, Shape]]:
        for session in shape.sessions:
            chain = [n for n in shape.order if self.original.step(n).session == session]
            for block in _blocks(self.original, chain):
                if len(block) < 2 or len(block) == len(chain):
                    continue
                yield from self._without(shape, "transaction", set(block), f"{session}: {block[0]} … {block[-1]}")

    def _steps(self, shape: Shape) -> Iterator[tuple[str, str, Shape]]:
        for name in shape.order:
            step = self.original.step(name)
            if step.loop is not None or step.attempt > 1:
                continue  # a retry loop's steps and attempts are made together: they go with their session
            yield from self._without(shape, "step", {name}, name)

    def _without(self, shape: Shape, kind: str, names: set[str], what: str) -> Iterator[tuple[str, str, Shape]]:
        gone = names | self._readers(shape, names)
        left = tuple(n for n in shape.order if n not in gone)
        if not left:
            return
        sessions = tuple(s for s in shape.sessions if any(self.original.step(n).session == s for n in left))
        readers = sorted(gone - names, key=shape.order.index)
        yield (
            kind,
            what + (f" (with its reader{'s' if len(readers) > 1 else ''} {', '.join(readers)})" if readers else ""),
            (dataclasses.replace(shape, order=left, sessions=sessions)),
        )

    def _setup(self, shape: Shape) -> Iterator[tuple[str, str, Shape]]:
        for i, statement in enumerate(shape.setup):
            yield (
                "setup",
                _short(statement.text),
                dataclasses.replace(shape, setup=shape.setup[:i] + shape.setup[i + 1 :]),
            )

    def _rows(self, shape: Shape) -> Iterator[tuple[str, str, Shape]]:
        for i, statement in enumerate(shape.setup):
            if len(statement.rows) < 2:
                continue
            for k, row in enumerate(statement.rows):
                setup = (*shape.setup[:i], statement.without_row(k), *shape.setup[i + 1 :])
                yield "row", f"{_short(statement.head.strip())} {_short(row)}", dataclasses.replace(shape, setup=setup)

    def _readers(self, shape: Shape, names: set[str]) -> set[str]:
        """The steps that read a variable one of ``names`` captures, and theirs in turn."""
        gone = set(names)
        grew = True
        while grew:
            grew = False
            for name in shape.order:
                if name in gone:
                    continue
                step = self.original.step(name)
                for use in variables.find(step.sql):
                    session = use.session or step.session
                    if any(
                        self.original.step(g).session == session
                        and use.name in {v for v, _ in self.original.step(g).capture}
                        for g in gone
                    ):
                        gone.add(name)
                        grew = True
                        break
        return gone - names

    def reorder(self, shape: Shape) -> tuple[Shape, int, int]:
        """Keep only the order between steps that do not commute; lay the rest out with the fewest session switches.

        Returns the shape (its order changed when the simpler order fails the same way), the
        pairs of steps of different sessions the order puts one before the other, and how
        many of those do not commute.
        """
        from pgrace.drivers.reduce import dependent, executor

        scenario = shape.scenario(self.original)
        try:
            with executor(scenario, self.bench.server, self.bench.step_timeout) as execute:
                trace = execute(shape.order)
        except PgraceError:
            return shape, 0, 0
        self.bench.runs += 1
        moves = trace.moves
        n = len(moves)
        before: dict[int, set[int]] = {j: set() for j in range(n)}
        total = kept = 0
        for j in range(n):
            for i in range(j):
                if moves[i].session == moves[j].session:
                    before[j].add(i)
                    continue
                total += 1
                if dependent(moves[i], moves[j]) or i in moves[j].enablers:
                    kept += 1
                    before[j].add(i)
            before[j] |= set(moves[j].enablers)
        simpler = _fewest_switches([m.name for m in moves], [m.session for m in moves], before)
        if tuple(simpler) == shape.order or set(simpler) != set(shape.order):
            return shape, total, kept
        candidate = dataclasses.replace(shape, order=tuple(simpler))
        what = f"keep {kept} of {total} cross-session orders: " + " ".join(simpler)
        return (candidate if self._try(candidate, "order", what) else shape), total, kept


def _fewest_switches(names: list[str], sessions: list[str], before: dict[int, set[int]]) -> list[str]:
    """A linear order of the moves that respects ``before``, staying with one session while it can."""
    placed: list[int] = []
    done: set[int] = set()
    current: str | None = None
    while len(placed) < len(names):
        ready = [j for j in range(len(names)) if j not in done and before[j] <= done]
        if not ready:
            return names  # a cycle in what was read: keep the order as it ran
        same = [j for j in ready if sessions[j] == current]
        pick = same[0] if same else ready[0]
        placed.append(pick)
        done.add(pick)
        current = sessions[pick]
    return [names[j] for j in placed]


def _blocks(scenario: Scenario, chain: list[str]) -> list[list[str]]:
    """A session's steps cut into transactions: BEGIN through COMMIT or ROLLBACK; a step outside one stands alone."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for name in chain:
        sql = scenario.step(name).sql
        if current is None and BEGINS.search(sql):
            current = [name]
        elif current is not None:
            current.append(name)
        else:
            blocks.append([name])
            continue
        if ENDS.search(sql):
            blocks.append(current)
            current = None
    if current:
        blocks.append(current)
    return blocks


def _short(text: str, width: int = 60) -> str:
    one = " ".join(text.split())
    return one if len(one) <= width else one[: width - 1] + "…"


def describe_step(step: Step) -> str:
    return f"{step.name} ({step.session}): {_short(step.sql)}"
