"""Explore with partial-order reduction: run one interleaving of each class of equivalent ones.

Two steps of different sessions *commute* when running them in either order leaves the
same state and gives each the same result; interleavings that differ only by swapping
commuting neighbours are one execution. The search is source-set DPOR with sleep sets
(Abdulla, Aronis, Jonsson, Sagonas, "Optimal dynamic partial order reduction", POPL 2014,
algorithm 1; Flanagan and Godefroid 2005) over real runs: each run is one interleaving,
and what every session held after each step (``pg_locks``, and whether it keeps a
snapshot) says which of its steps depend on which; the races between dependent steps
decide which prefixes must be run on with another session's step next.

The dependence relation is deliberately coarse and errs one way only: two steps of
different sessions are *dependent* when

* either one is *opaque*: a sleep or crash step, SQL that reads the clock, chance, the
  server's own state (``pg_*`` functions and views but advisory locks, ``txid_*``, system
  columns), that is not plain DML, a query, a lock, a cursor, a setting or transaction
  control (DDL, ``DO``, ``CALL``, ``PREPARE TRANSACTION`` ...), that pglast cannot parse,
  that failed, that ran a transaction of its own (autocommit: its locks are gone before
  they can be read), that began and ended transactions in one step, that never finished,
  or that ended a transaction when the scenario defers constraints or triggers, or when
  the transaction kept a snapshot (REPEATABLE READ, SERIALIZABLE);
* both run in transactions that keep a snapshot (REPEATABLE READ, SERIALIZABLE:
  serialization failures are decided by the order of all their steps);
* one ends a transaction or releases a lock (COMMIT, ROLLBACK, ROLLBACK TO SAVEPOINT,
  an advisory unlock) and the other takes a snapshot, or touches anything the ending
  transaction held;
* they touch a common relation (tables, indexes and sequences alike, by OID), advisory
  key or object, and one of them more than reads it (any lock stronger than
  AccessShareLock: a write, FOR UPDATE/SHARE, a foreign key's check, DDL).

What a step touches is every lock its session holds after it, before it and, when it
waited, while it waited: a transaction's locks only grow until it ends, so earlier
steps' relations count again (coarse, never short). A step during which a waiting step
went on carries the waiter's footprint too, and the waiter's session's next step can only
come after it (the wait's release enables it; a step using another session's capture
likewise comes after the step that captured it). Rows are not told apart: two sessions
working on different rows of one table are dependent. The interleavings of a scenario
whose final checks read system columns or the clock are all run (every step opaque).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from pgrace.model import variables
from pgrace.model.outcomes import Observed, classify
from pgrace.model.scenario import PermutationStep, Scenario, Step
from pgrace.model.timeline import FootprintObserved, PermutationStarted, Run, StepFinished, StepLaunched
from pgrace.servers import ServerInfo

__all__ = ["Move", "Search", "dependent", "moves_of"]

# SQL whose effect or result pg_locks does not show, or that differs from run to run.
OPAQUE_WORDS = re.compile(
    r"\b(?!pg_advisory_|pg_try_advisory_)(pg_\w+|txid_\w+|now|clock_timestamp|statement_timestamp|"
    r"transaction_timestamp|timeofday|current_timestamp|current_time|current_date|localtime|localtimestamp|"
    r"random|random_normal|setseed|gen_random_uuid|uuid_generate_\w+|dblink\w*|lo_\w+|xmin|xmax|cmin|cmax|ctid)\b",
    re.IGNORECASE,
)
CHECK_OPAQUE = re.compile(r"\b(xmin|xmax|cmin|cmax|ctid|txid_\w+|pg_current_xact_id\w*|now|clock_timestamp)\b", re.I)
PLAIN_STATEMENTS = {
    "SelectStmt",
    "InsertStmt",
    "UpdateStmt",
    "DeleteStmt",
    "MergeStmt",
    "LockStmt",
    "DeclareCursorStmt",
    "FetchStmt",
    "ClosePortalStmt",
}
LOCAL_STATEMENTS = {"VariableSetStmt", "VariableShowStmt"}
# TransactionStmtKind: BEGIN, START, COMMIT, ROLLBACK, SAVEPOINT, RELEASE, ROLLBACK TO (not PREPARE and after)
TRANSACTION_KINDS = {0, 1, 2, 3, 4, 5, 6}


@dataclass(frozen=True)
class Nature:
    """What the text of a step says about it before it runs."""

    opaque: bool  # dependent on everything, whatever the server shows
    local: bool  # only settings: nothing another session can see
    single_transaction_statement: bool  # one COMMIT, ROLLBACK ... (AND CHAIN may end and begin)


def nature_of(step: Step, scenario: Scenario) -> Nature:
    if step.sleep is not None or step.crash is not None or OPAQUE_WORDS.search(step.sql):
        return Nature(True, False, False)
    import pglast

    params = variables.param_values(scenario) if scenario.format == "pgrace" else {}
    text = step.sql
    if scenario.format == "pgrace":
        uses = variables.find(text)
        values = {**{u.key: variables.Value(None) for u in uses}, **params}
        try:
            text = variables.substitute(text, values)
        except Exception:  # a value pgrace cannot spell without a connection: say nothing, trust nothing
            return Nature(True, False, False)
    try:
        statements = [raw.stmt for raw in pglast.parse_sql(text)]
    except Exception:  # pglast's ParseError, or anything it cannot take
        return Nature(True, False, False)
    kinds = [type(s).__name__ for s in statements]
    if not statements or all(k in LOCAL_STATEMENTS for k in kinds):
        return Nature(False, True, False)
    for statement, kind in zip(statements, kinds, strict=True):
        if kind == "TransactionStmt":
            if int(getattr(statement, "kind", -1)) not in TRANSACTION_KINDS:
                return Nature(True, False, False)
        elif kind not in PLAIN_STATEMENTS and kind not in LOCAL_STATEMENTS:
            return Nature(True, False, False)
    return Nature(False, False, len(statements) == 1 and kinds[0] == "TransactionStmt")


BEGINS = re.compile(r"^\s*(BEGIN|START\s+TRANSACTION)\b", re.IGNORECASE)
ENDS = re.compile(r"\b(COMMIT|END|ABORT|ROLLBACK)(?!\s+TO\b)(\s+(WORK|TRANSACTION))?\s*;?\s*$", re.IGNORECASE)


def opaque_orders(scenario: Scenario) -> int:
    """A lower bound of the runs a reduced search needs: the orders of the steps known opaque before
    running (their text, or a statement outside a transaction block), which all depend on each other."""
    from pgrace.drivers.space import Space, multinomial

    counts = []
    for chain in Space(scenario).chains:
        in_block, opaque = False, 0
        for name in chain:
            step = scenario.step(name)
            nature = nature_of(step, scenario)
            begins = bool(BEGINS.search(step.sql))
            if nature.opaque or not (in_block or begins or nature.local):
                opaque += 1
            in_block = (in_block or begins) and not ENDS.search(step.sql)
        counts.append(opaque)
    return multinomial(counts)


@dataclass(frozen=True)
class Move:
    """One launched step with what it touched: ``access`` maps a resource to whether it more than read it."""

    name: str
    session: str
    access: Mapping[tuple[str, ...], bool]
    opaque: bool
    releases: bool = False
    snapshot: bool = False  # took its transaction's snapshot (REPEATABLE READ, SERIALIZABLE)
    isolated: bool = False  # runs in a transaction that keeps a snapshot
    enablers: tuple[int, ...] = ()  # positions whose completion it had to wait for (not reversible)


def dependent(a: Move, b: Move) -> bool:
    """Whether the order of two steps may matter (see the module's docstring)."""
    if a.session == b.session or a.opaque or b.opaque:
        return True
    if a.isolated and b.isolated:
        return True
    if (a.releases and b.snapshot) or (b.releases and a.snapshot):
        return True
    common = a.access.keys() & b.access.keys()
    if not common:
        return False
    return a.releases or b.releases or any(a.access[k] or b.access[k] for k in common)


def _resources(entries: frozenset[str]) -> dict[tuple[str, ...], bool]:
    """pg_locks entries as resources: a relation, an advisory key, an object; True for more than a read."""
    out: dict[tuple[str, ...], bool] = {}
    for entry in entries:
        if entry == "snapshot":
            continue
        locktype, database, relation, classid, objid, objsubid, _vxid, mode, granted = (entry.split("|") + [""] * 9)[:9]
        if locktype == "virtualxid" or mode == "SIReadLock":
            continue
        if relation and relation != "?":
            key: tuple[str, ...] = ("relation", relation)
        elif locktype == "advisory":
            key = ("advisory", database, classid, objid, objsubid)
        else:  # a relation not committed yet, an object: no name that stays the same from run to run
            key = UNSTABLE
        writes = not (locktype == "relation" and mode == "AccessShareLock" and granted == "t")
        out[key] = out.get(key, False) or writes
    return out


UNSTABLE = ("unstable",)  # a resource named by an OID a later run's setup gives to something else


def _vxid(entries: frozenset[str]) -> str | None:
    for entry in entries:
        parts = entry.split("|")
        if parts[0] == "virtualxid" and len(parts) > 6:
            return parts[6]
    return None


def _isolated(entries: frozenset[str]) -> bool:
    return "snapshot" in entries or any(e.split("|")[7:8] == ["SIReadLock"] for e in entries)


@dataclass
class Trace:
    """One run's launches as moves, and which sessions could have gone next before each."""

    moves: list[Move]
    enabled: list[frozenset[str]]
    observed: Observed
    launched: tuple[str, ...]


def moves_of(
    run: Run, scenario: Scenario, natures: Mapping[str, Nature], needs: Mapping[str, tuple[str, ...]]
) -> Trace:
    """Fold one permutation's events into moves (``needs``: the steps whose captures a step uses)."""
    launches: list[tuple[int, str, str]] = []  # seq, step, session
    readings: list[tuple[int, dict[str, tuple[bool, frozenset[str]]]]] = []  # launches before it, per session
    finished: dict[int, tuple[int, bool, bool]] = {}  # seq -> (launches before it, waited, failed)
    for event in run.events:
        if isinstance(event, StepLaunched):
            launches.append((event.seq, event.step, event.session))
        elif isinstance(event, FootprintObserved):
            readings.append((len(launches), {name: (busy, held) for name, busy, held in event.held}))
        elif isinstance(event, StepFinished):
            finished[event.seq] = (len(launches), event.after_wait, event.outcome.error is not None)
    n = len(launches)
    done_at = {seq: finished[seq][0] - 1 if seq in finished else n for seq, _, _ in launches}
    position_of = {name: i for i, (_, name, _) in enumerate(launches)}

    def held(session: str, before: int) -> tuple[bool, frozenset[str]] | None:
        """The session's last reading taken before launch ``before`` (None: none)."""
        for count, per in reversed(readings):
            if count <= before and session in per:
                return per[session]
        return None

    def during(session: str, first: int, last: int) -> frozenset[str]:
        found: set[str] = set()
        for count, per in readings:
            if first <= count <= last and session in per:
                found |= per[session][1]
        return frozenset(found)

    scenario_defers = "deferr" in " ".join((*scenario.setup, *(s.sql for s in scenario.steps))).lower()
    all_opaque = any(CHECK_OPAQUE.search(c.sql) for c in scenario.checks)
    own: list[Move] = []
    for i, (seq, name, session) in enumerate(launches):
        end = done_at[seq]
        before_reading = held(session, i)
        before = before_reading[1] if before_reading else frozenset()
        after_reading = held(session, end + 1)
        after = after_reading[1] if after_reading else frozenset()
        touched = before | after | during(session, i + 1, end + 1)
        access = _resources(touched)
        nature = natures.get(name, Nature(True, False, False))
        vx_before, vx_after = _vxid(before), _vxid(after)
        releases = bool(_resources(before).keys() - _resources(after).keys()) or (
            vx_before is not None and vx_before != vx_after
        )
        isolated = _isolated(before) or _isolated(after)
        opaque = (
            all_opaque
            or nature.opaque
            or seq not in finished
            or finished[seq][2]  # failed
            or after_reading is None  # its session was lost
            or after_reading[0]  # still busy when last read
            or (vx_before is None and vx_after is None and not nature.local)  # autocommit: its locks are gone
            or (vx_before is not None and vx_after not in (None, vx_before) and not nature.single_transaction_statement)
            or (releases and (scenario_defers or isolated))
            or UNSTABLE in access
        )
        enablers: list[int] = []
        previous = [j for j in range(i) if launches[j][2] == session]
        if previous and done_at[launches[previous[-1]][0]] != previous[-1]:
            enablers.append(done_at[launches[previous[-1]][0]])
        for needed in needs.get(name, ()):
            j = position_of.get(needed)
            if j is not None and j < i:
                enablers.append(done_at[launches[j][0]])
        snapshot = "snapshot" in after and ("snapshot" not in before or vx_before != vx_after)
        own.append(Move(name, session, access, opaque, releases, snapshot, isolated, tuple(sorted(set(enablers)))))
    moves: list[Move] = []
    for i, move in enumerate(own):
        waiters = [own[j] for j, (seq, _, _) in enumerate(launches) if j != i and done_at[seq] == i]
        if waiters:  # steps that went on during this one: their footprint is this step's too
            access = dict(move.access)
            for waiter in waiters:
                for key, writes in waiter.access.items():
                    access[key] = access.get(key, False) or writes
            move = dataclasses.replace(
                move,
                access=access,
                opaque=move.opaque or any(w.opaque for w in waiters),
                releases=move.releases or any(w.releases for w in waiters),
                isolated=move.isolated or any(w.isolated for w in waiters),
            )
        moves.append(move)
    enabled = [_enabled(scenario, launches, done_at, needs, i) for i in range(n)]
    observed = classify(run)
    return Trace(moves, enabled, observed, tuple(name for _, name, _ in launches))


def _enabled(
    scenario: Scenario,
    launches: Sequence[tuple[int, str, str]],
    done_at: Mapping[int, int],
    needs: Mapping[str, tuple[str, ...]],
    i: int,
) -> frozenset[str]:
    """The sessions that could launch their next step before launch ``i``."""
    chains = _chains(scenario)
    launched = {name for _, name, _ in launches[:i]}
    seq_of = {name: seq for seq, name, _ in launches}
    out = set()
    for session, chain in chains.items():
        left = [s for s in chain if s not in launched]
        if not left:
            continue
        mine = [s for s in chain if s in launched]
        if mine and done_at.get(seq_of[mine[-1]], len(launches)) >= i:
            continue  # still running a step
        if all(n in launched and done_at.get(seq_of[n], len(launches)) < i for n in needs.get(left[0], ())):
            out.add(session)
    return frozenset(out)


_CHAINS: dict[int, dict[str, list[str]]] = {}


def _chains(scenario: Scenario) -> dict[str, list[str]]:
    from pgrace.drivers.space import Space

    key = id(scenario)
    if key not in _CHAINS:
        space = Space(scenario)
        _CHAINS.clear()
        _CHAINS[key] = {scenario.step(chain[0]).session: list(chain) for chain in space.chains}
    return _CHAINS[key]


@dataclass
class Node:
    """A prefix of launches: who could go next, who sleeps there, who was and is to be run next."""

    enabled: frozenset[str]
    sleep: dict[str, Move]  # inherited: their next move is known to commute with what led here
    explored: list[str] = field(default_factory=list)
    backtrack: list[str] = field(default_factory=list)
    next_move: dict[str, Move] = field(default_factory=dict)

    def asleep(self, before: str | None = None) -> dict[str, Move]:
        """The inherited sleepers, and the sessions explored here before ``before`` (all, when None)."""
        out = dict(self.sleep)
        for session in self.explored:
            if session == before:
                break
            if session in self.next_move:
                out[session] = self.next_move[session]
        return out


class Search:
    """Source-set DPOR with sleep sets, one whole run at a time (depth first).

    ``execute(order)`` runs one interleaving (a tuple of step names) and returns its trace.
    """

    def __init__(
        self,
        scenario: Scenario,
        execute: Callable[[tuple[str, ...]], Trace],
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        from pgrace.drivers.space import Space

        self.scenario = scenario
        self.space = Space(scenario)
        self.execute = execute
        self.on_progress = on_progress
        self.nodes: dict[tuple[str, ...], Node] = {}
        self.runs = 0
        self.diverged = 0
        self.cut = False  # stopped at max_runs
        self.chains = _chains(scenario)

    def run(self, on_trace: Callable[[Trace], None], max_runs: int | None = None) -> bool:
        """Explore until no prefix has a session left to try (or ``max_runs``); True when all was covered."""
        path: tuple[str, ...] = ()
        request: tuple[tuple[str, ...], int] | None = (self._continue((), None, set()), 0)
        while request is not None:
            if max_runs is not None and self.runs >= max_runs:
                self.cut = True
                break
            order, depth = request
            trace = self.execute(order)
            self.runs += 1
            on_trace(trace)
            if trace.launched[: depth + 1] != order[: depth + 1]:
                self.diverged += 1  # the server did not do what it did before: no claim about this branch
            else:
                path = self._insert(trace, depth)
            request = self._next(path)
            if self.on_progress is not None:
                self.on_progress(self.runs, self.runs + self._left(path) + (request is not None))
        return self.diverged == 0 and not self.cut

    def _left(self, path: tuple[str, ...]) -> int:
        """Sessions still to try at the prefixes of the path: a lower bound of the runs to come."""
        left = 0
        for pos in range(len(path) + 1):
            node = self.nodes.get(path[:pos])
            if node is not None:
                left += len([s for s in node.backtrack if s not in node.explored and s not in node.sleep])
        return left

    def _insert(self, trace: Trace, depth: int) -> tuple[str, ...]:
        """Add a run's launches to the tree from ``depth`` on; detect its races. Returns the path kept."""
        names = trace.launched
        kept = len(names)
        for pos in range(depth, len(names)):
            prefix = names[:pos]
            node = self.nodes.get(prefix)
            if node is None and pos == 0:
                node = self.nodes[prefix] = Node(trace.enabled[0], {})
            elif node is None:
                parent = self.nodes[names[: pos - 1]]
                before = trace.moves[pos - 1]
                inherited = parent.asleep(before.session)
                sleep = {s: m for s, m in inherited.items() if not dependent(m, before)}
                node = self.nodes[prefix] = Node(trace.enabled[pos], sleep)
            move = trace.moves[pos]
            if pos > depth:
                if move.session in node.asleep(move.session) or move.session in node.explored:
                    kept = pos  # a sleeping session went on: what follows is covered elsewhere
                    free = [s for s in sorted(node.enabled) if s not in node.asleep() and s not in node.explored]
                    if free and not set(free) & set(node.backtrack):
                        node.backtrack.append(free[0])
                    break
                node.explored.append(move.session)
                node.backtrack.append(move.session)
            elif move.session not in node.explored:  # the first run's first step
                node.explored.append(move.session)
                node.backtrack.append(move.session)
            node.next_move.setdefault(move.session, move)
        if kept == len(names):
            self.nodes.setdefault(names, Node(frozenset(), {}))
        self._races(trace, depth, kept)
        return names[: kept + 1] if kept < len(names) else names

    def _races(self, trace: Trace, depth: int, kept: int) -> None:
        moves = trace.moves[:kept]
        names = trace.launched
        n = len(moves)
        before: list[set[int]] = []  # happens-before: the positions each one comes after
        direct: list[set[int]] = []
        for j, move in enumerate(moves):
            edges = {i for i in range(j) if dependent(moves[i], move)} | set(move.enablers)
            direct.append(edges)
            closure: set[int] = set()
            for i in edges:
                closure.add(i)
                closure |= before[i]
            before.append(closure)
        for j in range(max(depth, 1), n):
            move = moves[j]
            for i in sorted(direct[j]):
                if moves[i].session == move.session or i in move.enablers or not dependent(moves[i], move):
                    continue
                if any(i in before[k] for k in before[j] if k > i):
                    continue  # not an immediate race: something between orders them
                later = [k for k in range(i + 1, j) if i not in before[k]] + [j]
                initials = {moves[k].session for k in later if not (before[k] & set(later))}
                node = self.nodes[names[:i]]
                if initials & (set(node.backtrack) | set(node.explored)):
                    continue
                possible = sorted(initials & node.enabled)
                if possible:
                    node.backtrack.append(possible[0])
                else:  # none of them could go there: every session that could
                    node.backtrack.extend(s for s in sorted(node.enabled) if s not in node.backtrack)

    def _next(self, path: tuple[str, ...]) -> tuple[tuple[str, ...], int] | None:
        """The deepest prefix of the last path with a session left to try: run it next."""
        for pos in range(len(path), -1, -1):
            prefix = path[:pos]
            node = self.nodes.get(prefix)
            if node is None:
                continue
            for session in node.backtrack:
                if session in node.explored or session in node.sleep:
                    continue
                node.explored.append(session)
                return self._continue(prefix, session, set(node.asleep())), pos
        return None

    def _continue(self, prefix: tuple[str, ...], first: str | None, avoid: set[str]) -> tuple[str, ...]:
        """A whole interleaving: the prefix, ``first``'s next step, then the same session while it can."""
        space = self.space
        at = [0] * len(space.chains)
        for name in prefix:
            at[space.where[name][0]] += 1
        index_of = {self.scenario.step(chain[0]).session: i for i, chain in enumerate(space.chains)}
        order = list(prefix)
        current = index_of[first] if first is not None else None
        while len(order) < len(space.where):
            eligible = space._eligible(tuple(at))
            if current not in eligible:
                fresh = [i for i in eligible if space.scenario.step(space.chains[i][0]).session not in avoid]
                current = (fresh or eligible)[0]
            order.append(space.chains[current][at[current]])
            at[current] += 1
        return tuple(order)


@contextmanager
def executor(
    scenario: Scenario, server: ServerInfo, step_timeout: float
) -> Iterator[Callable[[tuple[str, ...]], Trace]]:
    """Runs one interleaving at a time on one set of connections, in one scratch database."""
    from pgrace.drivers.space import EXPLORE_SCHEMA, Space, explore_options, prepared
    from pgrace.engine.runner import Runner
    from pgrace.scratch import scratch_database_with_schema

    runnable = dataclasses.replace(prepared(scenario), permutations=())
    options = explore_options(step_timeout, footprints=True)
    space = Space(scenario)
    natures = {s.name: nature_of(s, scenario) for s in scenario.steps}
    needs = {name: tuple(space.chains[i][k] for i, k in pairs) for name, pairs in space.needs.items()}
    with scratch_database_with_schema(server, f"explore_{scenario.name}", EXPLORE_SCHEMA) as db:
        run = Run(runnable, server.version, server.label, False)
        with Runner(runnable, db.dsn, run, options, None, db.observer_dsn) as runner:
            count = 0

            def execute(order: tuple[str, ...]) -> Trace:
                nonlocal count
                del run.events[:]
                runner.run_one(count, tuple(PermutationStep(name) for name in order))
                count += 1
                one = Run(runnable, server.version, server.label, False)
                one.events = [e for e in run.events]
                assert one.events and isinstance(one.events[0], PermutationStarted)
                return moves_of(one, scenario, natures, needs)

            yield execute


def explore_reduced(
    scenario: Scenario,
    server: ServerInfo,
    step_timeout: float,
    on_observed: Callable[[Observed], None],
    on_progress: Callable[[int, int], None] | None = None,
    max_runs: int | None = None,
) -> tuple[int, bool]:
    """Run the reduced search; ``on_observed`` gets each run's outcome. Returns (runs, complete).

    ``on_progress(runs, runs + known to be left)`` after each run.
    """
    with executor(scenario, server, step_timeout) as execute:
        search = Search(scenario, execute, on_progress)
        complete = search.run(lambda trace: on_observed(trace.observed), max_runs)
    return search.runs, complete
