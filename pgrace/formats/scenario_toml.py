"""pgrace's own scenario format: a TOML file that reads like a story.

Parsing happens in two passes (as isolationtester's ``check_testspec``): ``tomllib``
turns text into plain data, then :func:`build` checks every key and reference and turns
it into a :class:`~pgrace.model.Scenario`, raising one :class:`ScenarioError` that names
the file and line of the first problem, with a "did you mean" hint where one helps.
``tomllib`` keeps no positions, so :class:`Locator` finds lines by scanning the text.

The format is documented, with a complete example, in docs/guide/writing-a-scenario.md.
"""

from __future__ import annotations

import bisect
import re
import tomllib
from dataclasses import replace
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from pgrace.errors import ScenarioError
from pgrace.formats import limits
from pgrace.formats.names import KeyPath, base_name, did_you_mean
from pgrace.model import (
    LOCK_MODES,
    MAX_RETRIES,
    CrashMode,
    FinalCheck,
    LockExpectation,
    PermutationStep,
    Retry,
    RowRef,
    Scenario,
    Session,
    Step,
    StepExpectation,
    WaitTarget,
    with_retries,
)
from pgrace.text import control_in_name
from pgrace.timeline import RELEASE_CAUSES
from pgrace.variables import FACTS, Use, find, valid_choice

TOP_KEYS = {
    "name",
    "title",
    "narrative",
    "topic",
    "tags",
    "variant",
    "params",
    "setup",
    "teardown",
    "sessions",
    "step",
    "check",
    "load",
}
VARIANTS = ("bug", "fix")
SESSION_KEYS = {"name", "count", "setup", "teardown"}
STEP_KEYS = {"name", "session", "except", "sql", "sleep", "crash", "note", "capture", "expect", "retry"}
RETRY_KEYS = {"on", "from", "max"}
RETRY_FORM = 'retry = { on = ["40001", "40P01"], from = "STEP", max = N }'
ACTIONS = ("sql", "sleep", "crash")  # what a step does: exactly one of them
CRASHES = ("terminate", "disconnect")
PARAM_KEYS = {"default", "choices"}
BOUNDED_PARAM_KEYS = {"default", "min", "max"}
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*$")
MAX_SLEEP = 60.0
TOPIC = re.compile(r"^[a-z0-9-]+( [a-z0-9-]+)*\Z")
TAG = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*\Z")
MAX_LABEL = 40
OVERRIDE_KEYS = {"sql", "sleep", "note", "capture", "expect", "retry"}
VARIANT_KEYS = {"title", "narrative", "step", "insert", "drop", "check", "setup", "load"}
ANCHORS = ("after", "before")  # where an inserted step goes: next to a step of the base list
EXPECT_KEYS = {
    "waits",
    "waits_for",
    "waits_on",
    "error",
    "message",
    "deadlock",
    "may_fail",
    "rows",
    "locks",
    "released_by",
}
WAIT_KEYS = {"table", "key", "mode", "advisory", "transaction_of", "unique_index"}
WAITS_ON = (
    'waits_on is a row { table = "jobs", key = { id = 1 } }, a table { table = "jobs", mode = "AccessExclusiveLock" },'
    ' { advisory = 42 }, { transaction_of = "web1" } or { unique_index = "jobs_pkey" } (or true)'
)
CHECK_KEYS = {"description", "sql", "rows"}
LOCK_KEYS = {"table", "key", "session", "mode"}
ROW_MODES = {
    "FOR UPDATE",
    "FOR NO KEY UPDATE",
    "FOR SHARE",
    "FOR KEY SHARE",
    "UPDATE",
    "NO KEY UPDATE",
}
# \Z, not $: "$" also matches before a trailing newline, which a name must not hold.
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*\Z")  # "." joins a step name to its session
SCENARIO_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
SQLSTATE = re.compile(r"^[0-9A-Z]{5}$")


def load_toml_scenario(path: Path, params: dict[str, str] | None = None) -> Scenario:
    """Read and validate a scenario file; ``params`` override its ``[params]`` defaults."""
    return parse_toml_scenario(limits.read_text(path), str(path), params or {})


