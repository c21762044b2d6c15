"""The orders of the application's code, whose statements are known only by running it.

* :class:`ChoiceTree`: every order, discovered depth first: an order is a :class:`Choices`,
  which picks among the ready sessions at each choice and records what it met; the tree's
  next order changes the last choice that has an untried alternative;
* :class:`Follow`: one run of code's reduced search, a prefix of sessions and then the same
  session while it can go;
* :class:`NamedOrder`: the sessions in an order the caller names.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence

from pgrace.errors import CodeError


class Choices:
    """One order of the code's statements: follow ``prefix`` (indices into the ready sessions), then the first.

    ``taken`` and ``met`` record every choice made and the sessions ready at each.
    """

    def __init__(self, prefix: Sequence[int] = ()) -> None:
        self.prefix = tuple(prefix)
        self.taken: list[int] = []
        self.met: list[tuple[str, ...]] = []

    def __call__(self, ready: list[str]) -> str:
        k = self.prefix[len(self.taken)] if len(self.taken) < len(self.prefix) else 0
        k = min(k, len(ready) - 1)
        self.taken.append(k)
        self.met.append(tuple(ready))
        return ready[k]


class ChoiceTree:
    """Every order of the sessions' statements, discovered depth first (a blocked session is no choice)."""

    size = None

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.explored = 0
        self.complete = True  # False: stopped at ``limit`` with schedules left

    def __iter__(self) -> Iterator[Choices]:
        prefix: list[int] = []
        while True:
            choices = Choices(prefix)
            yield choices
            self.explored += 1
            taken = choices.taken
            while taken and taken[-1] + 1 >= len(choices.met[len(taken) - 1]):
                taken.pop()
            if not taken:
                return
            if self.explored >= self.limit:
                self.complete = False
                return
            prefix = [*taken[:-1], taken[-1] + 1]


class Follow:
    """Sessions in ``sessions``' order, then the last one again while it is ready (a switch only when it must).

    When the session wanted is not ready, the first ready one not in ``avoid`` goes (else
    the first ready). ``taken`` records each choice as :class:`Choices` does, to replay it.
    """

    def __init__(self, sessions: Sequence[str], avoid: Collection[str] = ()) -> None:
        self.sessions = tuple(sessions)
        self.avoid = frozenset(avoid)
        self.current = self.sessions[-1] if self.sessions else None
        self.taken: list[int] = []

    def __call__(self, ready: list[str]) -> str:
        want = self.sessions[len(self.taken)] if len(self.taken) < len(self.sessions) else self.current
        if want not in ready:
            want = next((name for name in ready if name not in self.avoid), ready[0])
        self.current = want
        self.taken.append(ready.index(want))
        return want


class NamedOrder:
    """Sessions in ``order``; a session not ready (blocked, finished) is skipped until it is; then the first ready."""

    def __init__(self, order: Sequence[str] | None, names: Sequence[str]) -> None:
        self.pending = list(order or ())
        unknown = [n for n in self.pending if n not in names]
        if unknown:
            raise CodeError(f"order names {unknown[0]!r}, which is not a session (sessions: {', '.join(names)})")

    def __call__(self, ready: list[str]) -> str:
        for i, name in enumerate(self.pending):
            if name in ready:
                del self.pending[i]
                return name
        return ready[0]
