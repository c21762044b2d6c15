"""The reduced search (source-set DPOR with sleep sets) over synthetic steps: no server, only read and write sets.

Each step of a synthetic scenario reads and writes named variables (``r x,y w z``). Running
an order of them is exact and instant: a step reads its variables into its session's
register, then writes the register into its own. Two steps of different sessions depend
on each other when one writes a variable the other reads or writes, which is what
:func:`~pgrace.drivers.reduce.moves.dependent` says of their moves: every variable is a
resource, written or only read. So the outcome of an order is the same for every order of
its class (orders that differ by swapping neighbours that commute), and the reduced
search must find every outcome the exhaustive one does, running one order per class
or little more.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from pgrace.drivers.reduce.moves import Access, Move, Trace
from pgrace.drivers.reduce.search import ChoiceSearch, Search
from pgrace.model.orders.space import Space
from pgrace.model.outcomes import Observed
from pgrace.model.scenario import Scenario, Session, Step

VARIABLES = ("x", "y", "z")


@dataclass(frozen=True)
class Op:
    """One synthetic step: what it reads and what it writes."""

    reads: frozenset[str]
    writes: frozenset[str]

    @property
    def text(self) -> str:
        return f"r {','.join(sorted(self.reads)) or '-'} w {','.join(sorted(self.writes)) or '-'}"


class World:
    """Sessions of synthetic steps named session and number (``a1``, ``a2``, ``b1`` ...)."""

    def __init__(self, sessions: Sequence[Sequence[Op]]) -> None:
        self.ops: dict[str, Op] = {}
        self.session_of: dict[str, str] = {}
        steps = []
        for i, ops in enumerate(sessions):
            session = "abcdef"[i]
            for k, op in enumerate(ops, 1):
                name = f"{session}{k}"
                self.ops[name] = op
                self.session_of[name] = session
                steps.append(Step(name, session, op.text))
        names = tuple(Session("abcdef"[i]) for i in range(len(sessions)))
        self.scenario = Scenario("synthetic", "synthetic", "synthetic.toml", sessions=names, steps=tuple(steps))
        self.executed: list[tuple[str, ...]] = []

    def move(self, name: str) -> Move:
        op = self.ops[name]
        access: dict[tuple[str, ...], Access] = {("relation", v): Access(v in op.writes) for v in op.reads | op.writes}
        return Move(name, self.session_of[name], access, opaque=False)

    def outcome(self, order: Sequence[str]) -> Observed:
        state = dict.fromkeys(VARIABLES, "0")
        register = {s.name: s.name for s in self.scenario.sessions}
        for name in order:
            op, session = self.ops[name], self.session_of[name]
            register[session] += "(" + ",".join(state[v] for v in sorted(op.reads)) + ")"
            for v in op.writes:
                state[v] = f"{name}[{register[session]}]"
        final = (tuple((v, state[v]) for v in VARIABLES), tuple(sorted(register.items())))
        return Observed(True, (), (), final, False, tuple(order))

    def trace(self, order: Sequence[str]) -> Trace:
        """The run of ``order``: every session with a step left could have gone next at each point."""
        self.executed.append(tuple(order))
        enabled = []
        for i in range(len(order)):
            left = {self.session_of[n] for n in order[i:]}
            enabled.append(frozenset(left))
        return Trace([self.move(n) for n in order], enabled, self.outcome(order), tuple(order))

    def dependent(self, a: str, b: str) -> bool:
        """The truth: same session, or one writes what the other reads or writes."""
        x, y = self.ops[a], self.ops[b]
        return self.session_of[a] == self.session_of[b] or bool(x.writes & (y.reads | y.writes) or y.writes & x.reads)

    def mazurkiewicz(self, order: Sequence[str]) -> frozenset[tuple[str, str]]:
        """An order's class: which of every two dependent steps comes first."""
        return frozenset((a, b) for i, a in enumerate(order) for b in order[i + 1 :] if self.dependent(a, b))

    def every_order(self) -> list[tuple[str, ...]]:
        return list(Space(self.scenario))

    def reduced(self, max_runs: int | None = None) -> tuple[Search, list[Trace]]:
        traces: list[Trace] = []
        search = Search(self.scenario, self.trace)
        search.run(traces.append, max_runs)
        return search, traces


