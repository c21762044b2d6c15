"""Source-set DPOR with sleep sets over whole real runs, one run at a time (depth first).

A search can be rooted at a prefix of launches: it then covers every execution that begins
with that prefix, as DPOR from the state the prefix leaves (no sleep sets inherited, no
backtracking inside the prefix). The executions that begin with each of a partition's
prefixes are all of them: roots are how shards and worker processes split one search.
Siblings are taken in number order, as one search would take them depth first: at each
prefix of the root, a session that could have gone instead and comes first in the
numbering is searched by another root, so it sleeps here while its next move commutes
with the root's (that move is read from a run that took it, one run each when none has).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pgrace.drivers.reduce.moves import Move, Trace, chains, dependent
from pgrace.model.scenario import Scenario

__all__ = ["ChoiceSearch", "Node", "Search"]


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
    ``root``: the prefix every run begins with. When the server cannot launch it as it is
    (a session still blocked when its step's turn comes), no execution begins with it:
    those interleavings launch as some other prefix does, and the search ends at once,
    having covered them (``elsewhere``). ``known``: the moves seen at prefixes shorter than
    the root, by (prefix, session), shared by the searches of one partition's roots.
    """

    def __init__(
        self,
        scenario: Scenario,
        execute: Callable[[tuple[str, ...]], Trace],
        on_progress: Callable[[int, int], None] | None = None,
        root: tuple[str, ...] = (),
        known: dict[tuple[tuple[str, ...], str], Move] | None = None,
    ) -> None:
        from pgrace.model.orders.space import Space

        self.scenario = scenario
        self.space = Space(scenario)
        self.chains = chains(scenario)
        self._begin(execute, on_progress, root, known)

    def _begin(
        self,
        execute: Callable[[tuple[str, ...]], Trace],
        on_progress: Callable[[int, int], None] | None,
        root: tuple[str, ...],
        known: dict[tuple[tuple[str, ...], str], Move] | None,
    ) -> None:
        self.execute = execute
        self.on_progress = on_progress
        self.nodes: dict[tuple[str, ...], Node] = {}
        self.runs = 0
        self.diverged = 0
        self.cut = False  # stopped at max_runs
        self.root = root
        self.elsewhere = False  # the root cannot be launched as it is: its interleavings run as others
        self.known = known if known is not None else {}
        self.root_sleep: dict[str, Move] = {}

    def run(self, on_trace: Callable[[Trace], None], max_runs: int | None = None) -> bool:
        """Explore until no prefix has a session left to try (or ``max_runs``); True when all was covered."""
        path: tuple[str, ...] = ()
        root = len(self.root)
        request: tuple[tuple[str, ...], int] | None = (self._continue(self.root, None, set()), root)
        while request is not None:
            if max_runs is not None and self.runs >= max_runs:
                self.cut = True
                break
            order, depth = request
            first = self.runs == 0
            trace = self._execute(order, on_trace)
            if first and root:
                if trace.launched[:root] != self.root:
                    if self._cannot_launch(trace):
                        self.elsewhere = True
                    else:
                        self.diverged += 1
                    break
                sleepers = self._sleepers(trace, on_trace)
                if sleepers is None:
                    self.elsewhere = True
                    break
                self.root_sleep = sleepers
            checked = depth if first and root else depth + 1  # the root's next step: any that went
            if trace.launched[:checked] != order[:checked]:
                self.diverged += 1  # the server did not do what it did before: no claim about this branch
            else:
                path = self._insert(trace, depth)
            request = self._next(path)
            if self.on_progress is not None:
                self.on_progress(self.runs, self.runs + self._left(path) + (request is not None))
        return self.diverged == 0 and not self.cut

    def _execute(self, order: tuple[str, ...], on_trace: Callable[[Trace], None]) -> Trace:
        trace = self.execute(order)
        self.runs += 1
        on_trace(trace)
        for k in range(min(len(self.root), len(trace.moves))):
            self.known.setdefault((trace.launched[:k], trace.moves[k].session), trace.moves[k])
        return trace

    def _sleepers(self, first: Trace, on_trace: Callable[[Trace], None]) -> dict[str, Move] | None:
        """Who sleeps at the root: the sessions that could go instead of a root's step, numbered before
        it (another root's), while their next move commutes with the root's moves after it. None: a
        sleeper takes a step of the root, so every run of this root is equivalent to another root's."""
        space = self.space
        sleep: dict[str, Move] = {}
        for k, name in enumerate(self.root):
            prefix = self.root[:k]
            at = tuple(sum(1 for n in prefix if space.where[n][0] == i) for i in range(len(space.chains)))
            for i in space._eligible(at):
                if i >= space.where[name][0]:
                    break
                session = self.scenario.step(space.chains[i][0]).session
                if session not in first.enabled[k]:
                    continue
                if (prefix, session) not in self.known:  # a run that takes it there, to read its move
                    self._execute(self._continue(prefix, session, set()), on_trace)
                move = self.known.get((prefix, session))
                if move is not None:  # else it went otherwise: it stays awake (sound, only slower)
                    sleep[session] = move
            if first.moves[k].session in sleep:
                return None
            sleep = {s: m for s, m in sleep.items() if not dependent(m, first.moves[k])}
        return sleep

    def _cannot_launch(self, trace: Trace) -> bool:
        """Whether the root's first step not launched as asked for belonged to a session busy at its turn."""
        launched = trace.launched
        k = next((k for k, name in enumerate(self.root) if k >= len(launched) or launched[k] != name), 0)
        if k >= len(launched):
            return False  # the run ended inside the root (a session lost): claim nothing
        return self.scenario.step(self.root[k]).session not in trace.enabled[k]

    def _left(self, path: tuple[str, ...]) -> int:
        """Sessions still to try at the prefixes of the path: a lower bound of the runs to come."""
        left = 0
        for pos in range(len(self.root), len(path) + 1):
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
            if node is None and pos == len(self.root):
                node = self.nodes[prefix] = Node(trace.enabled[pos], dict(self.root_sleep))
            elif node is None:
                parent = self.nodes[names[: pos - 1]]
                before = trace.moves[pos - 1]
                inherited = parent.asleep(before.session)
                sleep = {s: m for s, m in inherited.items() if not dependent(m, before)}
                node = self.nodes[prefix] = Node(trace.enabled[pos], sleep)
            move = trace.moves[pos]
            if pos > depth or not node.explored:  # (the root's first run may begin with a sleeper)
                if move.session in node.asleep(move.session) or move.session in node.explored:
                    kept = pos  # a sleeping session went on: what follows is covered elsewhere
                    free = [s for s in sorted(node.enabled) if s not in node.asleep() and s not in node.explored]
                    if free and not set(free) & set(node.backtrack):
                        node.backtrack.append(free[0])
                    break
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
                node = self.nodes.get(names[:i])
                if node is None:
                    continue  # a backtrack point inside the root: those executions begin otherwise
                if initials & (set(node.backtrack) | set(node.explored)):
                    continue
                possible = sorted(initials & node.enabled)
                if possible:
                    node.backtrack.append(possible[0])
                else:  # none of them could go there: every session that could
                    node.backtrack.extend(s for s in sorted(node.enabled) if s not in node.backtrack)

    def _next(self, path: tuple[str, ...]) -> tuple[tuple[str, ...], int] | None:
        """The deepest prefix of the last path with a session left to try: run it next."""
        for pos in range(len(path), len(self.root) - 1, -1):
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


