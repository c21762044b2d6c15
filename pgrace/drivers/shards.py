"""Shards of one search read back from JSON and merged: complete only when each of the N is there once.

A shard's JSON says which search it is a shard of (:class:`~pgrace.model.exploration.SearchIdentity`)
and which of N shards it holds; :func:`merge_explorations` refuses a part of another search
or a shard held twice (exit 2, naming the file), and a merge missing shards is a part.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from typing import Any

from pgrace.errors import ScenarioError
from pgrace.model.exploration import Exploration, SearchIdentity, scenario_digest
from pgrace.model.orders.space import Space
from pgrace.model.outcomes import Claim, OutcomeClass, merge_classes, whole_number
from pgrace.model.scenario import Scenario

__all__ = ["exploration_from_dict", "merge_explorations", "read_explorations"]


def exploration_from_dict(data: dict[str, Any], space: Space, origin: str | None = None) -> Exploration:
    from pgrace.model.exploration import Bound

    try:
        classes = [OutcomeClass.from_dict(c, space.preference) for c in data["classes"]]
        guarantee = data.get("guarantee", {"kind": "complete"})
        bounded = guarantee["kind"] in ("preemptions", "pct")
        shard = data.get("shard")
        if "search" not in data or not isinstance(shard, dict):  # written before shards said which search
            raise ScenarioError(
                'not a shard of a known search: it does not say which (no "search" and "shard"); explore again',
                origin,
            )
        n = whole_number(shard["n"], "shard n")
        held = tuple(whole_number(k, "shard held") for k in shard["held"])
        if n < 1 or not held or not all(1 <= k <= n for k in held) or len(set(held)) != len(held):
            raise ValueError(f"shard holds {held} of {n}")
        claim: Claim = "bug" if data.get("claim", "no bug") == "bug" else "no bug"
        return Exploration(
            str(data["scenario"]),
            str(data["variant"]),
            whole_number(data["space"], "space"),
            whole_number(data["explored"], "explored"),
            data["seed"],
            classes,
            shard=(held[0], n),
            runs=whole_number(data["runs"], "runs") if "runs" in data else None,
            complete=bool(data.get("complete", True)),
            repeats=whole_number(data.get("repeats", 0), "repeats"),
            bound=Bound.from_dict(guarantee, whole_number(data["runs"], "runs")) if bounded else None,
            search=None if data["search"] is None else SearchIdentity.from_dict(data["search"]),
            held=held,
            origin=origin,
            claim=claim,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ScenarioError(f"not an exploration's JSON ({exc.__class__.__name__}: {exc})", origin) from None


def merge_explorations(parts: Sequence[Exploration], scenario: Scenario | None = None) -> Exploration:
    """Shards of one search added up; complete only when it holds each of the N shards exactly once.

    Every part must be a shard of the same search (scenario, variant, parameters, text, space,
    settings and N; ``scenario``, when given, is what the parts must have explored); a shard
    held twice is refused. Shards missing leave a part, which says which are missing.
    """
    if not parts:
        raise ScenarioError("nothing to merge")
    first = parts[0]
    if any(p.bound is not None for p in parts):
        raise ScenarioError("cannot merge bounded explorations (preemption-bounded, PCT): they are not shards")
    holder: dict[int, Exploration] = {}
    for part in parts:
        _check_same_search(first, part, scenario)
        for k in part.shards_held:
            if k in holder:
                again = "holds it too" if holder[k] is part else f"{_named(holder[k])} holds it"
                raise ScenarioError(f"shard {k}/{part.shard[1]} again: {again}; merge each shard once", part.origin)
            holder[k] = part
    explored = sum(p.explored for p in parts)
    held = tuple(sorted(holder))
    return Exploration(
        first.scenario,
        first.variant,
        first.space,
        explored,
        first.seed,
        merge_classes(p.classes for p in parts),
        shard=(held[0], first.shard[1]),
        runs=sum(p.run_count for p in parts),
        complete=all(p.complete for p in parts),
        repeats=sum(p.repeats for p in parts),
        search=first.search,
        held=held,
        claim=first.claim,
        subject=scenario,
    )


def _named(part: Exploration) -> str:
    return part.origin or f"shard {'+'.join(map(str, part.shards_held))}/{part.shard[1]}"


def _check_same_search(first: Exploration, part: Exploration, scenario: Scenario | None) -> None:
    """Refuse (exit 2, naming the file) a part of another search than the first's, or than ``scenario``."""
    if part.search is None:
        raise ScenarioError("not a shard of a search (an exploration of code is never split)", part.origin)
    if scenario is not None and (part.scenario, part.variant) != (scenario.name, scenario.variant):
        raise ScenarioError(
            f"a shard of {part.scenario} ({part.variant}), not of {scenario.name} ({scenario.variant})", part.origin
        )
    if scenario is not None:
        wanted = dataclasses.replace(part.search, params=scenario.params, steps=scenario_digest(scenario))
        if said := wanted.differences(part.search):
            raise ScenarioError(f"another search than this scenario's: {'; '.join(said)}", part.origin)
    if part is first:
        return
    assert first.search is not None
    said = first.search.differences(part.search)
    if (part.scenario, part.variant) != (first.scenario, first.variant):
        said.insert(0, f"{part.scenario} ({part.variant}), not {first.scenario} ({first.variant})")
    if part.space != first.space:
        said.append(f"{part.space:,} interleavings, not {first.space:,}")
    if part.shard[1] != first.shard[1]:
        said.append(f"a shard of {part.shard[1]}, not of {first.shard[1]}")
    if said:
        raise ScenarioError(f"another search than {_named(first)}'s: {'; '.join(said)}", part.origin)


def read_explorations(texts: Iterable[tuple[str, str]], space: Space) -> list[Exploration]:
    """Parse the JSON of shards (``(name, text)`` pairs) for :func:`merge_explorations`."""
    parts = []
    for name, text in texts:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ScenarioError(f"not JSON: {exc.msg}", name, exc.lineno) from None
        except ValueError as exc:  # a number of more digits than Python converts
            raise ScenarioError(f"not an exploration's JSON ({exc})", name) from None
        except RecursionError:
            raise ScenarioError("not an exploration's JSON (nested deeper than pgrace writes it)", name, 1) from None
        if not isinstance(data, dict):
            raise ScenarioError("not an exploration's JSON (an object expected)", name)
        parts.append(exploration_from_dict(data, space, name))
    return parts
