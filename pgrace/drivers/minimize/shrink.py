"""The shrink itself: candidates run one order each in a reused scratch database, kept when they fail the same way."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

from pgrace.drivers.minimize.failure import (
    BEGINS,
    CHANCY_REPEATS,
    ENDS,
    MAX_RUNS,
    Kept,
    chancy,
    failure_of,
    short,
)
from pgrace.errors import PgraceError, ScenarioFailed
from pgrace.model import variables
from pgrace.model.minimized import Failure, Trial
from pgrace.model.scenario import Scenario
from pgrace.model.timeline import Run, StepCancelled, StepLaunched
from pgrace.servers import ServerInfo


class Bench:
    """Runs candidates, each one order in the reused scratch database (its schema reset after each run).

    ``timeout``: the step timeout of a candidate's run. A candidate that leaves a step
    waiting for a session with nothing left to send waits until it is cancelled, and is
    refused then (57014 is not the original's failure): waiting the scenario's whole step
    timeout for that made a shrink take minutes. Once the original has run,
    :meth:`Shrink.measure` lowers it to a few times the original's longest statement.
    """

    def __init__(self, original: Scenario, server: ServerInfo, step_timeout: float, stack: ExitStack) -> None:
        self.original = original
        self.server = server
        self.step_timeout = step_timeout
        self.timeout = step_timeout
        self.stack = stack
        self.runs = 0
        self._db: Any = None

    def _database(self) -> Any:
        from pgrace.drivers.exploring import EXPLORE_SCHEMA
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
        from pgrace.drivers.exploring import explore_options, prepared
        from pgrace.engine.libpq.runner import run_scenario

        self.runs += 1
        db = self._database()
        try:
            return run_scenario(
                prepared(scenario),
                db.dsn,
                server_version=self.server.version,
                server_label=self.server.label,
                row_locks_available=False,
                options=explore_options(self.timeout),
                observer_dsn=db.observer_dsn,
            )
        except ScenarioFailed as exc:
            self._drop()  # what the broken candidate left: a fresh scratch database for the next
            return exc.message


#: A candidate's step timeout: ``SLOWER`` times the original's longest statement, at least ``MIN_CANDIDATE_TIMEOUT``
#: seconds (a deadlock whose victim checks after 100 ms takes 0.2 s on two busy cores), at most the step timeout.
SLOWER = 5.0
MIN_CANDIDATE_TIMEOUT = 1.0


class Shrink:
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
        self._seen: dict[Kept, tuple[int, str]] = {}
        self.race = False  # the original fails in its order and not when its sessions run one after another

    def serial_orders(self, shape: Kept) -> list[tuple[str, ...]]:
        """The sessions one after another, in the order they first go, then the other way round."""
        first = list(dict.fromkeys(self.original.step(n).session for n in shape.order))
        orders = []
        for sessions in (first, first[::-1]) if len(first) > 1 else ():
            order = tuple(n for s in sessions for n in shape.order if self.original.step(n).session == s)
            if order != shape.order and order not in orders:
                orders.append(order)
        return orders

    def serial_failure(self, shape: Kept) -> tuple[str, ...] | None:
        """A serial order in which ``shape`` does not fail the same way (None: every one does, or there is none)."""
        assert self.failure is not None
        for order in self.serial_orders(shape):
            got = self.bench.run(dataclasses.replace(shape, order=order).scenario(self.original))
            if isinstance(got, str) or not self.failure.kept_by(failure_of(got)):
                return order
        return None

    def measure(self, shape: Kept) -> tuple[Failure | None, int, str]:
        """The original's failure (the one most of its runs show) and how many of ``repeats`` runs show it."""
        seen: dict[Failure, int] = {}
        last = ""
        longest, cancelled = 0.0, False
        for _ in range(self.repeats):
            got = self.bench.run(shape.scenario(self.original))
            if isinstance(got, str):
                last = got
                continue
            found = failure_of(got)
            longest = max(longest, _longest_statement(got))
            if any(isinstance(e, StepCancelled) for e in got.events):
                cancelled = True
                if self.repeats == 1:
                    self.repeats = CHANCY_REPEATS  # a step timed out: timing decides, run each candidate again
            if found.fails(self.original):
                seen[found] = seen.get(found, 0) + 1
            else:
                last = "it " + (found.describe(self.original.variant) if found.errors or found.waits else "passes")
        if not seen:
            return None, 0, last or "it passes"
        if not cancelled:  # the failure needs no step timeout: a candidate that waits far longer than it hangs
            self.bench.timeout = min(self.bench.step_timeout, max(MIN_CANDIDATE_TIMEOUT, SLOWER * longest))
        failure = max(seen, key=lambda f: seen[f])
        return failure, seen[failure], last

    def repeat_count(self, shape: Kept) -> int:
        """How many of ``repeats`` runs of ``shape`` fail the same way: counted already when it was kept."""
        if shape in self._seen and self._seen[shape][0] >= self.needed:  # kept: every one of its runs was made
            return self._seen[shape][0]
        return self._failures(shape, stop_early=False)[0]

    def _failures(self, shape: Kept, stop_early: bool = True) -> tuple[int, str]:
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
                    if not found.fails(self.original)
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

    def _try(self, shape: Kept, kind: str, what: str) -> bool:
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

    def shrink(self, shape: Kept) -> tuple[Kept, bool]:
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

    def _sessions(self, shape: Kept) -> Iterator[tuple[str, str, Kept]]:
        if len(shape.sessions) <= 1:
            return
        for session in shape.sessions:
            gone = {n for n in shape.order if self.original.step(n).session == session}
            gone = self._whole_loops(shape, gone | self._readers(shape, gone))
            yield (
                "session",
                session,
                dataclasses.replace(
                    shape,
                    sessions=tuple(s for s in shape.sessions if s != session),
                    order=tuple(n for n in shape.order if n not in gone),
                ),
            )

    def _transactions(self, shape: Kept) -> Iterator[tuple[str, str, Kept]]:
        for session in shape.sessions:
            chain = [n for n in shape.order if self.original.step(n).session == session]
            for block in _blocks(self.original, chain):
                if len(block) < 2 or len(block) == len(chain):
                    continue
                if any(self.original.step(n).loop is not None for n in block):
                    continue  # a retry loop's transactions go with it, as one retry loop (see _steps)
                yield from self._without(shape, "transaction", set(block), f"{session}: {block[0]} … {block[-1]}")

    def _steps(self, shape: Kept) -> Iterator[tuple[str, str, Kept]]:
        loops_done: set[str] = set()
        for name in shape.order:
            step = self.original.step(name)
            if step.loop is None:
                yield from self._without(shape, "step", {name}, name)
            elif step.loop not in loops_done:  # a retry loop's steps and its attempts go together, never one by one
                loops_done.add(step.loop)
                body = [n for n in shape.order if self.original.step(n).loop == step.loop]
                retry = self.original.step(step.loop).retry
                said = f" (retry on {', '.join(retry.on)}, at most {retry.max} more)" if retry is not None else ""
                yield from self._without(shape, "retry loop", set(body), f"{body[0]} … {step.loop}{said}")

    def _whole_loops(self, shape: Kept, names: set[str]) -> set[str]:
        """``names`` and every step of a retry loop one of them is in: a loop is kept or removed whole."""
        loops = {self.original.step(n).loop for n in names} - {None}
        return names | {n for n in shape.order if self.original.step(n).loop in loops}

    def _without(self, shape: Kept, kind: str, names: set[str], what: str) -> Iterator[tuple[str, str, Kept]]:
        names = self._whole_loops(shape, names)
        gone = names | self._readers(shape, names)
        gone = self._whole_loops(shape, gone)
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

    def _setup(self, shape: Kept) -> Iterator[tuple[str, str, Kept]]:
        for i, statement in enumerate(shape.setup):
            yield (
                "setup",
                short(statement.text),
                dataclasses.replace(shape, setup=shape.setup[:i] + shape.setup[i + 1 :]),
            )

    def _rows(self, shape: Kept) -> Iterator[tuple[str, str, Kept]]:
        for i, statement in enumerate(shape.setup):
            if len(statement.rows) < 2:
                continue
            for k, row in enumerate(statement.rows):
                setup = (*shape.setup[:i], statement.without_row(k), *shape.setup[i + 1 :])
                head = "\n".join(line for line in statement.head.splitlines() if not line.lstrip().startswith("--"))
                yield "row", f"{short(head.strip())} {short(row)}", dataclasses.replace(shape, setup=setup)

    def _readers(self, shape: Kept, names: set[str]) -> set[str]:
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

    def simplify(self, shape: Kept) -> Kept:
        """Each remaining step's SQL made smaller, one change at a time, each kept when it fails the same way.

        A step's changes are proposed again from its text after each one kept; a retry
        loop's steps (their attempts are copies), sleeps and crashes are left as they are.
        """
        from pgrace.drivers.minimize.simplify import simpler

        for name in shape.order:
            step = self.original.step(name)
            if step.loop is not None or step.sleep is not None or step.crash is not None:
                continue
            captured = frozenset(column for _, column in step.capture)
            tried: set[str] = set()
            while True:
                current = dict(shape.sql).get(name, step.sql)
                found = None
                for edit in simpler(current, captured):
                    if edit.sql in tried:
                        continue
                    if self.bench.runs >= MAX_RUNS:
                        return shape
                    tried.add(edit.sql)
                    sql = tuple(sorted({**dict(shape.sql), name: edit.sql}.items()))
                    candidate = dataclasses.replace(shape, sql=sql)
                    if self._try(candidate, "sql", f"{name}: {edit.what}"):
                        found = candidate
                        break
                if found is None:
                    break
                shape = found
        return shape

    def reorder(self, shape: Kept) -> tuple[Kept, int, int]:
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


def _longest_statement(run: Run) -> float:
    """Seconds: the longest step of ``run`` (launch to end), or its setup (the start to the first launch)."""
    launched = [e.t for e in run.events if isinstance(e, StepLaunched)]
    steps = [(s.finished_ms or s.started_ms) - s.started_ms for s in run.step_runs()]
    return max([launched[0] if launched else 0.0, *steps]) / 1000


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
