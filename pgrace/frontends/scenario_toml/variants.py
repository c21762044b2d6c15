"""The other variant (``[fix]`` or ``[bug]``): the main story with its steps edited or replaced.

``[fix.step.NAME]`` changes a step, ``[[fix.step]]`` replaces the whole list,
``[[fix.insert]]`` adds a step next to one of the base list, ``fix.drop`` removes steps.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pgrace.frontends.names import base_name, did_you_mean
from pgrace.frontends.scenario_toml.expect import Expectations
from pgrace.frontends.scenario_toml.reader import Reader
from pgrace.frontends.scenario_toml.retry import Retries
from pgrace.frontends.scenario_toml.steps import ACTIONS, StepReader
from pgrace.model.scenario import PermutationStep, Scenario, Session, Step

OVERRIDE_KEYS = {"sql", "sleep", "note", "capture", "expect", "retry"}
VARIANT_KEYS = {"title", "narrative", "step", "insert", "drop", "check", "setup", "load", "exec"}
ANCHORS = ("after", "before")  # where an inserted step goes: next to a step of the base list


class VariantEditor:
    """Builds the other variant from the main one, before the main one's retry loops are unrolled."""

    def __init__(self, read: Reader, steps: StepReader, expects: Expectations, retries: Retries) -> None:
        self.read = read
        self.loc = read.loc
        self.steps = steps
        self.expects = expects
        self.retries = retries

    def build(
        self,
        main: Scenario,
        variant: str,
        raw: Any,
        sessions: tuple[Session, ...],
        groups: dict[str, list[str]],
    ) -> Scenario:
        if not isinstance(raw, dict):
            raise self.loc.error(f"[{variant}] must be a table", variant)
        self.read.check_keys(raw, VARIANT_KEYS, (variant,), f"[{variant}] key")
        overrides = raw.get("step", {})
        if isinstance(overrides, list):  # [[fix.step]] tables: this variant tells its own steps
            steps = list(self.steps.parse(overrides, sessions, groups, (variant, "step")))
            overrides = {}
        elif not isinstance(overrides, dict):
            raise self.loc.error(
                f"[{variant}.step.NAME] tables change the steps named NAME; [[{variant}.step]] tables replace them all",
                variant,
                "step",
            )
        else:
            steps = list(main.steps)
        if isinstance(raw.get("step"), list) and ("insert" in raw or "drop" in raw):
            raise self.loc.error(
                f"[[{variant}.step]] replaces the whole step list; {variant}.insert and {variant}.drop change the"
                " base list: use one or the other",
                variant,
                "insert" if "insert" in raw else "drop",
            )
        changes = [f"step {base}: {', '.join(sorted(change))} changed" for base, change in overrides.items()]
        if isinstance(raw.get("step"), list):
            changes.append(f"its own list of {len(steps)} steps")
        bases = {base_name(s.name) for s in main.steps} | {s.name for s in main.steps}
        for base, change in overrides.items():
            where = (variant, "step", base)
            if base not in bases:
                raise self.loc.error(
                    f"[{variant}.step.{base}] names no step{did_you_mean(base, bases)}",
                    *where,
                )
            if not isinstance(change, dict):
                raise self.loc.error(f"[{variant}.step.{base}] must be a table", *where)
            self.read.check_keys(change, OVERRIDE_KEYS, where, "step key")
            for i, step in enumerate(steps):
                if step.name != base and base_name(step.name) != base:
                    continue
                fields: dict[str, Any] = {}
                kind = "sleep" if step.sleep is not None else "crash" if step.crash is not None else "sql"
                for key in ACTIONS:
                    if key in change and key != kind:
                        raise self.loc.error(f"step {base!r} is a {kind} step: it cannot change its {key}", *where, key)
                if kind != "sql" and ("capture" in change or "expect" in change or "retry" in change):
                    raise self.loc.error(f"a {kind} step sends no SQL: it has no capture, expect or retry", *where)
                if "sql" in change:
                    fields["sql"] = self.read.text(change["sql"], *where, "sql")
                    fields["line"] = self.loc.line_of(*where)  # its errors are the override's, not the base step's
                if "sleep" in change:
                    fields["sleep"] = self.read.duration(change["sleep"], (*where, "sleep"))
                    fields["sql"] = f"sleep {change['sleep'].strip()}"
                if "note" in change:
                    fields["note"] = self.read.text(change["note"], *where, "note")
                if "capture" in change:
                    fields["capture"] = self.read.capture(change["capture"], where)
                if "expect" in change:
                    fields["expect"] = self.expects.expect(
                        change["expect"], [s.name for s in sessions], (*where, "expect")
                    )
                if "retry" in change:
                    fields["retry"] = self.retries.parse(change["retry"], where)
                steps[i] = replace(step, **fields)
        steps = self._dropped(steps, raw.get("drop"), variant, changes)
        steps = self._inserted(steps, raw.get("insert"), variant, sessions, groups, changes)
        checks = self.expects.checks(raw["check"], (variant, "check")) if "check" in raw else main.checks
        setup = self.read.sql_list(raw["setup"], variant, "setup") if "setup" in raw else main.setup
        return replace(
            main,
            variant=variant,
            changes=tuple(changes),
            title=self.read.text(raw.get("title", main.title), variant, "title"),
            narrative=self.read.text(raw.get("narrative", main.narrative), variant, "narrative").strip(),
            steps=(unrolled := self.retries.unroll(steps)),
            permutations=(tuple(PermutationStep(s.name) for s in unrolled),),
            checks=checks,
            setup=setup,
        )

    def _dropped(self, steps: list[Step], raw: Any, variant: str, changes: list[str]) -> list[Step]:
        """``fix.drop = ["NAME", ...]``: the base list without these steps (a group step: every member's)."""
        if raw is None:
            return steps
        if not isinstance(raw, list) or not all(isinstance(name, str) for name in raw):
            raise self.loc.error(f'{variant}.drop is a list of step names, e.g. ["bob-read"]', variant, "drop")
        for name in raw:
            kept = [s for s in steps if s.name != name and base_name(s.name) != name]
            if len(kept) == len(steps):
                known = {s.name for s in steps} | {base_name(s.name) for s in steps}
                raise self.loc.error(
                    f"{variant}.drop names no step {name!r}{did_you_mean(name, known)}", variant, "drop"
                )
            gone = {s.name for s in steps} - {s.name for s in kept}
            for step in kept:  # the loop's first step dropped, its last kept: say so here, not at the retry
                if step.retry is not None and any(step.retry.start in (g, base_name(g)) for g in gone):
                    raise self.loc.error(
                        f"{variant}.drop removes {name!r}, where the retry loop of {step.name!r} starts:"
                        f" drop {step.name!r} too, or give it a retry of its own in [{variant}.step.{step.name}]",
                        variant,
                        "drop",
                    )
            steps = kept
            changes.append(f"step {name} dropped")
        if not steps:
            raise self.loc.error(f"{variant}.drop leaves no step to run", variant, "drop")
        return steps

    def _inserted(
        self,
        steps: list[Step],
        raw: Any,
        variant: str,
        sessions: tuple[Session, ...],
        groups: dict[str, list[str]],
        changes: list[str],
    ) -> list[Step]:
        """``[[fix.insert]]`` tables: a named step put ``after`` or ``before`` a step of the base list."""
        if raw is None:
            return steps
        if not isinstance(raw, list) or not all(isinstance(item, dict) for item in raw):
            raise self.loc.error(f"[[{variant}.insert]] tables each add one step", variant, "insert")
        anchors: list[tuple[str, str]] = []
        bare: list[dict[str, Any]] = []
        for index, item in enumerate(raw):
            where = (variant, "insert", index)
            given = [key for key in ANCHORS if key in item]
            if len(given) != 1 or not isinstance(item[given[0]], str):
                raise self.loc.error(
                    'an inserted step says where it goes: after = "NAME" or before = "NAME", one of them', *where
                )
            if "name" not in item:
                raise self.loc.error(
                    "an inserted step needs a name: expectations and the timeline tell it by it", *where
                )
            anchors.append((given[0], item[given[0]]))
            bare.append({k: v for k, v in item.items() if k not in ANCHORS})
        made = self.steps.parse(bare, sessions, groups, (variant, "insert"))
        for index, ((side, anchor), item) in enumerate(zip(anchors, bare, strict=True)):
            at = [i for i, s in enumerate(steps) if s.name == anchor or base_name(s.name) == anchor]
            if not at:
                known = {s.name for s in steps} | {base_name(s.name) for s in steps}
                raise self.loc.error(
                    f"[[{variant}.insert]] goes {side} {anchor!r}, which is no step{did_you_mean(anchor, known)}",
                    variant,
                    "insert",
                    index,
                    side,
                )
            new = [s for s in made if s.name == item["name"] or base_name(s.name) == item["name"]]
            clash = next((s.name for s in new if any(s.name == t.name for t in steps)), None)
            if clash is not None:
                raise self.loc.error(
                    f"inserted step {clash!r} has the name of a step the list has", variant, "insert", index, "name"
                )
            position = at[-1] + 1 if side == "after" else at[0]
            steps[position:position] = new
            changes.append(f"step {item['name']} inserted {side} {anchor}")
        return steps
