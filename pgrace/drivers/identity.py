"""Which search an exploration is a shard of: what must agree for shards to add up to one search."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pgrace.model.outcomes import whole_number
from pgrace.model.scenario import Scenario
from pgrace.model.values import to_json_value

__all__ = ["SearchIdentity", "scenario_digest"]


@dataclass(frozen=True)
class SearchIdentity:
    """What makes shards parts of one search: the same scenario text and parameters, the same settings.

    ``steps`` is a digest of the variant's setup, steps, teardown and final checks: a file
    edited between two shards is another search. ``limit`` and ``seed`` are a sample's
    (None: every interleaving); ``reduced``: split by prefixes of the numbering, not every N-th.
    """

    params: tuple[tuple[str, Any], ...]
    steps: str
    reduced: bool
    limit: int | None
    seed: int | None
    step_timeout: float

    @classmethod
    def of(
        cls, scenario: Scenario, reduced: bool, limit: int | None, seed: int | None, step_timeout: float
    ) -> SearchIdentity:
        return cls(scenario.params, scenario_digest(scenario), reduced, limit, seed, step_timeout)

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": {name: to_json_value(value) for name, value in self.params},
            "steps": self.steps,
            "reduced": self.reduced,
            "max": self.limit,
            "seed": self.seed,
            "step_timeout": self.step_timeout,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SearchIdentity:
        limit, seed, timeout = data["max"], data["seed"], data["step_timeout"]
        if not isinstance(data["params"], dict) or not isinstance(data["steps"], str):
            raise TypeError("params is an object and steps a string")
        if not isinstance(data["reduced"], bool) or type(timeout) not in (int, float):
            raise TypeError("reduced is true or false and step_timeout a number")
        return cls(
            tuple(data["params"].items()),
            data["steps"],
            data["reduced"],
            None if limit is None else whole_number(limit, "max"),
            None if seed is None else _integer(seed, "seed"),
            float(timeout),
        )

    def differences(self, other: SearchIdentity) -> list[str]:
        """What ``other`` set otherwise, in the reader's words (empty: the same search)."""
        said = []
        mine, theirs = self.to_dict(), other.to_dict()
        if mine["params"] != theirs["params"]:
            said.append(f"params {_params_text(theirs['params'])}, not {_params_text(mine['params'])}")
        if self.steps != other.steps:
            said.append("another text of the scenario (setup, steps or checks)")
        for key, words in SETTINGS:
            if mine[key] != theirs[key]:
                said.append(f"{words} {_setting_text(theirs[key])}, not {_setting_text(mine[key])}")
        return said


SETTINGS = (("reduced", "reduced"), ("max", "max"), ("seed", "seed"), ("step_timeout", "step_timeout"))


def _integer(value: Any, name: str) -> int:
    if type(value) is not int:
        raise ValueError(f"{name} is not a whole number: {str(value)[:40]}")
    return value


def _params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{name}={value}" for name, value in params.items()) or "none"


def _setting_text(value: Any) -> str:
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def scenario_digest(scenario: Scenario) -> str:
    """A short digest of what a variant runs and checks: shards of another text are not parts of one search."""
    told = [
        list(scenario.setup),
        [[s.name, s.session, s.sql, s.sleep, s.loop, s.attempt] for s in scenario.steps],
        list(scenario.teardown),
        [[c.description, c.sql, c.rows] for c in scenario.checks],
    ]
    return hashlib.sha256(json.dumps(told, default=str).encode()).hexdigest()[:16]