class ChoiceSearch(Search):
    """The same search over code whose statements are known only by running it (no whole order up front).

    A step is named ``session.k``: the session's k-th statement. ``execute(order, avoid)``
    runs the sessions of ``order``'s steps in turn, then keeps the last one's session going
    while it is ready and, when it is not, takes the first ready session not in ``avoid``
    (the sleepers there), else the first ready; it returns the run's trace. The first run
    begins with ``first`` (every session is ready at the start).
    """

    def __init__(
        self,
        execute: Callable[[tuple[str, ...], frozenset[str]], Trace],
        first: str,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.first = first
        self.avoid: dict[tuple[str, ...], frozenset[str]] = {}
        self._begin(lambda order: execute(order, self.avoid.pop(order, frozenset())), on_progress, (), None)

    def _continue(self, prefix: tuple[str, ...], first: str | None, avoid: set[str]) -> tuple[str, ...]:
        """The prefix and ``first``'s next statement: the executor goes on from there."""
        session = self.first if first is None else first
        order = (*prefix, f"{session}.{sum(1 for name in prefix if session_of(name) == session) + 1}")
        self.avoid[order] = frozenset(avoid)
        return order


def session_of(step: str) -> str:
    """The session of a code step named ``session.k``."""
    return step.rpartition(".")[0]