def parse_toml_scenario(text: str, source: str, params: dict[str, str] | None = None) -> Scenario:
    limits.check_toml(text, source)
    locator = Locator(text, source)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        match = re.search(r"\(at line (\d+), column \d+\)$", message)
        line = int(match.group(1)) if match else max(1, len(text.splitlines()))  # "at end of document"
        message = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)$", "", message)
        raise ScenarioError(f"invalid TOML: {message}", source, line) from None
    except RecursionError:  # limits.check_toml keeps nesting far below this; never a traceback
        raise ScenarioError(f"nested too deeply ({limits.LIMITS_TEXT})", source, 1) from None
    nul = limits.nul_in(data)
    if nul is not None:  # libpq would silently cut the SQL there
        raise locator.error("NUL character (\\u0000) in a string", *nul)
    return Builder(data, locator, params or {}).build()


class Locator:
    """Finds the line of a key in the TOML text, since ``tomllib`` does not say.

    A path such as ``("step", 2, "expect", "rows")`` is looked up as the longest prefix
    that names a table header (``[[step]]`` number 2), then key by key inside it.
    """

    HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]")

    def __init__(self, text: str, source: str) -> None:
        self.lines = text.splitlines()
        self.source = source
        self.headers: dict[tuple[str | int, ...], int] = {}
        self.starts: list[int] = []
        counts: dict[tuple[str, ...], int] = {}
        for number, line in enumerate(self.lines):
            match = self.HEADER.match(line)
            if not match:
                continue
            parts = tuple(p.strip().strip('"').strip("'") for p in match.group(2).split("."))
            self.starts.append(number)
            if match.group(1) == "[[":
                counts[parts] = counts.get(parts, -1) + 1
                self.headers[(*parts, counts[parts])] = number
            else:
                self.headers[parts] = number

    def error(self, message: str, *path: str | int) -> ScenarioError:
        return ScenarioError(message, self.source, self.line_of(*path))

    def line_of(self, *path: str | int) -> int:
        """Never unknown: a key that is missing altogether is reported at its table (or line 1)."""
        start, end, found, rest = 0, self._end_of(-1), 1, path
        for cut in range(len(path), 0, -1):
            if path[:cut] in self.headers:
                start = self.headers[path[:cut]]
                end, found, rest = self._end_of(start), start + 1, path[cut:]
                break
        else:  # no table of its own: ``[fx.step.s]`` is where the key ``fx`` first appears
            deeper = [line for header, line in self.headers.items() if path and header[: len(path)] == path]
            top_level = _key(path[0]) if path else None
            if deeper and top_level and not any(top_level.match(self.lines[k]) for k in range(end)):
                return min(deeper) + 1
        for key in rest:
            if isinstance(key, int):
                continue
            pattern = re.compile(rf"(^|[{{,\s.])[\"']?{re.escape(key)}[\"']?\s*[=.]")
            line = next((k for k in range(start, end) if pattern.search(self.lines[k])), None)
            if line is None:  # not a key of its table: perhaps a table of its own below it ([fix.stp.one])
                deeper = [
                    n for header, n in self.headers.items() if len(header) > len(path) and header[: len(path)] == path
                ]
                return min(deeper) + 1 if deeper else found
            start, found = line, line + 1
        return found

    def key_in_section(self, line: int, key: str) -> int:
        """The line of ``key = ...`` in the table whose header is on ``line`` (that line if it is not there)."""
        pattern = _key(key)
        start = line - 1
        return next((k + 1 for k in range(start, self._end_of(start)) if pattern.match(self.lines[k])), line)

    def _end_of(self, header: int) -> int:
        """The line where the section starting at ``header`` (-1: the top) ends."""
        after = bisect.bisect_right(self.starts, header)  # starts are in order: no scan per lookup
        return self.starts[after] if after < len(self.starts) else len(self.lines)


def _key(key: str | int) -> re.Pattern[str]:
    """A line that sets ``key`` at its start (bare or quoted)."""
    return re.compile(rf"\s*[\"']?{re.escape(str(key))}[\"']?\s*=")


