"""What a step is expected to do (``expect = { ... }``) and the final ``[[check]]`` queries."""

from __future__ import annotations

import re
from typing import Any

from pgrace.frontends.names import KeyPath, did_you_mean
from pgrace.frontends.scenario_toml.reader import SQLSTATE, Reader
from pgrace.model.scenario import (
    LOCK_MODES,
    CheckKind,
    FinalCheck,
    LockExpectation,
    RowRef,
    StepExpectation,
    WaitTarget,
)
from pgrace.model.timeline import RELEASE_CAUSES

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
CHECK_KEYS = {"description", "sql", "rows", "kind"}
CHECK_KINDS = ("invariant", "bug")
LOCK_KEYS = {"table", "key", "session", "mode"}
ROW_MODES = {
    "FOR UPDATE",
    "FOR NO KEY UPDATE",
    "FOR SHARE",
    "FOR KEY SHARE",
    "UPDATE",
    "NO KEY UPDATE",
}


class Expectations:
    """Reads expectations and checks; sessions are passed in, since a variant's steps see the same ones."""

    def __init__(self, read: Reader) -> None:
        self.read = read
        self.loc = read.loc

    def expect(self, raw: Any, sessions: list[str], where: tuple[str | int, ...]) -> StepExpectation:
        if raw is None:
            return StepExpectation()
        if not isinstance(raw, dict):
            raise self.loc.error("expect must be a table", *where)
        self.read.check_keys(raw, EXPECT_KEYS, where, "expectation")
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
        allowed = self._allowed(may_fail, (*where, "may_fail"))
        may_fail = may_fail is True
        if may_fail and sqlstate is not None:  # SQLSTATEs with error: what the file's order does, what others may
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
            allowed=allowed,
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
        self.read.check_keys(raw, WAIT_KEYS, where, "waits_on key")
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
            self.read.check_keys(item, LOCK_KEYS, where, "lock key")
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

    def _allowed(self, raw: Any, where: KeyPath) -> tuple[str, ...]:
        """``may_fail = "40001"`` or a list of SQLSTATEs: the step may fail with these, in any order, and need not.

        Beside ``error`` (which says what the file's order does) it declares what other orders may raise.
        """
        if isinstance(raw, bool):
            return ()
        codes = [raw] if isinstance(raw, str) else raw
        if not isinstance(codes, list) or not codes or not all(isinstance(c, str) and SQLSTATE.match(c) for c in codes):
            raise self.loc.error(
                'expect.may_fail is true (any error), an SQLSTATE ("40001") or a list of them (["40001", "40P01"])',
                *where,
            )
        return tuple(dict.fromkeys(codes))

    def _kind(self, raw: Any, where: KeyPath) -> CheckKind:
        """A check's polarity: the reader must never have to guess it from the variant."""
        if raw == "invariant" or raw == "bug":
            return "invariant" if raw == "invariant" else "bug"
        hint = did_you_mean(raw, set(CHECK_KINDS)) if isinstance(raw, str) else ""
        raise self.loc.error(
            'check kind is "invariant" (the rows every correct outcome leaves; the default) or "bug"'
            f" (the rows only the bug leaves), not {str(raw)[:40]!r}{hint}",
            *where,
        )

    def checks(self, raw: Any, path: KeyPath) -> tuple[FinalCheck, ...]:
        if not isinstance(raw, list):
            raise self.loc.error("checks are [[check]] tables", *path)
        checks = []
        for index, item in enumerate(raw):
            where: KeyPath = (*path, index)
            if not isinstance(item, dict):
                raise self.loc.error("each check is a [[check]] table", *where)
            self.read.check_keys(item, CHECK_KEYS, where, "check key")
            query = self.read.text(item.get("sql"), *where, "sql", what="check sql")
            if "rows" not in item:
                raise self.loc.error(
                    "a check needs rows = [[...]], the rows its query must return",
                    *where,
                )
            checks.append(
                FinalCheck(
                    description=self.read.text(item.get("description", query), *where, "description"),
                    sql=query,
                    rows=self._rows(item["rows"], (*where, "rows")),
                    line=self.loc.line_of(*where),
                    kind=self._kind(item.get("kind", "invariant"), (*where, "kind")),
                )
            )
        return tuple(checks)