def op(text: str) -> Op:
    """``"r x w y"`` as an Op (``-``: nothing)."""
    _, reads, _, writes = text.split()
    return Op(frozenset(reads.split(",")) - {"-"}, frozenset(writes.split(",")) - {"-"})


ops = st.builds(
    Op,
    st.frozensets(st.sampled_from(VARIABLES), max_size=2),
    st.frozensets(st.sampled_from(VARIABLES), max_size=2),
)
worlds = st.lists(st.lists(ops, min_size=1, max_size=3), min_size=2, max_size=3).filter(
    lambda sessions: sum(len(s) for s in sessions) <= 7
)


@settings(max_examples=100, deadline=None)
@given(worlds)
def test_the_reduced_search_finds_every_outcome_class_the_exhaustive_one_does(sessions: list[list[Op]]) -> None:
    world = World(sessions)
    every = world.every_order()
    search, traces = world.reduced()
    assert search.diverged == 0 and not search.cut
    assert {trace.observed.key for trace in traces} == {world.outcome(order).key for order in every}
    # More than outcomes: an order of every class of equivalent orders was run, and no more runs than orders.
    classes = {world.mazurkiewicz(order) for order in every}
    assert {world.mazurkiewicz(trace.launched) for trace in traces} == classes
    assert len(classes) <= search.runs <= len(every)


def test_steps_that_touch_different_variables_commute_one_run_covers_them_all() -> None:
    world = World([[op("r x w x"), op("r - w x")], [op("r y w y"), op("r y w -")]])
    assert len(world.every_order()) == 6
    search, traces = world.reduced()
    assert search.runs == 1 and [t.launched for t in traces] == [("a1", "a2", "b1", "b2")]


def test_reads_of_one_variable_commute() -> None:
    world = World([[op("r x w -")], [op("r x w -")], [op("r x w -")]])
    assert len(world.every_order()) == 6
    assert world.reduced()[0].runs == 1


def test_two_writes_of_one_variable_conflict_both_orders_are_run() -> None:
    world = World([[op("r - w x")], [op("r - w x")]])
    _, traces = world.reduced()
    assert [t.launched for t in traces] == [("a1", "b1"), ("b1", "a1")]
    assert len({t.observed.key for t in traces}) == 2  # the last write wins


def test_a_race_puts_the_other_session_in_the_source_set_where_the_race_began() -> None:
    # a1 and b2 race on x; b1 commutes with a1. The race's source set at the root is {b}:
    # running b first, from there on, is enough; a2 (on y) commutes with everything.
    world = World([[op("r - w x"), op("r y w y")], [op("r z w z"), op("r x w -")]])
    search, traces = world.reduced()
    root = search.nodes[()]
    assert root.explored == ["a", "b"] and root.backtrack == ["a", "b"]
    assert [t.launched for t in traces] == [("a1", "a2", "b1", "b2"), ("b1", "b2", "a1", "a2")]


def test_the_writer_and_two_readers_need_one_run_per_reader_order_against_the_writer() -> None:
    # Each reader reads x before or after the writer's write: four classes, four runs, not 3! = 6.
    world = World([[op("r - w x")], [op("r x w -")], [op("r x w -")]])
    classes = {world.mazurkiewicz(order) for order in world.every_order()}
    search, _ = world.reduced()
    assert len(classes) == 4 and search.runs == 4


def test_a_session_explored_first_sleeps_in_its_siblings_subtree_while_its_step_commutes() -> None:
    # a1 races with b2 (both write x): the root runs a first, then b. Below b1, a sleeps: a1
    # commutes with b1, so b1 a1 b2 is a1 b1 b2, run already; a wakes after b2, which writes x.
    world = World([[op("r - w x")], [op("r - w y"), op("r - w x")]])
    search, traces = world.reduced()
    below_b1 = search.nodes[("b1",)]
    assert {s: m.name for s, m in below_b1.sleep.items()} == {"a": "a1"}
    assert "a" in below_b1.backtrack and below_b1.explored == ["b"]  # wanted by a race, but asleep: not run
    assert search.nodes[("b1", "b2")].sleep == {}
    assert [t.launched for t in traces] == [("a1", "b1", "b2"), ("b1", "b2", "a1")]  # of the 3 orders


