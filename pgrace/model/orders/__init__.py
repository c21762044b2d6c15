"""The orders a run follows: one protocol, and every kind of order, in one place.

A :class:`Orders` is an iterable of *orders*, each one run after the other, and knows how
many there are when that can be told before running (``size``). Its implementations:

* :class:`Interleavings`: every interleaving of fixed sequences (an isolation spec without
  permutation lines runs every one);
* :class:`Permutations`: a scenario's own permutations (its file's order, or its spec's list);
* :class:`pgrace.model.orders.space.Space`: every interleaving of a scenario's steps,
  counted and numbered without listing them (explore's space);
* :class:`pgrace.model.orders.choices.ChoiceTree`: the application's code, discovered by
  running it (with :class:`~pgrace.model.orders.choices.Follow` and
  :class:`~pgrace.model.orders.choices.NamedOrder`, the orders one code run follows).

They sit below the parsers, the engine and the drivers, which all use them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Protocol, TypeVar

from pgrace.model.scenario import PermutationStep, Scenario

Order = TypeVar("Order", covariant=True)


class Orders(Protocol[Order]):
    """Orders to run, in the enumeration's order; ``size`` None when only running tells."""

    @property
    def size(self) -> int | None: ...

    def __iter__(self) -> Iterator[Order]: ...


class Interleavings:
    """Every interleaving of ``sequences``, each kept in order, in isolationtester's order.

    isolationtester recurses depth first, trying the sessions in declaration order at
    each position. That is the lexicographic order of the sequence of session indexes,
    so this walks the distinct permutations of that multiset with the classic
    "next permutation" step (iteratively: no recursion limit however long the spec).
    """

    def __init__(self, sequences: Sequence[Sequence[str]]) -> None:
        self.sequences = sequences

    @property
    def size(self) -> int:
        return self.count([len(sequence) for sequence in self.sequences])

    @staticmethod
    def count(lengths: Sequence[int]) -> int:
        """How many interleavings keep sequences of these lengths in order: (Σn)! / Πn!."""
        count, total = 1, 0
        for length in lengths:
            total += length
            count *= math.comb(total, length)
        return count

    def __iter__(self) -> Iterator[tuple[str, ...]]:
        sequences = self.sequences
        order = [index for index, seq in enumerate(sequences) for _ in seq]
        while True:
            next_item = [0] * len(sequences)
            picked: list[str] = []
            for index in order:
                picked.append(sequences[index][next_item[index]])
                next_item[index] += 1
            yield tuple(picked)
            # Advance ``order`` to the next permutation, lexicographically.
            pivot = len(order) - 2
            while pivot >= 0 and order[pivot] >= order[pivot + 1]:
                pivot -= 1
            if pivot < 0:
                return
            swap = len(order) - 1
            while order[swap] <= order[pivot]:
                swap -= 1
            order[pivot], order[swap] = order[swap], order[pivot]
            order[pivot + 1 :] = reversed(order[pivot + 1 :])


class Permutations:
    """A scenario's permutations, as written (or its file's order)."""

    def __init__(self, scenario: Scenario) -> None:
        self.permutations = scenario.permutations

    @property
    def size(self) -> int:
        return len(self.permutations)

    def __iter__(self) -> Iterator[tuple[PermutationStep, ...]]:
        return iter(self.permutations)
