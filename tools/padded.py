"""A scenario padded with what a real incident brings along: the input minimize's tests and bench shrink back."""

from __future__ import annotations

import dataclasses

from pgrace.model.scenario import PermutationStep, Scenario, Session, Step

__all__ = ["PAD_SETUP", "padded"]

PAD_SETUP = (
    "CREATE TABLE pgrace_pad (id int PRIMARY KEY, note text);\nINSERT INTO pgrace_pad VALUES (1, 'a'), (2, 'b');\n"
)


def padded(scenario: Scenario) -> Scenario:
    """The scenario with an unrelated session, steps, a table and seed rows: what a real incident brings along."""
    pads = (
        Step("pad-begin", "bystander", "BEGIN"),
        Step("pad-read", "bystander", "SELECT note FROM pgrace_pad WHERE id = 1"),
        Step("pad-write", "bystander", "UPDATE pgrace_pad SET note = 'c' WHERE id = 2"),
        Step("pad-commit", "bystander", "COMMIT"),
    )
    order = tuple(p.step for p in scenario.permutations[0])
    return dataclasses.replace(
        scenario,
        sessions=(*scenario.sessions, Session("bystander")),
        steps=(*scenario.steps, *pads),
        setup=(*scenario.setup, PAD_SETUP),
        permutations=(tuple(PermutationStep(n) for n in (order[0], *(p.name for p in pads), *order[1:])),),
    )
