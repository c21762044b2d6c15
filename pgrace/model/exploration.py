"""What ``pgrace explore`` found: the outcome classes of a variant's interleavings, and what the search covered.

The search itself is :mod:`pgrace.drivers.explore`; a bounded one's guarantee is a :class:`Bound`,
and which search a shard is part of, a :class:`SearchIdentity`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pgrace.errors import EXIT_FAILED, EXIT_OK, PgraceError
from pgrace.model.outcomes import Claim, OutcomeClass, whole_number
from pgrace.model.scenario import Scenario
from pgrace.model.timeline import Run
from pgrace.model.values import to_json_value

if TYPE_CHECKING:
    from pgrace.model.minimized import Minimized

__all__ = ["Bound", "Exploration", "SearchIdentity", "scenario_digest"]


@dataclass
class Exploration:
    """The outcome classes of one variant's interleavings (or of a shard or a sample of them), what the search
    covered, and what the command added: the examples replayed, the first failing class minimized."""

    scenario: str
    variant: str
    space: int
    explored: int
    seed: int | None
    classes: list[OutcomeClass] = field(default_factory=list)
    shard: tuple[int, int] = (1, 1)
    runs: int | None = None  # executions actually run (None: one per interleaving explored)
    complete: bool = True  # False: the space was cut at a limit (code's choice tree); these are the first ones
    incomplete: str | None = None  # why not complete, in words (code's explorations)
    repeats: int = 0  # explored interleavings that ran as a lower-numbered one did (retry attempts not sent)
    bound: Bound | None = None  # a bounded search (--max-preemptions, --pct): what it proves instead
    claim: Claim = "no bug"  # what the classes must show (pgrace.model.outcomes.claim_of)
    search: SearchIdentity | None = None  # which search this is a shard of (None: code's, never split)
    held: tuple[int, ...] | None = None  # the shards of N a merge holds (None: ``shard``'s K alone)
    origin: str | None = field(default=None, compare=False)  # the file it was read from
    replayer: Callable[[OutcomeClass], Run] | None = field(default=None, repr=False, compare=False)
    subject: Scenario | None = field(default=None, repr=False, compare=False)
    """The scenario variant explored, for its renderers (its checks, its steps); None for code's explorations."""
    examples: dict[int, Run] = field(default_factory=dict, repr=False, compare=False)
    """The examples replayed as fully observed runs, by class number (from 1)."""
    replayed_differently: list[int] = field(default_factory=list, compare=False)
    """Classes whose example ended in another class when replayed (a race the schedule does not pin)."""
    asked_to_minimize: bool = field(default=False, compare=False)
    minimized: Minimized | None = field(default=None, repr=False, compare=False)
    """With ``minimize``: the first failing class's example, shrunk (see ``pgrace.minimize``)."""
    minimized_class: int | None = field(default=None, compare=False)
    """Which class (from 1) was minimized; None with ``minimize`` when no class fails."""

    def replay(self, cls: OutcomeClass) -> Run:
        """The class's example run again, fully observed (waits, rows, holders): draw it with a renderer."""
        if self.replayer is None:
            raise PgraceError("this exploration cannot replay its examples (read back from JSON)")
        return self.replayer(cls)

    @property
    def shards_held(self) -> tuple[int, ...]:
        """Which of the search's N shards this holds: K for one shard, those merged for a merge."""
        return (self.shard[0],) if self.held is None else self.held

    @property
    def missing(self) -> tuple[int, ...]:
        """The shards of the search this does not hold: while any is missing, it is a part."""
        return tuple(k for k in range(1, self.shard[1] + 1) if k not in self.shards_held)

    @property
    def run_count(self) -> int:
        return self.explored if self.runs is None else self.runs

    @property
    def covers_all(self) -> bool:
        """Every interleaving covered, by a run or by an equivalent one."""
        return self.bound is None and self.complete and not self.missing and self.explored == self.space

    @property
    def guarantee(self) -> dict[str, Any]:
        """Which guarantee the classes carry: every interleaving, a bound's, a seeded sample's, or none (a part)."""
        if self.bound is not None:
            return self.bound.to_dict()
        if self.covers_all:
            return {"kind": "complete"}
        if self.seed is not None and not self.missing:
            return {"kind": "sample", "seed": self.seed}
        return {"kind": "part"}

    @property
    def reduced(self) -> bool:
        """Whether equivalent interleavings were run once (the classes count runs, not interleavings)."""
        return self.run_count != self.explored

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON shape (docs/reference/json.md)."""
        return {
            "scenario": self.scenario,
            "variant": self.variant,
            "space": self.space,
            "explored": self.explored,
            "runs": self.run_count,
            "complete": self.covers_all or (self.complete and self.shard[1] > 1 and self.seed is None),
            "guarantee": self.guarantee,
            "repeats": self.repeats,
            "seed": self.seed,
            "claim": self.claim,
            "passed": self.ok,
            "search": None if self.search is None else self.search.to_dict(),
            "shard": {"n": self.shard[1], "held": list(self.shards_held), "missing": list(self.missing)},
            "classes": [c.to_dict(self.variant) for c in self.classes],
        }

    @property
    def ok(self) -> bool:
        """The variant's claim judged on its classes (explore's verdict): "bug", some class shows it with
        no undeclared error (a shard need not: the merge is judged); "no bug", none breaks it."""
        if self.claim == "bug":
            return any(c.shows_bug for c in self.classes) or self.shard[1] > 1
        return not any(c.breaks for c in self.classes)

    @property
    def exit_code(self) -> int:
        """``pgrace explore``'s: 0 when the verdict holds, 1 when it fails."""
        return EXIT_OK if self.ok else EXIT_FAILED


