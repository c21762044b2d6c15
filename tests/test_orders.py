"""The orders a run follows: a scenario's permutations, explore's space and code's choice tree are one kind of thing.

No server: a schedule is arithmetic on names until a run follows it.
"""

from __future__ import annotations

from pgrace.frontends.spec import parse_spec
from pgrace.model.orders import Interleavings, Orders, Permutations
from pgrace.model.orders.choices import Choices, ChoiceTree, NamedOrder
from pgrace.model.orders.space import Space
from pgrace.model.scenario import PermutationStep, Scenario, Session, Step


def two_sessions(steps_each: int) -> Scenario:
    steps = tuple(Step(f"{s}{i}", s, "SELECT 1") for s in ("a", "b") for i in range(1, steps_each + 1))
    return Scenario(
        "two",
        "two sessions",
        "two.toml",
        sessions=(Session("a"), Session("b")),
        steps=steps,
        permutations=(tuple(PermutationStep(s.name) for s in steps),),
    )


def follow(choices: Choices, statements: dict[str, int]) -> list[str]:
    """Play one order of code sessions that never block: each session is ready until its statements are sent."""
    left = dict(statements)
    order = []
    while ready := [name for name, n in left.items() if n]:
        chosen = choices(ready)
        left[chosen] -= 1
        order.append(chosen)
    return order


def test_every_schedule_is_an_iterable_of_orders_with_a_size_when_known() -> None:
    scenario = two_sessions(2)
    schedules: list[Orders[object]] = [
        Permutations(scenario),
        Space(scenario),
        Interleavings([["a1", "a2"], ["b1", "b2"]]),
        ChoiceTree(limit=100),
    ]
    assert [s.size for s in schedules] == [1, 6, 6, None]  # a choice tree is known only by running it


def test_a_spec_without_permutation_lines_runs_the_interleavings_schedule() -> None:
    spec = parse_spec(
        "session a\nstep a1 { SELECT 1; }\nstep a2 { SELECT 2; }\nsession b\nstep b1 { SELECT 3; }\n", "auto.spec"
    )
    orders = [tuple(p.step for p in permutation) for permutation in Permutations(spec)]
    assert orders == list(Interleavings([["a1", "a2"], ["b1"]]))
    assert orders == [("a1", "a2", "b1"), ("a1", "b1", "a2"), ("b1", "a1", "a2")]  # isolationtester's order
    assert set(orders) == set(Space(spec))  # explore's space holds the same orders, numbered its own way


def test_the_space_lists_its_interleavings_in_number_order() -> None:
    space = Space(two_sessions(2))
    orders = list(space)
    assert orders[0] == ("a1", "a2", "b1", "b2") and len(set(orders)) == 6
    assert [space.rank(order) for order in orders] == list(range(6))


def test_the_choice_tree_walks_every_order_of_code_that_never_blocks_once() -> None:
    tree = ChoiceTree(limit=100)
    seen = ["".join(follow(choices, {"a": 2, "b": 2})) for choices in tree]
    assert seen == ["aabb", "abab", "abba", "baab", "baba", "bbaa"]  # as the space counts them: C(4, 2)
    assert tree.complete and tree.explored == 6


def test_a_choice_tree_cut_at_its_limit_says_it_is_not_complete() -> None:
    tree = ChoiceTree(limit=4)
    assert len([follow(choices, {"a": 2, "b": 2}) for choices in tree]) == 4
    assert not tree.complete


def test_a_named_order_passes_over_a_session_that_is_not_ready() -> None:
    choose = NamedOrder(["b", "b", "a"], ["a", "b"])
    assert [choose(["a", "b"]), choose(["a"]), choose(["a", "b"]), choose(["a", "b"])] == ["b", "a", "b", "a"]