def test_a_run_cut_at_max_runs_covers_nothing_for_sure() -> None:
    world = World([[op("r - w x")], [op("r - w x")], [op("r - w x")]])
    search, traces = world.reduced(max_runs=2)
    assert search.runs == len(traces) == 2 and search.cut
    assert not Search(world.scenario, world.trace).run(lambda trace: None, 2)


def test_a_run_the_server_did_not_launch_as_asked_is_no_claim() -> None:
    world = World([[op("r - w x")], [op("r - w x")]])

    def contrary(order: tuple[str, ...]) -> Trace:
        return world.trace(tuple(reversed(order)))  # as if every launch went otherwise

    search = Search(world.scenario, contrary)
    assert not search.run(lambda trace: None)
    assert search.diverged > 0


@settings(max_examples=40, deadline=None)
@given(worlds, st.integers(2, 6))
def test_the_searches_rooted_at_a_partitions_prefixes_find_every_class_together(
    sessions: list[list[Op]], parts: int
) -> None:
    world = World(sessions)
    classes = {world.mazurkiewicz(order) for order in world.every_order()}
    found = set()
    known: dict[tuple[tuple[str, ...], str], Move] = {}
    for root, _ in Space(world.scenario).split(parts):
        traces: list[Trace] = []
        search = Search(world.scenario, world.trace, root=root, known=known)
        assert search.run(traces.append)
        found |= {world.mazurkiewicz(t.launched) for t in traces}
    assert found == classes


@settings(max_examples=50, deadline=None)
@given(worlds)
def test_the_search_over_code_met_as_it_runs_finds_every_class_too(sessions: list[list[Op]]) -> None:
    """ChoiceSearch: step ``a.2`` is session a's second statement, known only once a has run its first."""
    world = World(sessions)
    code_name = {name: f"{world.session_of[name]}.{name[1:]}" for name in world.ops}
    plain = {v: k for k, v in code_name.items()}
    counts = {s.name: sum(1 for n in world.ops if world.session_of[n] == s.name) for s in world.scenario.sessions}

    def execute(order: tuple[str, ...], avoid: frozenset[str]) -> Trace:
        launched = list(order)
        done = {s: sum(1 for n in launched if n.startswith(s + ".")) for s in counts}
        while len(launched) < len(world.ops):
            ready = [s for s in counts if done[s] < counts[s]]
            last = launched[-1].partition(".")[0]
            fresh = [s for s in ready if s not in avoid]
            session = last if last in ready else (fresh or ready)[0]
            done[session] += 1
            launched.append(f"{session}.{done[session]}")
        trace = world.trace([plain[n] for n in launched])
        moves = [Move(code_name[m.name], m.session, m.access, m.opaque) for m in trace.moves]
        return Trace(moves, trace.enabled, trace.observed, tuple(launched))

    traces: list[Trace] = []
    search = ChoiceSearch(execute, world.scenario.sessions[0].name)
    assert search.run(traces.append)
    classes = {world.mazurkiewicz(order) for order in world.every_order()}
    assert {world.mazurkiewicz([plain[n] for n in t.launched]) for t in traces} == classes


def test_the_synthetic_dependence_is_the_moves_dependence() -> None:
    """The worlds above are honest only if :func:`dependent` says of their moves what the world's truth says."""
    from pgrace.drivers.reduce.moves import dependent

    texts = [f"r {r} w {w}" for r, w in itertools.product(("-", "x", "y", "x,y"), repeat=2)]
    for left, right in itertools.product(texts, repeat=2):
        world = World([[op(left)], [op(right)]])
        assert dependent(world.move("a1"), world.move("b1")) == world.dependent("a1", "b1"), (left, right)
