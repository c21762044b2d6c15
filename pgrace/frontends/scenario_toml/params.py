"""``[params]`` with ``-p`` overrides applied, and the check that every ``:name`` a file uses is known in time."""

from __future__ import annotations

from typing import Any

from pgrace.errors import ScenarioError
from pgrace.frontends.names import did_you_mean
from pgrace.frontends.scenario_toml.locator import Locator
from pgrace.frontends.scenario_toml.reader import Reader
from pgrace.model.scenario import Scenario
from pgrace.model.variables import FACTS, Use, find, valid_choice
from pgrace.text import control_in_name

PARAM_KEYS = {"default", "choices"}
BOUNDED_PARAM_KEYS = {"default", "min", "max"}


class ParamReader:
    """Reads ``[params]``: plain defaults, ``{ default, choices }`` SQL words, ``{ default, min, max }`` bounds."""

    def __init__(self, read: Reader, overrides: dict[str, str]) -> None:
        self.read = read
        self.loc = read.loc
        self.source = read.source
        self.data = read.data
        self.overrides = overrides

    def parse(self) -> tuple[dict[str, Any], dict[str, tuple[str, ...]]]:
        """Defaults with ``-p`` overrides applied, and the SQL words a choice param may take."""
        declared = self.data.get("params", {})
        if not isinstance(declared, dict):
            raise self.loc.error("params must be a table of name = default value", "params")
        params: dict[str, Any] = {}
        choices: dict[str, tuple[str, ...]] = {}
        bounds: dict[str, tuple[int, int]] = {}
        for key, value in declared.items():
            if (bad := control_in_name(key)) is not None:
                raise self.loc.error(f"param name {key!r} holds control character {bad}", "params", key)
            if isinstance(value, dict) and "choices" not in value and ("min" in value or "max" in value):
                value, bounds[key] = self._bounded_param(key, value)
            elif isinstance(value, dict):
                value, choices[key] = self._choice_param(key, value)
            if not isinstance(value, (int, float, str, bool)):
                raise self.loc.error(
                    f"param {key!r} must be a number, string or boolean, or {{ default = ..., choices = [...] }}",
                    "params",
                    key,
                )
            if isinstance(value, str) and "\x00" in value:
                raise self.loc.error(f"param {key!r} holds a NUL character", "params", key)
            params[key] = value
        for key, raw in self.overrides.items():
            if key not in params:
                known = ", ".join(sorted(params)) or "none"
                raise ScenarioError(
                    f"unknown param {key!r}{did_you_mean(key, set(params))}; this scenario has: {known}",
                    self.source,
                )
            if key in choices:
                params[key] = _choose(raw, choices[key], key, self.source)
            else:
                params[key] = _coerce(raw, params[key], key, self.source)
            if key in bounds and not bounds[key][0] <= params[key] <= bounds[key][1]:
                low, high = bounds[key]
                raise ScenarioError(
                    f"param {key!r} is a whole number from {low} to {high} in this scenario, not {raw!r}", self.source
                )
        return params, choices

    def _bounded_param(self, key: str, table: dict[str, Any]) -> tuple[int, tuple[int, int]]:
        """``{ default = 3, min = 3, max = 32 }``: a whole number the scenario works for only within bounds."""
        self.read.check_keys(table, BOUNDED_PARAM_KEYS, ("params", key), f"key of param {key!r}")
        values: list[int] = []
        for name in ("default", "min", "max"):
            value = table.get(name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise self.loc.error(
                    f"param {key!r}: default, min and max are whole numbers, e.g. {{ default = 3, min = 1, max = 32 }}",
                    "params",
                    key,
                )
            values.append(value)
        default, low, high = values
        if not low <= default <= high:
            raise self.loc.error(f"param {key!r}: min <= default <= max does not hold", "params", key)
        return default, (low, high)

    def _choice_param(self, key: str, table: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
        """``{ default = "READ COMMITTED", choices = [...] }``: ``:key`` is put in as one of these SQL words."""
        self.read.check_keys(table, PARAM_KEYS, ("params", key), f"key of param {key!r}")
        options = table.get("choices")
        if not isinstance(options, list) or not options or not all(isinstance(c, str) for c in options):
            raise self.loc.error(
                f'param {key!r}: choices is a list of SQL words, e.g. ["NOWAIT", "SKIP LOCKED"]', "params", key
            )
        for choice in options:
            if not valid_choice(choice):
                raise self.loc.error(
                    f"param {key!r}: choice {choice!r} must be SQL words (letters and single spaces) or empty",
                    "params",
                    key,
                )
        default = table.get("default", options[0])
        if default not in options:
            raise self.loc.error(f"param {key!r}: default {default!r} is not one of its choices", "params", key)
        return str(default), tuple(options)


def check_variables(loc: Locator, scenario: Scenario) -> None:
    """Every ``:name`` must be a param or a capture made earlier in the file; ``:s.name`` names session s.

    Steps run in file order, so a capture made by a later step can never be there in time:
    that is an error too, naming the step that captures it.
    """
    params = {k for k, _ in scenario.params}
    for text in scenario.setup:
        for use in find(text):
            if use.session is not None or use.name not in params:
                raise loc.error(
                    f"setup uses {use.written}, which is not a param{did_you_mean(use.key, params)}"
                    " (setup runs before any session)",
                    "setup",
                )
    for index, step in enumerate(scenario.steps):
        if step.sleep is not None or step.crash is not None:
            continue
        for use in find(step.sql):
            problem = _variable_problem(scenario, use.session or step.session, use.name, index, params, use)
            if problem:
                line = loc.key_in_section(step.line, "sql") if step.line else None
                raise ScenarioError(f"step {step.name!r} uses {use.written}, {problem}", loc.source, line)
    for check in scenario.checks:
        for use in find(check.sql):
            if use.session is None:
                problem = "" if use.name in params else f"which is not a param{did_you_mean(use.name, params)}"
            else:
                last = len(scenario.steps)
                problem = _variable_problem(scenario, use.session, use.name, last, params, use)
            if problem:
                raise ScenarioError(f"check uses {use.written}, {problem}", loc.source, check.line)


def _variable_problem(scenario: Scenario, session: str, name: str, index: int, params: set[str], use: Use) -> str:
    """Why ``name`` of ``session`` is not known before step number ``index`` ("" when it is)."""
    sessions = scenario.session_names
    if session not in sessions:
        return f"but there is no session {session!r}{did_you_mean(session, sessions)}"
    if use.session is not None and name in FACTS:
        return ""
    if use.session is None and name in params:
        return ""
    captures = [(i, s) for i, s in enumerate(scenario.steps) if s.session == session and name in dict(s.capture)]
    if any(i < index for i, _ in captures):
        return ""
    if captures:
        later = captures[0][1]
        return f"which step {later.name!r} (line {later.line}) captures only later in the file"
    if use.session is None:
        own = {v for i, s in enumerate(scenario.steps) if s.session == session and i < index for v, _ in s.capture}
        problem = f"which no earlier step of session {session!r} captures and no param defines"
        elsewhere = [s.session for s in scenario.steps if name in dict(s.capture)]
        if elsewhere:
            return f"{problem}; session {elsewhere[0]!r} captures it: write :{elsewhere[0]}.{name}"
        return problem + did_you_mean(name, params | own)
    known = {v for s in scenario.steps if s.session == session for v, _ in s.capture} | set(FACTS)
    return f"but no step of session {session!r} captures {name!r}{did_you_mean(name, known)}"


def _choose(raw: str, choices: tuple[str, ...], key: str, source: str) -> str:
    """A ``-p`` value for a choice param: one of the file's own words (any case), in the file's spelling.

    A hyphen stands for a space (``-p level=repeatable-read``): choices are letters and spaces only.
    """
    for choice in choices:
        if " ".join(raw.replace("-", " ").split()).upper() == choice.upper():
            return choice
    listed = ", ".join(repr(c) for c in choices)
    raise ScenarioError(f"param {key!r} must be one of {listed}, not {raw!r}", source)


def _coerce(raw: str, default: Any, key: str, source: str) -> Any:
    """A ``--param name=value`` string, converted to the type of the param's default."""
    try:
        if "\x00" in raw:
            raise ScenarioError(f"param {key!r} holds a NUL character", source)
        if isinstance(default, bool):
            if raw.lower() not in {"true", "false"}:
                raise ValueError(raw)
            return raw.lower() == "true"
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError:
        kind = {bool: "true or false", int: "a whole number", float: "a number"}[type(default)]
        raise ScenarioError(f"param {key!r} must be {kind}, not {raw!r}", source) from None
    return raw
