"""``[[step]]`` tables: one step per session they name (a group, a pattern, minus ``except``)."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from pgrace.frontends.names import KeyPath, did_you_mean
from pgrace.frontends.scenario_toml.expect import Expectations
from pgrace.frontends.scenario_toml.reader import NAME, Reader
from pgrace.frontends.scenario_toml.retry import Retries
from pgrace.model.scenario import CrashMode, Session, Step

STEP_KEYS = {"name", "session", "except", "sql", "sleep", "crash", "note", "capture", "expect", "retry"}
ACTIONS = ("sql", "sleep", "crash")  # what a step does: exactly one of them
CRASHES = ("terminate", "disconnect")


class StepReader:
    """A list of step tables -> Steps, their retry loops not yet unrolled (a variant may still edit the list)."""

    def __init__(self, read: Reader, expects: Expectations, retries: Retries) -> None:
        self.read = read
        self.loc = read.loc
        self.expects = expects
        self.retries = retries

    def parse(
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
            self.read.check_keys(item, STEP_KEYS, where, "step key")
            session_ref = self.read.text(item.get("session"), *where, "session", what="step session")
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
                base = self.read.text(base, *where, "name", what="step name")
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
                        note=self.read.text(item.get("note", ""), *where, "note"),
                        capture=self.read.capture(item.get("capture"), where),
                        expect=self.expects.expect(item.get("expect"), names, (*where, "expect")),
                        line=self.loc.line_of(*where),
                        sleep=sleep,
                        crash=crash,
                        retry=self.retries.parse(item["retry"], where) if "retry" in item else None,
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
            return self.read.text(item["sql"], *where, "sql", what="step sql"), None, None
        for key in ("capture", "expect", "retry"):
            if key in item:
                raise self.loc.error(f"a {given[0]} step sends no SQL: it has no {key}", *where, key)
        if "sleep" in item:
            seconds = self.read.duration(item["sleep"], (*where, "sleep"))
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
