"""The space explore searches: every interleaving of a scenario's steps, counted and numbered.

An *interleaving* is an order of all the scenario's steps that keeps each session's own
order, and runs a step that uses a variable another session captures after the step that
captures it. :class:`Space` counts them and numbers them 0 … size-1 in a fixed order
(session by session, like counting in a mixed radix), so that a seeded sample and a shard
are both just sets of numbers; the exhaustive search and the reduced one both walk it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

from pgrace.bounds import MAX_TIED_POSITIONS
from pgrace.errors import ScenarioError
from pgrace.model import variables
from pgrace.model.outcomes import switches
from pgrace.model.scenario import Scenario

Position = tuple[int, ...]
MAX_REMEMBERED_WALKS = 100_000  # positions whose branches are kept (a few MB at most)


class Space:
    """Every interleaving of a scenario's steps, counted and numbered without listing them.

    The number of interleavings that continue from a position (how far each session has
    got) splits into two factors: the sessions tied to each other by captures (a step
    using another session's capture, and that session) are counted over their joint
    positions, once; every other session interleaves freely with them, which is a
    multinomial coefficient. Twenty-four sessions of three steps cost nothing to count.
    """

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        order = _file_order(scenario)
        self.chains: tuple[tuple[str, ...], ...] = tuple(
            tuple(name for name in order if scenario.step(name).session == s.name) for s in scenario.sessions
        )
        self.chains = tuple(chain for chain in self.chains if chain)
        where = {name: (i, k) for i, chain in enumerate(self.chains) for k, name in enumerate(chain)}
        self.where = where
        # A step that uses another session's capture (:session.name) runs after the step that
        # captures it: the last one of that session before it in the file, else its first.
        needs: dict[str, list[tuple[int, int]]] = {}
        for position, name in enumerate(order):
            for use in variables.find(scenario.step(name).sql):
                if use.session is None or use.session == scenario.step(name).session:
                    continue
                capturing = [
                    e
                    for e in order
                    if scenario.step(e).session == use.session and use.name in {v for v, _ in scenario.step(e).capture}
                ]
                before = [e for e in capturing if order.index(e) < position]
                if capturing:
                    needs.setdefault(name, []).append(where[(before or capturing[:1])[-1]])
        self.needs = {name: tuple(pairs) for name, pairs in needs.items()}
        tied = {where[name][0] for name in self.needs} | {j for pairs in self.needs.values() for j, _ in pairs}
        self.tied = tuple(sorted(tied))
        self._slot = {i: t for t, i in enumerate(self.tied)}
        self._tied_counts: dict[Position, int] | None = None
        self._walks: dict[tuple[Position, int], tuple[tuple[int, int, int], ...]] = {}

    @property
    def size(self) -> int:
        start = tuple(0 for _ in self.chains)
        return self._counts()[tuple(0 for _ in self.tied)] * multinomial(self._groups(start))

    def _eligible(self, at: Position) -> list[int]:
        chosen = []
        for i, chain in enumerate(self.chains):
            if at[i] < len(chain) and all(at[j] > k for j, k in self.needs.get(chain[at[i]], ())):
                chosen.append(i)
        return chosen

    def _groups(self, at: Position) -> list[int]:
        """The steps left: all the tied sessions' together, then each free session's."""
        left = [len(chain) - at[i] for i, chain in enumerate(self.chains)]
        return [sum(left[i] for i in self.tied), *(n for i, n in enumerate(left) if i not in self._slot)]

    def _counts(self) -> dict[Position, int]:
        """The tied sessions' interleavings from each of their joint positions (computed once, last first)."""
        if self._tied_counts is not None:
            return self._tied_counts
        lengths = [len(self.chains[i]) for i in self.tied]
        positions = math.prod(n + 1 for n in lengths)
        if positions > MAX_TIED_POSITIONS:
            names = ", ".join(self.scenario.step(self.chains[i][0]).session for i in self.tied)
            raise ScenarioError(
                f"cannot count the interleavings: sessions {names} use each other's captures in "
                f"{positions:,} joint positions (at most {MAX_TIED_POSITIONS:,})",
                self.scenario.source,
            )
        counts: dict[Position, int] = {}
        for at in reversed(list(itertools.product(*(range(n + 1) for n in lengths)))):
            total = 0
            for t, i in enumerate(self.tied):
                if at[t] < lengths[t] and all(
                    at[self._slot[j]] > k for j, k in self.needs.get(self.chains[i][at[t]], ())
                ):
                    total += counts[_advance(at, t)]
            counts[at] = total if any(at[t] < n for t, n in enumerate(lengths)) else 1
        self._tied_counts = counts
        return counts

    def _walk(self, at: Position, spread: int) -> tuple[tuple[int, int, int], ...]:
        """From ``at`` (``spread``: its multinomial factor), each session that can go next:
        (session, interleavings that continue that way, the multinomial factor after it).

        Remembered: numbering and ranking every interleaving of a run walk the same few
        positions over and over (a position's ``spread`` follows from it, so it adds no entries).
        """
        if (known := self._walks.get((at, spread))) is not None:
            return known
        counts = self._counts()
        groups = self._groups(at)
        total = sum(groups)
        tied_at = tuple(at[i] for i in self.tied)
        branches = []
        for i in self._eligible(at):
            if i in self._slot:
                after = spread * groups[0] // total
                branches.append((i, counts[_advance(tied_at, self._slot[i])] * after, after))
            else:
                after = spread * (len(self.chains[i]) - at[i]) // total
                branches.append((i, counts[tied_at] * after, after))
        found = tuple(branches)
        if len(self._walks) < MAX_REMEMBERED_WALKS:
            self._walks[(at, spread)] = found
        return found

    def split(
        self, parts: int, within: list[tuple[tuple[str, ...], int]] | None = None
    ) -> list[tuple[tuple[str, ...], int]]:
        """The shortest prefixes of the interleavings (or of ``within``'s, all as long) that there are
        at least ``parts`` of, in number order, each with how many interleavings begin with it."""
        whole: list[tuple[tuple[str, ...], int]] = [((), self.size)]
        found = within if within is not None else whole
        while len(found) < parts and found and len(found[0][0]) < len(self.where):
            found = [child for prefix, _ in found for child in self._children(prefix)]
        return found

    def _children(self, prefix: tuple[str, ...]) -> list[tuple[tuple[str, ...], int]]:
        at = tuple(sum(1 for name in prefix if self.where[name][0] == i) for i in range(len(self.chains)))
        branches = self._walk(at, multinomial(self._groups(at)))
        return [((*prefix, self.chains[i][at[i]]), below) for i, below, _ in branches]

    def __iter__(self) -> Iterator[tuple[str, ...]]:
        """Every interleaving in number order: a :class:`~pgrace.model.orders.Orders` of step names."""
        return (self.unrank(i) for i in range(self.size))

    def unrank(self, index: int) -> tuple[str, ...]:
        """The interleaving numbered ``index`` (0 ≤ index < size)."""
        if not 0 <= index < self.size:
            raise IndexError(index)
        at = tuple(0 for _ in self.chains)
        spread = multinomial(self._groups(at))
        order: list[str] = []
        while len(order) < len(self.where):
            for i, below, after in self._walk(at, spread):
                if index < below:
                    order.append(self.chains[i][at[i]])
                    at, spread = _advance(at, i), after
                    break
                index -= below
        return tuple(order)

    def rank(self, order: Sequence[str]) -> int:
        """The number of an interleaving (the inverse of :meth:`unrank`)."""
        at = tuple(0 for _ in self.chains)
        spread = multinomial(self._groups(at))
        index = 0
        for name in order:
            session, _ = self.where[name]
            for i, below, after in self._walk(at, spread):
                if i == session:
                    spread = after
                    break
                index += below
            else:
                raise ValueError(f"{name} cannot come here in an interleaving")
            at = _advance(at, session)
        return index

    def canonical(self, order: Sequence[str], sent: set[str]) -> tuple[str, ...]:
        """The lowest-numbered interleaving that sends the same steps in the same order as ``order`` did.

        Steps of a retry loop that were not sent (an attempt nobody needed, a ROLLBACK with
        no transaction to end, the rest of a failed attempt) may stand anywhere their session
        allows: the run is the same. Those are placed as early as they can go, session by
        session, the way the numbering counts. Any other step not sent (a lost session's)
        keeps ``order`` as it is.
        """
        free = {name for name in order if name not in sent}
        if not free or any(self.scenario.step(name).loop is None for name in free):
            return tuple(order)
        target = [name for name in order if name in sent]
        at = tuple(0 for _ in self.chains)
        made: list[str] = []
        sent_so_far = 0
        while len(made) < len(order):
            for i in self._eligible(at):
                name = self.chains[i][at[i]]
                if name in free or (sent_so_far < len(target) and name == target[sent_so_far]):
                    sent_so_far += name not in free
                    made.append(name)
                    at = _advance(at, i)
                    break
            else:
                return tuple(order)  # no such order: keep the interleaving as it is
        return tuple(made)

    def preference(self, launched: Sequence[str]) -> tuple[int, int]:
        """How simple an example is: (session switches, number); a launch order that is not
        a whole interleaving (a lost session's steps missing) comes last."""
        try:
            return switches(launched, self.scenario), self.rank(launched)
        except (ValueError, KeyError):
            return len(launched) + 1, self.size


def _advance(at: Position, i: int) -> Position:
    return (*at[:i], at[i] + 1, *at[i + 1 :])


def multinomial(groups: Sequence[int]) -> int:
    """The ways to interleave groups of these sizes, each keeping its own order."""
    ways, placed = 1, 0
    for n in groups:
        placed += n
        ways *= math.comb(placed, n)
    return ways


def _file_order(scenario: Scenario) -> list[str]:
    """The steps in the file's order: a pgrace scenario's one permutation, a spec's declaration order."""
    if scenario.dialect == "pgrace" and len(scenario.permutations) == 1:
        return list(dict.fromkeys(p.step for p in scenario.permutations[0]))
    return [s.name for s in scenario.steps]