Kind = Literal["preemptions", "pct"]


@dataclass(frozen=True)
class Bound:
    """Which guarantee a bounded exploration carries, and what it takes to state it."""

    kind: Kind
    limit: int  # K (preemptions) or D (depth)
    sessions: int
    steps: int
    runs: int  # executions run
    draws: int = 0  # pct: schedules drawn (a repeated order is run once)
    seed: int | None = None
    diverged: int = 0  # preemptions: runs launched in another order than asked; pct: runs that sent other steps
    cut: bool = False  # preemptions: stopped at the run limit with schedules left

    @property
    def met(self) -> bool:
        """Preemptions: every schedule within the bound was run as asked. PCT: every run sent the steps drawn over
        (a scenario's always; an application's, those of the first run)."""
        return self.diverged == 0 and not self.cut

    @property
    def per_run(self) -> float:
        """PCT: the least chance that one run finds a given depth-D bug, 1/(n·k^(D-1))."""
        return 1.0 / (self.sessions * float(self.steps) ** (self.limit - 1))

    @property
    def missed(self) -> float:
        """PCT: the most chance that every draw misses a given depth-D bug, (1-p)^R."""
        return (1.0 - self.per_run) ** self.draws

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "preemptions":
            return {"kind": "preemptions", "bound": self.limit, "met": self.met, "diverged": self.diverged}
        return {
            "kind": "pct",
            "depth": self.limit,
            "seed": self.seed,
            "draws": self.draws,
            "sessions": self.sessions,
            "steps": self.steps,
            "per_run": self.per_run,
            "missed": self.missed,
            "met": self.met,
            "diverged": self.diverged,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], runs: int) -> Bound:
        if data["kind"] == "preemptions":
            met = bool(data["met"])
            diverged = int(data.get("diverged", 0))
            return cls("preemptions", int(data["bound"]), 0, 0, runs, diverged=diverged, cut=not met and not diverged)
        if data["kind"] == "pct":
            return cls(
                "pct",
                int(data["depth"]),
                int(data["sessions"]),
                int(data["steps"]),
                runs,
                int(data["draws"]),
                None if data["seed"] is None else int(data["seed"]),
                diverged=int(data.get("diverged", 0)),
            )
        raise ValueError(f"no such guarantee: {data['kind']!r}")

    def words(self, space: int) -> str:
        """What the result proves, in a sentence's first half (the header line of every format)."""
        noun = "interleaving" if space == 1 else "interleavings"
        runs = f"{self.runs:,} run{'s' if self.runs != 1 else ''}"
        if self.kind == "preemptions":
            k = f"{self.limit} preemption{'s' if self.limit != 1 else ''}"
            if self.met:
                return f"every schedule with at most {k}, {runs} (of {space:,} {noun})"
            why = []
            if self.diverged:
                why.append(f"{self.diverged:,} launched in another order than asked: no claim for those branches")
            if self.cut:
                why.append(f"stopped at {self.runs:,} runs with schedules left")
            return f"NOT every schedule with at most {k}: {runs} of {space:,} {noun} ({'; '.join(why)})"
        drawn = f"{self.draws:,} run{'s' if self.draws != 1 else ''}"
        if self.draws != self.runs:
            drawn += f" ({self.runs:,} distinct, each run once)"
        if self.diverged:
            return (
                f"pct depth {self.limit}, seed {self.seed}, {drawn} of {space:,} {noun}, NOT a stated probability:"
                f" {self.diverged:,} sent other statements than the {self.steps} the schedules were drawn over"
            )
        return (
            f"pct depth {self.limit}, seed {self.seed}, {drawn} of {space:,} {noun}: a depth-{self.limit} bug is"
            f" missed with probability at most {_percent(self.missed)} (each run finds it with probability at least"
            f" {_percent(self.per_run)})"
        )


def _percent(p: float) -> str:
    if p == 0 or p >= 0.001:
        return f"{p:.1%}"
    return f"{p:.1e}"


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
