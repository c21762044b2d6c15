"""The validating second pass: the top-level keys and sessions, the parts composed into both variants."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from pgrace.frontends.names import did_you_mean
from pgrace.frontends.scenario_toml.commands import CommandReader
from pgrace.frontends.scenario_toml.expect import Expectations
from pgrace.frontends.scenario_toml.locator import Locator
from pgrace.frontends.scenario_toml.params import ParamReader, check_variables
from pgrace.frontends.scenario_toml.reader import NAME, Reader
from pgrace.frontends.scenario_toml.retry import Retries
from pgrace.frontends.scenario_toml.steps import StepReader
from pgrace.frontends.scenario_toml.variants import VariantEditor
from pgrace.model.scenario import PermutationStep, Scenario, Session, merged_commands

TOP_KEYS = {
    "name",
    "title",
    "narrative",
    "topic",
    "tags",
    "variant",
    "params",
    "setup",
    "setup_file",
    "teardown",
    "sessions",
    "step",
    "check",
    "load",
    "exec",
}
VARIANTS = ("bug", "fix")
SESSION_KEYS = {"name", "count", "setup", "teardown"}
TOPIC = re.compile(r"^[a-z0-9-]+( [a-z0-9-]+)*\Z")
TAG = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*\Z")
MAX_LABEL = 40
MAX_SCENARIO_NAME = 63  # NAMEDATALEN - 1
SCENARIO_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")


class Builder:
    """The validating second pass: plain TOML data -> Scenario (both variants)."""

    def __init__(self, data: dict[str, Any], locator: Locator, overrides: dict[str, str]) -> None:
        self.read = Reader(data, locator)
        self.data = data
        self.loc = locator
        self.source = locator.source
        self.params = ParamReader(self.read, overrides)
        self.retries = Retries(self.read)
        self.expects = Expectations(self.read)
        self.steps = StepReader(self.read, self.expects, self.retries)
        self.variants = VariantEditor(self.read, self.steps, self.expects, self.retries)
        self.commands = CommandReader(self.read)

    def _setup_file(self) -> tuple[str, ...]:
        """``setup_file``: a ``pg_dump --schema-only`` file (or a list), before ``setup``."""
        raw = self.data.get("setup_file")
        if raw is None:
            return ()
        names = [raw] if isinstance(raw, str) else raw
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise self.loc.error("setup_file is a file name, or a list of them, relative to this file", "setup_file")
        from pgrace.frontends.scenario_toml.setup_file import read_setup_file

        line = self.loc.line_of("setup_file")
        return tuple(text for name in names for text in read_setup_file(name, self.source, line))

    def build(self) -> Scenario:
        data = self.data
        self.read.check_keys(data, TOP_KEYS | set(VARIANTS), (), "top-level key")
        name = self.read.text(data.get("name", Path(self.source).stem), "name")
        if not SCENARIO_NAME.match(name):
            raise self.loc.error(
                f"scenario name {name!r} must be letters, digits, '_', '-' or '.'",
                "name",
            )
        if len(name) > MAX_SCENARIO_NAME:
            raise self.loc.error(
                f"scenario name of {len(name):,} characters: at most {MAX_SCENARIO_NAME}, as PostgreSQL names "
                "(its sessions' application_name carries it)"
                + ("" if "name" in data else '; give it a shorter name = "..."'),
                "name",
            )
        variant = self.read.text(data.get("variant", "bug"), "variant")
        if variant not in VARIANTS:
            raise self.loc.error(f"variant must be 'bug' or 'fix', not {variant!r}", "variant")
        other_name = "fix" if variant == "bug" else "bug"
        if variant in data:
            raise self.loc.error(
                f"[{variant}] describes this file's main story; the other variant is [{other_name}]",
                variant,
            )
        params, choices = self.params.parse()
        sessions, groups = self._sessions(params)
        steps = self.steps.parse(data.get("step"), sessions, groups, ("step",))  # retry loops not yet unrolled
        checks = self.expects.checks(data.get("check", []), ("check",))
        setup = self._setup_file() + self.read.sql_list(data.get("setup", []), "setup")
        main = Scenario(
            name=name,
            title=self.read.text(data.get("title", name), "title"),
            source=self.source,
            narrative=self.read.text(data.get("narrative", ""), "narrative").strip(),
            variant=variant,
            setup=setup,
            setup_line=self.loc.line_of("setup"),
            teardown=self.read.sql_list(data.get("teardown", []), "teardown"),
            sessions=sessions,
            steps=self.retries.unroll(steps),
            checks=checks,
            params=tuple(params.items()),
            param_choices=tuple(choices.items()),
            topic=self._topic(),
            tags=self._tags(),
            commands=self.commands.parse(data.get("exec"), ("exec",)),
        )
        main = replace(main, permutations=(tuple(PermutationStep(s.name) for s in main.steps),))
        check_variables(self.loc, main)
        if "load" in data:
            from pgrace.frontends.load_toml import build_load

            main = replace(main, load=build_load(self.read, data["load"], None, main, None))
        if other_name not in data:
            return main
        other = self.variants.build(replace(main, steps=steps), other_name, data[other_name], sessions, groups)
        check_variables(self.loc, other)
        own = self.commands.parse(data[other_name].get("exec"), (other_name, "exec"))
        other = replace(other, commands=merged_commands(main.commands, own))
        override = data[other_name].get("load")
        if "load" in data or override is not None:
            from pgrace.frontends.load_toml import build_load

            base = data.get("load", {})
            other = replace(other, load=build_load(self.read, base, override, other, other_name))
        return replace(main, other=replace(other, other=None))

    def _sessions(self, params: dict[str, Any]) -> tuple[tuple[Session, ...], dict[str, list[str]]]:
        raw = self.data.get("sessions")
        if not isinstance(raw, list) or not raw:
            raise self.loc.error(
                'sessions must be a non-empty list, e.g. sessions = ["alice", "bob"]',
                "sessions",
            )
        sessions: list[Session] = []
        groups: dict[str, list[str]] = {}
        line = self.loc.line_of("sessions")
        for item in raw:
            if isinstance(item, str):
                item = {"name": item}
            if not isinstance(item, dict):
                raise self.loc.error(
                    "each session is a name or a table {name = ..., count = ...}",
                    "sessions",
                )
            self.read.check_keys(item, SESSION_KEYS, ("sessions",), "session key")
            name = self.read.text(item.get("name"), "sessions", what="session name")
            if not NAME.match(name):
                raise self.loc.error(
                    f"session name {name!r} must be letters, digits, '_' or '-'",
                    "sessions",
                )
            count = item.get("count")
            members = [name]
            if count is not None:
                n = params.get(count) if isinstance(count, str) else count
                if isinstance(count, str) and count not in params:
                    raise self.loc.error(
                        f"session {name!r}: count names param {count!r}, which is not in [params]"
                        + did_you_mean(count, set(params)),
                        "sessions",
                    )
                if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 64:
                    raise self.loc.error(
                        f"session {name!r}: count must be a whole number from 1 to 64",
                        "sessions",
                    )
                members = [f"{name}{i}" for i in range(1, n + 1)]
                groups[name] = members
            for member in members:
                if member in {s.name for s in sessions}:
                    raise self.loc.error(f"duplicate session name {member!r}", "sessions")
                sessions.append(
                    Session(
                        member,
                        self.read.opt_text(item.get("setup"), "sessions", "setup"),
                        self.read.opt_text(item.get("teardown"), "sessions", "teardown"),
                        line,
                    )
                )
        return tuple(sessions), groups

    def _topic(self) -> str:
        """Lower-case words and single spaces, so topics group and sort the same everywhere."""
        if "topic" not in self.data:
            return ""
        topic = self.read.text(self.data["topic"], "topic")
        if not TOPIC.match(topic) or len(topic) > MAX_LABEL:
            raise self.loc.error(
                f"topic {topic!r} must be lower-case words (letters, digits, '-') separated by single spaces,"
                f' at most {MAX_LABEL} characters (e.g. "job queue")',
                "topic",
            )
        return topic

    def _tags(self) -> tuple[str, ...]:
        """Each tag one lower-case word (``skip-locked``), each listed once."""
        raw = self.data.get("tags", [])
        if not isinstance(raw, list):
            raise self.loc.error('tags must be a list of strings, e.g. tags = ["skip-locked", "for-update"]', "tags")
        tags: list[str] = []
        for tag in raw:
            if not isinstance(tag, str) or not TAG.match(tag) or len(tag) > MAX_LABEL:
                raise self.loc.error(
                    f"tag {tag!r} must be lower-case letters and digits joined by single '-'"
                    f" (e.g. 'skip-locked'), at most {MAX_LABEL} characters",
                    "tags",
                )
            if tag in tags:
                raise self.loc.error(f"tag {tag!r} is listed twice", "tags")
            tags.append(tag)
        return tuple(tags)