class Builder:
    """The validating second pass: plain TOML data -> Scenario (both variants)."""

    def __init__(self, data: dict[str, Any], locator: Locator, overrides: dict[str, str]) -> None:
        self.data = data
        self.loc = locator
        self.source = locator.source
        self.overrides = overrides

    def build(self) -> Scenario:
        data = self.data
        self._check_keys(data, TOP_KEYS | set(VARIANTS), (), "top-level key")
        name = self._str(data.get("name", Path(self.source).stem), "name")
        if not SCENARIO_NAME.match(name):
            raise self.loc.error(
                f"scenario name {name!r} must be letters, digits, '_', '-' or '.'",
                "name",
            )
        variant = self._str(data.get("variant", "bug"), "variant")
        if variant not in VARIANTS:
            raise self.loc.error(f"variant must be 'bug' or 'fix', not {variant!r}", "variant")
        other_name = "fix" if variant == "bug" else "bug"
        if variant in data:
            raise self.loc.error(
                f"[{variant}] describes this file's main story; the other variant is [{other_name}]",
                variant,
            )
        params, choices = self._params()
        sessions, groups = self._sessions(params)
        steps = self._steps(data.get("step"), sessions, groups, ("step",))  # retry loops not yet unrolled
        checks = self._checks(data.get("check", []), ("check",))
        setup = self._sql_list(data.get("setup", []), "setup")
        main = Scenario(
            name=name,
            title=self._str(data.get("title", name), "title"),
            source=self.source,
            narrative=self._str(data.get("narrative", ""), "narrative").strip(),
            variant=variant,
            setup=setup,
            setup_line=self.loc.line_of("setup"),
            teardown=self._sql_list(data.get("teardown", []), "teardown"),
            sessions=sessions,
            steps=self._loops(steps),
            checks=checks,
            params=tuple(params.items()),
            param_choices=tuple(choices.items()),
            topic=self._topic(),
            tags=self._tags(),
        )
        main = replace(main, permutations=(tuple(PermutationStep(s.name) for s in main.steps),))
        self._check_variables(main)
        if "load" in data:
            from pgrace.formats.load_toml import build_load

            main = replace(main, load=build_load(self, data["load"], None, main, None))
        if other_name not in data:
            return main
        other = self._other_variant(replace(main, steps=steps), other_name, data[other_name], sessions, groups)
        self._check_variables(other)
        override = data[other_name].get("load")
        if "load" in data or override is not None:
            from pgrace.formats.load_toml import build_load

            base = data.get("load", {})
            other = replace(other, load=build_load(self, base, override, other, other_name))
        return replace(main, other=replace(other, other=None))

    # -- pieces -----------------------------------------------------------------------

    def _params(self) -> tuple[dict[str, Any], dict[str, tuple[str, ...]]]:
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
        self._check_keys(table, BOUNDED_PARAM_KEYS, ("params", key), f"key of param {key!r}")
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
        self._check_keys(table, PARAM_KEYS, ("params", key), f"key of param {key!r}")
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
            self._check_keys(item, SESSION_KEYS, ("sessions",), "session key")
            name = self._str(item.get("name"), "sessions", what="session name")
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
                        self._opt_str(item.get("setup"), "sessions", "setup"),
                        self._opt_str(item.get("teardown"), "sessions", "teardown"),
                        line,
                    )
                )
        return tuple(sessions), groups

    def _steps(
        self,
        raw: Any,
        sessions: tuple[Session, ...],
        groups: dict[str, list[str]],
        path: KeyPath,
    ) -> tuple[Step, ...]:
        if not isinstance(raw, list) or not raw:
            raise self.loc.error("a scenario needs at least one [[step]]", *path)
        names = [s.name for s in sessions]
        steps: list[Step] = []
        counters: dict[str, int] = {}
        seen: set[str] = set()  # a set, not a scan of steps: a file of 20,000 steps stays linear
        for index, item in enumerate(raw):
            where: KeyPath = (*path, index)
            if not isinstance(item, dict):
                raise self.loc.error("each step is a [[step]] table", *where)
            self._check_keys(item, STEP_KEYS, where, "step key")
            session_ref = self._str(item.get("session"), *where, "session", what="step session")
            members = self._expand(session_ref, names, groups, where)
            excluded = item.get("except", [])
            if isinstance(excluded, str):
                excluded = [excluded]
            for ex in excluded:
                if ex not in members:
                    raise self.loc.error(
                        f"except names {ex!r}, which is not among {session_ref!r}",
                        *where,
                        "except",
                    )
            members = [m for m in members if m not in excluded]
            sql_text, sleep, crash = self._action(item, where)
            base = item.get("name")
            if base is not None:
                base = self._str(base, *where, "name", what="step name")
                if not NAME.match(base):
                    raise self.loc.error(
                        f"step name {base!r} must be letters, digits, '_' or '-'",
                        *where,
                        "name",
                    )
            for member in members:
                counters[member] = counters.get(member, 0) + 1
                if base is None:
                    step_name = f"{member}-{counters[member]}"
                else:
                    grouped = any(member in group for group in groups.values())  # claim.worker2, always
                    step_name = base if session_ref == member and not grouped else f"{base}.{member}"
                if step_name in seen:
                    raise self.loc.error(f"duplicate step name {step_name!r}", *where, "name")
                seen.add(step_name)
                steps.append(
                    Step(
                        name=step_name,
                        session=member,
                        sql=sql_text,
                        note=self._str(item.get("note", ""), *where, "note"),
                        capture=self._capture(item.get("capture"), where),
                        expect=self._expect(item.get("expect"), names, (*where, "expect")),
                        line=self.loc.line_of(*where),
                        sleep=sleep,
                        crash=crash,
                        retry=self._retry(item["retry"], where) if "retry" in item else None,
                    )
                )
        return tuple(steps)

    def _action(self, item: dict[str, Any], where: KeyPath) -> tuple[str, float | None, CrashMode | None]:
        """What the step does: ``sql``, or ``sleep = "300ms"``, or ``crash = "terminate"``/``"disconnect"``.

        An action step's ``sql`` is its description, as the timeline shows it.
        """
        given = [key for key in ACTIONS if key in item]
        if not given:
            raise self.loc.error("missing step sql", *where)
        if len(given) > 1:
            raise self.loc.error(f"a step does one thing: it has {' and '.join(given)}", *where, given[1])
        if "sql" in item:
            return self._str(item["sql"], *where, "sql", what="step sql"), None, None
        for key in ("capture", "expect", "retry"):
            if key in item:
                raise self.loc.error(f"a {given[0]} step sends no SQL: it has no {key}", *where, key)
        if "sleep" in item:
            seconds = self._duration(item["sleep"], (*where, "sleep"))
            return f"sleep {item['sleep'].strip()}", seconds, None
        crash = item["crash"]
        if crash == "terminate":
            return "crash: backend terminated", None, "terminate"
        if crash == "disconnect":
            return "crash: connection closed", None, "disconnect"
        raise self.loc.error(
            f'crash is "terminate" (its backend killed) or "disconnect" (its socket closed), not {crash!r}',
            *where,
            "crash",
        )

    def _retry(self, raw: Any, where: KeyPath) -> Retry:
        """``retry = { on = [...], from = "STEP", max = N }``, its ``from`` not yet resolved (see :meth:`_loops`)."""
        line = self.loc.line_of(*where, "retry")

        def bad(message: str) -> ScenarioError:
            return ScenarioError(f"retry: {message}", self.source, line)

        if not isinstance(raw, dict):
            raise bad(f"a table, e.g. {RETRY_FORM}")
        for key in raw:
            if key not in RETRY_KEYS:
                raise bad(f"unknown key {key!r}{did_you_mean(key, RETRY_KEYS)}; the form is {RETRY_FORM}")
        codes = raw.get("on")
        codes = [codes] if isinstance(codes, str) else codes
        if not isinstance(codes, list) or not codes:
            raise bad('on lists the SQLSTATEs to retry on, e.g. on = ["40001", "40P01"]')
        for code in codes:
            if not isinstance(code, str) or not SQLSTATE.fullmatch(code):
                raise bad(f'{code!r} is not an SQLSTATE (5 characters of 0-9 and A-Z, such as "40001")')
        start = raw.get("from")
        if not isinstance(start, str) or not start:
            raise bad('from names the loop\'s first step, e.g. from = "begin" (this step itself: from = its name)')
        count = raw.get("max")
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_RETRIES:
            raise bad(f"max is how many times to run the loop again, a whole number from 1 to {MAX_RETRIES}")
        return Retry(tuple(dict.fromkeys(codes)), start, count, line)

    def _loops(self, steps: list[Step] | tuple[Step, ...]) -> tuple[Step, ...]:
        """Resolve each retry's ``from`` in its own session, refuse overlapping loops, and unroll them.

        ``from`` names a step of the same session, this one or an earlier one (a group
        step's base name means the member's own). Errors are told at the retry key's line.
        """
        resolved = list(steps)
        taken: dict[str, str] = {}  # a step in a loop -> that loop's last step
        for index, step in enumerate(resolved):
            retry = step.retry
            if retry is None:
                continue

            def named(s: Step, start: str = retry.start) -> bool:
                return s.name == start or base_name(s.name) == start

            own = [i for i in range(index + 1) if resolved[i].session == step.session]
            first = next((i for i in own if named(resolved[i])), None)
            if first is None:
                elsewhere = [s for s in resolved if named(s)]
                if any(s.session == step.session for s in elsewhere):
                    why = f"comes after {step.name!r}: a loop runs from an earlier step of the session through this one"
                elif elsewhere:
                    why = (
                        f"is a step of session {elsewhere[0].session!r}: a loop repeats steps of its own session"
                        f" ({step.session!r})"
                    )
                else:
                    known = {resolved[i].name for i in own} | {base_name(resolved[i].name) for i in own}
                    why = f"is no step of session {step.session!r}{did_you_mean(retry.start, known)}"
                raise ScenarioError(f"retry: from {retry.start!r} {why}", self.source, retry.line)
            for i in own:
                if i >= first and resolved[i].name in taken:
                    raise ScenarioError(
                        f"retry: the loop {resolved[first].name} ... {step.name} shares step {resolved[i].name!r}"
                        f" with the loop that ends at {taken[resolved[i].name]!r}; a session's loops must not overlap",
                        self.source,
                        retry.line,
                    )
                if i >= first:
                    taken[resolved[i].name] = step.name
            resolved[index] = replace(step, retry=replace(retry, start=resolved[first].name))
        return with_retries(resolved)

    def _duration(self, raw: Any, where: KeyPath) -> float:
        match = DURATION.match(raw) if isinstance(raw, str) else None
        seconds = (float(match[1]) / (1000 if match[2] == "ms" else 1)) if match else 0.0
        if not 0.001 <= seconds <= MAX_SLEEP:
            raise self.loc.error(f'sleep is a duration from 1ms to {MAX_SLEEP:g}s, such as "300ms" or "1.5s"', *where)
        return seconds

    def _expand(
        self,
        ref: str,
        names: list[str],
        groups: dict[str, list[str]],
        where: tuple[str | int, ...],
    ) -> list[str]:
        if any(ch in ref for ch in "*?["):
            members = [n for n in names if fnmatchcase(n, ref)]
            if not members:
                raise self.loc.error(f"session pattern {ref!r} matches no session", *where, "session")
            return members
        if ref in names:
            return [ref]
        if ref in groups:
            return groups[ref]
        for group, members in groups.items():  # worker3 of a group that has 2 members this time
            suffix = ref.removeprefix(group)
            if suffix != ref and suffix.isdigit() and not suffix.startswith("0"):
                raise self.loc.error(
                    f"session {ref!r} is not one of the {len(members)} sessions of group {group!r}"
                    f" ({', '.join(members)}); give the group at least {suffix}, or bound its count param"
                    " with { default = ..., min = ... }",
                    *where,
                    "session",
                )
        raise self.loc.error(
            f"unknown session {ref!r}{did_you_mean(ref, names + list(groups))}",
            *where,
            "session",
        )

    def _capture(self, raw: Any, where: tuple[str | int, ...]) -> tuple[tuple[str, str], ...]:
        if raw is None:
            return ()
        if isinstance(raw, str):
            raw = [raw]
        if isinstance(raw, list) and all(isinstance(c, str) for c in raw):
            pairs = [(c, c) for c in raw]
        elif isinstance(raw, dict) and all(isinstance(v, str) for v in raw.values()):
            pairs = list(raw.items())
        else:
            raise self.loc.error(
                'capture is a column name, a list of them, or a table {variable = "column"}',
                *where,
                "capture",
            )
        for variable, _ in pairs:
            if not re.match(r"^[A-Za-z_]\w*\Z", variable):
                raise self.loc.error(
                    f"variable name {variable!r} must be an identifier",
                    *where,
                    "capture",
                )
        return tuple(pairs)

    def _expect(self, raw: Any, sessions: list[str], where: tuple[str | int, ...]) -> StepExpectation:
        if raw is None:
            return StepExpectation()
        if not isinstance(raw, dict):
            raise self.loc.error("expect must be a table", *where)
        self._check_keys(raw, EXPECT_KEYS, where, "expectation")
        waits = raw.get("waits")
        if waits is not None and not isinstance(waits, bool):
            raise self.loc.error("expect.waits must be true or false", *where, "waits")
        waits_for = raw.get("waits_for")
        if waits_for is not None:
            waits_for = [waits_for] if isinstance(waits_for, str) else waits_for
            if not isinstance(waits_for, list) or not all(isinstance(w, str) for w in waits_for):
                raise self.loc.error(
                    "expect.waits_for is a session name or a list of them",
                    *where,
                    "waits_for",
                )
            for who in waits_for:
                if who not in sessions:
                    raise self.loc.error(
                        f"expect.waits_for names unknown session {who!r}{did_you_mean(who, sessions)}",
                        *where,
                        "waits_for",
                    )
            waits_for = tuple(waits_for)
        error = raw.get("error")
        sqlstate: str | None = None
        if error is not None:
            if error is False:
                sqlstate = ""
            elif isinstance(error, str) and SQLSTATE.match(error):
                sqlstate = error
            else:
                raise self.loc.error(
                    'expect.error is a five-character SQLSTATE such as "55P03", or false for no error',
                    *where,
                    "error",
                )
        may_fail = raw.get("may_fail", False)
        if not isinstance(may_fail, bool):
            raise self.loc.error("expect.may_fail must be true or false", *where, "may_fail")
        if may_fail and sqlstate is not None:
            raise self.loc.error(
                "expect.may_fail allows any error; with expect.error it says nothing more: keep one", *where, "may_fail"
            )
        released_by = raw.get("released_by")
        if released_by is not None and (
            not isinstance(released_by, str) or (released_by not in sessions and released_by not in RELEASE_CAUSES)
        ):
            choices = ", ".join(c for c in RELEASE_CAUSES if c != "step")
            raise self.loc.error(
                f"expect.released_by is a session or one of {choices}, not {released_by!r}"
                f"{did_you_mean(str(released_by), [*sessions, *RELEASE_CAUSES])}",
                *where,
                "released_by",
            )
        rows = raw.get("rows")
        message = raw.get("message")
        if message is not None and not isinstance(message, str):
            raise self.loc.error(
                'expect.message is a pattern of the error message, such as "*lock timeout*"', *where, "message"
            )
        return StepExpectation(
            released_by=released_by,
            may_fail=may_fail,
            waits=waits,
            waits_for=waits_for,
            waits_on=self._wait_target(raw["waits_on"], sessions, (*where, "waits_on")) if "waits_on" in raw else None,
            sqlstate=sqlstate,
            message=message,
            deadlock=self._deadlock(raw["deadlock"], sessions, (*where, "deadlock")) if "deadlock" in raw else None,
            rows=self._rows(rows, (*where, "rows")) if rows is not None else None,
            locks=self._locks(raw.get("locks"), sessions, (*where, "locks")) if "locks" in raw else None,
        )

    def _wait_target(self, raw: Any, sessions: list[str], where: KeyPath) -> RowRef | WaitTarget:
        """What a step waits on: a row (as always), a table, an advisory key, a transaction or a unique key."""
        if not isinstance(raw, dict) or not raw:
            raise self.loc.error(WAITS_ON, *where)
        self._check_keys(raw, WAIT_KEYS, where, "waits_on key")
        if "key" in raw:
            if set(raw) != {"table", "key"}:
                raise self.loc.error(WAITS_ON, *where)
            return self._row_ref(raw, where)
        if "table" in raw:
            mode = raw.get("mode")
            if not isinstance(raw["table"], str) or set(raw) - {"table", "mode"}:
                raise self.loc.error(WAITS_ON, *where)
            if mode is not None:
                wanted = re.sub(r"\s+|lock$", "", str(mode).lower())
                known = {m.lower().removesuffix("lock"): m for m in LOCK_MODES}
                if wanted not in known:
                    raise self.loc.error(f"table lock mode is one of {', '.join(LOCK_MODES)}, not {mode!r}", *where)
                mode = known[wanted]
            return WaitTarget("relation", table=raw["table"], mode=mode)
        if len(raw) != 1 or "mode" in raw:
            raise self.loc.error(WAITS_ON, *where)
        if "advisory" in raw:
            key = raw["advisory"]
            keys = tuple(key) if isinstance(key, list) else (key,)
            if not 1 <= len(keys) <= 2 or not all(isinstance(k, int) and not isinstance(k, bool) for k in keys):
                raise self.loc.error("waits_on.advisory is a key: one whole number, or a list of two", *where)
            return WaitTarget("advisory", advisory=keys)
        if "transaction_of" in raw:
            who = raw["transaction_of"]
            if who not in sessions:
                raise self.loc.error(
                    f"waits_on.transaction_of names unknown session {who!r}{did_you_mean(str(who), sessions)}", *where
                )
            return WaitTarget("transaction", session=who)
        index = raw["unique_index"]
        if index is not True and not isinstance(index, str):
            raise self.loc.error("waits_on.unique_index is the unique index's name, or true for any", *where)
        return WaitTarget("unique", index=None if index is True else index)

    def _deadlock(self, raw: Any, sessions: list[str], where: KeyPath) -> tuple[str, ...]:
        if raw is True:
            return ()
        if not isinstance(raw, list) or len(raw) < 2 or not all(isinstance(s, str) for s in raw):
            raise self.loc.error('expect.deadlock is true, or the sessions of the cycle: ["alice", "bob"]', *where)
        for who in raw:
            if who not in sessions:
                raise self.loc.error(
                    f"expect.deadlock names unknown session {who!r}{did_you_mean(who, sessions)}", *where
                )
        return tuple(raw)

    def _row_ref(self, raw: Any, where: tuple[str | int, ...]) -> RowRef:
        if not isinstance(raw, dict) or not isinstance(raw.get("table"), str) or not isinstance(raw.get("key"), dict):
            raise self.loc.error('a row is {table = "jobs", key = {id = 1}}', *where)
        return RowRef(raw["table"], tuple(raw["key"].items()))

    def _locks(self, raw: Any, sessions: list[str], where: tuple[str | int, ...]) -> tuple[LockExpectation, ...]:
        if not isinstance(raw, list):
            raise self.loc.error("expect.locks is a list of {table, key, session, mode}", *where)
        out = []
        for item in raw:
            if not isinstance(item, dict):
                raise self.loc.error("expect.locks is a list of {table, key, session, mode}", *where)
            self._check_keys(item, LOCK_KEYS, where, "lock key")
            session = item.get("session")
            if session not in sessions:
                raise self.loc.error(
                    f"expect.locks names unknown session {session!r}{did_you_mean(str(session), sessions)}",
                    *where,
                )
            mode = item.get("mode")
            if mode is not None and (not isinstance(mode, str) or mode.upper() not in ROW_MODES):
                raise self.loc.error(f"lock mode must be one of {', '.join(sorted(ROW_MODES))}", *where)
            out.append(LockExpectation(self._row_ref(item, where), session, mode.upper() if mode else None))
        return tuple(out)

    def _rows(self, raw: Any, where: tuple[str | int, ...]) -> tuple[tuple[Any, ...], ...]:
        if not isinstance(raw, list) or not all(isinstance(r, list) for r in raw):
            raise self.loc.error(
                'rows is a list of rows, each a list of values: rows = [[1, "a"]]',
                *where,
            )
        return tuple(tuple(r) for r in raw)

    def _checks(self, raw: Any, path: KeyPath) -> tuple[FinalCheck, ...]:
        if not isinstance(raw, list):
            raise self.loc.error("checks are [[check]] tables", *path)
        checks = []
        for index, item in enumerate(raw):
            where: KeyPath = (*path, index)
            if not isinstance(item, dict):
                raise self.loc.error("each check is a [[check]] table", *where)
            self._check_keys(item, CHECK_KEYS, where, "check key")
            query = self._str(item.get("sql"), *where, "sql", what="check sql")
            if "rows" not in item:
                raise self.loc.error(
                    "a check needs rows = [[...]], the rows its query must return",
                    *where,
                )
            checks.append(
                FinalCheck(
                    description=self._str(item.get("description", query), *where, "description"),
                    sql=query,
                    rows=self._rows(item["rows"], (*where, "rows")),
                    line=self.loc.line_of(*where),
                )
            )
        return tuple(checks)

    def _topic(self) -> str:
        """Lower-case words and single spaces, so topics group and sort the same everywhere."""
        if "topic" not in self.data:
            return ""
        topic = self._str(self.data["topic"], "topic")
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

    def _other_variant(
        self,
        main: Scenario,
        variant: str,
        raw: Any,
        sessions: tuple[Session, ...],
        groups: dict[str, list[str]],
    ) -> Scenario:
        if not isinstance(raw, dict):
            raise self.loc.error(f"[{variant}] must be a table", variant)
        self._check_keys(raw, VARIANT_KEYS, (variant,), f"[{variant}] key")
        overrides = raw.get("step", {})
        if isinstance(overrides, list):  # [[fix.step]] tables: this variant tells its own steps
            steps = list(self._steps(overrides, sessions, groups, (variant, "step")))
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
            self._check_keys(change, OVERRIDE_KEYS, where, "step key")
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
                    fields["sql"] = self._str(change["sql"], *where, "sql")
                    fields["line"] = self.loc.line_of(*where)  # its errors are the override's, not the base step's
                if "sleep" in change:
                    fields["sleep"] = self._duration(change["sleep"], (*where, "sleep"))
                    fields["sql"] = f"sleep {change['sleep'].strip()}"
                if "note" in change:
                    fields["note"] = self._str(change["note"], *where, "note")
                if "capture" in change:
                    fields["capture"] = self._capture(change["capture"], where)
                if "expect" in change:
                    fields["expect"] = self._expect(change["expect"], [s.name for s in sessions], (*where, "expect"))
                if "retry" in change:
                    fields["retry"] = self._retry(change["retry"], where)
                steps[i] = replace(step, **fields)
        steps = self._dropped(steps, raw.get("drop"), variant, changes)
        steps = self._inserted(steps, raw.get("insert"), variant, sessions, groups, changes)
        checks = self._checks(raw["check"], (variant, "check")) if "check" in raw else main.checks
        setup = self._sql_list(raw["setup"], variant, "setup") if "setup" in raw else main.setup
        return replace(
            main,
            variant=variant,
            changes=tuple(changes),
            title=self._str(raw.get("title", main.title), variant, "title"),
            narrative=self._str(raw.get("narrative", main.narrative), variant, "narrative").strip(),
            steps=(unrolled := self._loops(steps)),
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
        made = self._steps(bare, sessions, groups, (variant, "insert"))
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

    def _check_variables(self, scenario: Scenario) -> None:
        """Every ``:name`` must be a param or a capture made earlier in the file; ``:s.name`` names session s.

        Steps run in file order, so a capture made by a later step can never be there in time:
        that is an error too, naming the step that captures it.
        """
        params = {k for k, _ in scenario.params}
        for text in scenario.setup:
            for use in find(text):
                if use.session is not None or use.name not in params:
                    raise self.loc.error(
                        f"setup uses {use.written}, which is not a param{did_you_mean(use.key, params)}"
                        " (setup runs before any session)",
                        "setup",
                    )
        for index, step in enumerate(scenario.steps):
            if step.sleep is not None or step.crash is not None:
                continue
            for use in find(step.sql):
                problem = self._variable_problem(scenario, use.session or step.session, use.name, index, params, use)
                if problem:
                    line = self.loc.key_in_section(step.line, "sql") if step.line else None
                    raise ScenarioError(f"step {step.name!r} uses {use.written}, {problem}", self.source, line)
        for check in scenario.checks:
            for use in find(check.sql):
                if use.session is None:
                    problem = "" if use.name in params else f"which is not a param{did_you_mean(use.name, params)}"
                else:
                    last = len(scenario.steps)
                    problem = self._variable_problem(scenario, use.session, use.name, last, params, use)
                if problem:
                    raise ScenarioError(f"check uses {use.written}, {problem}", self.source, check.line)

    def _variable_problem(
        self, scenario: Scenario, session: str, name: str, index: int, params: set[str], use: Use
    ) -> str:
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

    # -- small typed readers ----------------------------------------------------------

    def _check_keys(
        self,
        table: dict[str, Any],
        allowed: set[str],
        where: tuple[str | int, ...],
        what: str,
    ) -> None:
        for key in table:
            if key not in allowed:
                raise self.loc.error(f"unknown {what} {key!r}{did_you_mean(key, allowed)}", *where, key)

    def _str(self, value: Any, *path: str | int, what: str | None = None) -> str:
        label = what or str(path[-1])
        if value is None:
            raise self.loc.error(f"missing {label}", *path[:-1] if len(path) > 1 else path)
        if not isinstance(value, str):
            raise self.loc.error(f"{label} must be a string", *path)
        return value

    def _opt_str(self, value: Any, *path: str | int) -> str | None:
        return None if value is None else self._str(value, *path)

    def _sql_list(self, value: Any, *path: str | int) -> tuple[str, ...]:
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise self.loc.error(f"{path[-1]} must be SQL text or a list of SQL texts", *path)


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
