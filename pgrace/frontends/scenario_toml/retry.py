"""Retry loops: ``retry = { on, from, max }`` on a step, resolved in its session and unrolled."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pgrace.errors import ScenarioError
from pgrace.frontends.limits import MAX_STEPS
from pgrace.frontends.names import KeyPath, base_name, did_you_mean
from pgrace.frontends.scenario_toml.reader import SQLSTATE, Reader
from pgrace.model.scenario import MAX_RETRIES, Retry, Step, with_retries

RETRY_KEYS = {"on", "from", "max"}
RETRY_FORM = 'retry = { on = ["40001", "40P01"], from = "STEP", max = N }'


class Retries:
    """Reads a step's ``retry`` table, then (once a variant's list is final) resolves and unrolls the loops."""

    def __init__(self, read: Reader) -> None:
        self.read = read
        self.loc = read.loc
        self.source = read.source

    def parse(self, raw: Any, where: KeyPath) -> Retry:
        """``retry = { on = [...], from = "STEP", max = N }``, its ``from`` not yet resolved (see :meth:`unroll`)."""
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

    def unroll(self, steps: list[Step] | tuple[Step, ...]) -> tuple[Step, ...]:
        """Resolve each retry's ``from`` in its own session, refuse overlapping loops, and unroll them.

        ``from`` names a step of the same session, this one or an earlier one (a group
        step's base name means the member's own). Errors are told at the retry key's line.
        """
        resolved = list(steps)
        taken: dict[str, str] = {}  # a step in a loop -> that loop's last step
        sessions: dict[str, list[int]] = {}  # a session's step positions so far
        total = len(resolved)  # steps once unrolled
        for index, step in enumerate(resolved):
            own = sessions.setdefault(step.session, [])
            own.append(index)
            retry = step.retry
            if retry is None:
                continue

            def named(s: Step, start: str = retry.start) -> bool:
                return s.name == start or base_name(s.name) == start

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
            body = len(own) - own.index(first)
            total += retry.max * (body + 1)  # each attempt: a ROLLBACK and a copy of the loop
            if total > MAX_STEPS:
                raise ScenarioError(
                    f"retry: unrolled, this loop ({body} steps, max = {retry.max}) makes the scenario "
                    f"{total:,} steps or more: at most {MAX_STEPS:,}, pgrace's limit",
                    self.source,
                    retry.line,
                )
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
