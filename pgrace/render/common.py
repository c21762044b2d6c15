"""What every renderer shares, so the text, presenter, HTML, SVG, Mermaid and Markdown
outputs say the same things in the same words and paint each session the same colour.

* :data:`PALETTE`: one colour per session position, as a terminal colour name, a strong
  and a light hex colour, and a coloured square for Markdown.
* wording: :func:`describe_wait` (the long form), :func:`wait_phrase` (the short form
  pictures use), :func:`outcome_lines`, :func:`sql_lines` (SQL broken at its clauses).
* :func:`timeline_sections`: the run folded into drawable rows (steps, resumes,
  cancels, notices) with the row locks held after each, and the spans of every wait.
* :func:`story_facts`: what happened, in sentences (waits and errors).

Everything here is pure: a :class:`~pgrace.timeline.Run` in, values out.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pgrace.timeline import (
    Blocker,
    CheckResult,
    Holder,
    LocksObserved,
    NoticeReceived,
    NotifyReceived,
    Outcome,
    PermutationStarted,
    Release,
    ResultSet,
    RowLock,
    Run,
    SessionLost,
    StepCancelled,
    StepFinished,
    StepLaunched,
    StepWaiting,
    Wait,
)
from pgrace.values import display_cell

MAX_ROWS_SHOWN = 4
QUIET_TAGS = {"BEGIN", "COMMIT", "SET", "START TRANSACTION"}  # a COMMIT that rolled back still shows


@dataclass(frozen=True)
class SessionColour:
    """One session's colour in every format: terminal name, strong and light hex, square."""

    terminal: str
    strong: str
    light: str
    square: str


PALETTE = (
    SessionColour("cyan", "#0e7490", "#cffafe", "🟦"),
    SessionColour("magenta", "#a21caf", "#fae8ff", "🟪"),
    SessionColour("yellow", "#a16207", "#fef9c3", "🟨"),
    SessionColour("green", "#15803d", "#dcfce7", "🟩"),
    SessionColour("blue", "#1d4ed8", "#dbeafe", "🔷"),
    SessionColour("red", "#b91c1c", "#fee2e2", "🟥"),
    SessionColour("bright_cyan", "#0891b2", "#ecfeff", "🔹"),
    SessionColour("bright_magenta", "#c026d3", "#fdf4ff", "🟣"),
)
SESSION_COLOURS = tuple(c.terminal for c in PALETTE)

WAIT_COLOUR = "#ea580c"  # the wait bars and arrows: orange, no session has it
WAIT_DARK = "#9a3412"
ERROR_COLOUR = "#dc2626"
OK_COLOUR = "#15803d"


def session_colours(sessions: list[str]) -> dict[str, SessionColour]:
    """A session's colour follows its position in the scenario, in every format."""
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(sessions)}


def one_line(sql: str) -> str:
    return " ".join(sql.split()) or "(empty step)"


def shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(1, limit - 1)].rstrip() + "…"


def shorten_sql(sql: str, limit: int) -> str:
    """SQL cut to ``limit`` characters at a clause boundary, else a word boundary, never mid-word.

    ``UPDATE accounts SET balance = balance + 10 WHERE id = 2`` at 24 becomes
    ``UPDATE accounts …``; a first word longer than the limit is kept whole.
    """
    text = one_line(sql)
    if len(text) <= limit:
        return text
    statements = _statements(text)
    clauses = _clauses(statements[0]) if statements else [text]
    kept = clauses[0]
    for clause in clauses[1:]:
        if len(kept) + 1 + len(clause) + 2 > limit:
            break
        kept += " " + clause
    if len(kept) + 2 > limit:  # even the first clause is too long: cut it between words
        words = kept.split(" ")
        kept = words[0]
        for word in words[1:]:
            if len(kept) + 1 + len(word) + 2 > limit:
                break
            kept += " " + word
    return kept if kept == text else kept + " …"


# -- wording -----------------------------------------------------------------------------


def wait_target(wait: Wait) -> str:
    """What the step waits on, as a person names it: a row by key, a table, a lock."""
    if wait.kind == "row":
        return str(wait.row) if wait.row else _unkeyed_row(wait)
    if wait.kind == "relation":  # a table created in a transaction not committed yet has no name to read
        return f"table {wait.table}" if wait.table else "a table not visible yet"
    if wait.kind == "advisory":
        return f"advisory lock {wait.advisory or wait.detail}"
    if wait.kind in ("transaction", "virtualxid"):
        return "its transaction"
    if wait.kind == "speculative":
        return "its insertion"
    return f"a {wait.lock_type} lock"


def _unkeyed_row(wait: Wait) -> str:
    """A row pgrace cannot name by key (a catalog's, a table without a primary key): its table and ctid."""
    return f"{wait.table or 'a table not visible yet'} ctid {wait.ctid}"


def wait_holder(wait: Wait) -> str:
    """The session at the end of the chain: the one holding what the step wants."""
    return wait.holder or (wait.blocked_by[0] if wait.blocked_by else "another backend")


def wait_points_at(wait: Wait) -> str:
    """The session a picture's arrow points at: the one holding what the step wants or,
    when the step is only queued behind other waiters (a table or advisory lock), the
    first of them: the holder at the end of the chain does not conflict with the step."""
    ahead = _queued_ahead(wait) if wait.kind != "row" else []
    if ahead and not _direct_holders(wait):
        return ahead[0]
    return wait_holder(wait)


def wait_badge(wait: Wait) -> str:
    """The label at the arrow's head: ``s1 holds table jobs``, or ``migration is ahead`` in the queue."""
    who = wait_points_at(wait)
    if who != wait_holder(wait):
        return f"{who} is ahead"
    return f"{who} holds {wait_target(wait)}"


def _waiter(wait: Wait) -> str:
    return wait.chain[0].waiter if wait.chain else ""


def _queued_ahead(wait: Wait) -> list[str]:
    """The waiters this step queues behind (soft blocking), in the server's order."""
    return [link.session for link in wait.chain if link.how == "queued" and link.waiter == _waiter(wait)]


def _direct_holders(wait: Wait) -> list[str]:
    """The sessions holding a lock that conflicts with this step's request (hard blocking)."""
    return [link.session for link in wait.chain if link.how == "holds" and link.waiter == _waiter(wait)]


def _unique_text(wait: Wait) -> str:
    """The unique index an insert waits on, or the candidates, never a key (see Wait.unique_indexes)."""
    if len(wait.unique_indexes) == 1:
        return f"a key conflict in unique index {wait.unique_indexes[0]}"
    if wait.unique_indexes:
        return f"a key conflict in one of the unique indexes {' or '.join(wait.unique_indexes)}"
    return ""


def _mode_text(mode: str | None) -> str:
    return mode or "?"


def wait_phrase(wait: Wait) -> str:
    """The short form for pictures: ``waits for worker1 on jobs id=1``."""
    who = ", ".join(wait.blocked_by) or "another backend"
    if wait.kind in ("transaction", "virtualxid", "speculative"):
        ends = "speculative insertion to finish" if wait.kind == "speculative" else "transaction to end"
        why = _unique_text(wait) or wait.reason.split(": ", 1)[-1]
        return f"waits for {who}'s {ends}" + (f" ({why})" if why else "")
    if wait.kind != "row" and _queued_ahead(wait):
        text = f"queued behind {', '.join(_queued_ahead(wait))} for {wait_target(wait)}"
        last = [link for link in wait.chain if link.how == "holds" and link.waiter != _waiter(wait)]
        return text + (f" ({last[-1].waiter} waits for {last[-1].session})" if last else "")
    text = f"waits for {who} on {wait_target(wait)}"
    if wait.queued_behind and wait.holder and wait.holder not in wait.blocked_by:
        text += f" (held by {wait.holder})"
    return text


def describe_wait(wait: Wait) -> str:
    """The long form the text timeline prints, with lock modes, queues and chains."""
    who = ", ".join(wait.blocked_by) or "another backend"
    if wait.kind == "row":
        row = str(wait.row) if wait.row else _unkeyed_row(wait)
        text = f"⏳ waits for {who} on row {row}"
        if wait.mode:
            text += f" (wants {wait.mode}"
            if wait.holder and wait.holder_mode:
                text += f"; {wait.holder} holds {wait.holder_mode}"
            text += ")"
        if wait.queued_behind and wait.holder and wait.holder not in wait.blocked_by:
            text += f", queued behind {', '.join(wait.queued_behind)}, row held by {wait.holder}"
        return text
    if wait.kind in ("transaction", "virtualxid", "speculative"):
        ends = "speculative insertion to finish" if wait.kind == "speculative" else "transaction to end"
        why = _unique_text(wait) or wait.reason
        return f"⏳ waits for {who}'s {ends}" + (f" ({why})" if why else "")
    return "⏳ " + _lock_chain_text(wait)


def _lock_chain_text(wait: Wait) -> str:
    """A table, advisory or other lock wait: who holds a conflicting lock, who is queued ahead, and so on."""
    target = wait_target(wait)
    wants = f"wants {_advisory_mode(wait, wait.mode)}"
    if wait.advisory is not None and wait.advisory.level:
        wants += f", {wait.advisory.level} level"
    me = _waiter(wait)
    holders = [link for link in wait.chain if link.how == "holds" and link.waiter == me]
    queued = [link for link in wait.chain if link.how == "queued" and link.waiter == me]
    if not wait.chain:  # nothing in pg_locks explains it (e.g. the holder is outside the scenario)
        who = ", ".join(wait.blocked_by) or "another backend"
        return f"waits for {who} on {target} ({wants})"
    if holders:
        held = "; ".join(f"{link.session} holds {_advisory_mode(wait, link.mode)}" for link in holders)
        text = f"waits for {', '.join(link.session for link in holders)} on {target} ({wants}; {held})"
        if queued:
            text += ", and is queued behind " + ", ".join(_queued_link(wait, link) for link in queued)
    else:
        text = f"queued for {target} ({wants}) behind " + ", ".join(_queued_link(wait, link) for link in queued)
    further = [link for link in wait.chain if link.waiter != me]
    if further:
        text += "; " + "; ".join(
            f"{link.waiter} waits for {link.session} ({link.session} holds {_advisory_mode(wait, link.mode)})"
            if link.how == "holds"
            else f"{link.waiter} is queued behind {_queued_link(wait, link)}"
            for link in further
        )
    return text


def _queued_link(wait: Wait, link: Blocker) -> str:
    return f"{link.session} (wants {_advisory_mode(wait, link.mode)})"


def _advisory_mode(wait: Wait, mode: str | None) -> str:
    """Advisory locks read shared or exclusive."""
    if wait.kind != "advisory":
        return _mode_text(mode)
    return "shared" if mode == "ShareLock" else "exclusive" if mode == "ExclusiveLock" else _mode_text(mode)


def serialization_text(locks: tuple[RowLock, ...]) -> str:
    """The SIRead locks last seen before a 40001: the reads whose conflicts the server tracked."""
    by_session: dict[str, list[str]] = {}
    for lock in locks:
        by_session.setdefault(lock.session, []).append(lock.describe_row())
    held = "; ".join(f"{who}: {', '.join(targets)}" for who, targets in by_session.items())
    return f"⚑ SIRead locks held before it: {held or 'none seen'}"


def outcome_lines(outcome: Outcome) -> list[str]:
    """A step's results, command tags and error, one line each (``→`` and ``✗``)."""
    lines: list[str] = []
    for result in outcome.results:
        rows = shown_rows(result)
        if not rows:
            lines.append("→ no rows" if result.columns else "→ (no columns)")
        elif len(rows) == 1:
            pairs = [f"{c}={v}" for c, v in zip(result.columns, rows[0], strict=True)]
            lines.append("→ " + ", ".join(pairs))
        else:
            shown = ["(" + ", ".join(row) + ")" for row in rows[:MAX_ROWS_SHOWN]]
            more = f" … {len(rows) - MAX_ROWS_SHOWN} more" if len(rows) > MAX_ROWS_SHOWN else ""
            lines.append(f"→ {len(rows)} rows: " + ", ".join(shown) + more)
    if not outcome.results:
        tags = [c for c in outcome.commands if c and c not in QUIET_TAGS]
        if tags:
            lines.append("→ " + ", ".join(tags))
    if outcome.error is not None:
        lines.append(f"✗ {outcome.error.severity} {outcome.error.sqlstate}: {outcome.error.message}")
        if outcome.error.cycle:
            lines.append("↻ deadlock: " + "; ".join(outcome.error.cycle))
        if outcome.retry is not None:
            lines.append(f"⟲ retried: attempt {outcome.retry} follows")
    return lines


def shown_rows(result: ResultSet) -> list[list[str]]:
    """Every cell as the server wrote it (quoted for strings): never a Python conversion."""
    types = result.types or (0,) * len(result.columns)
    return [[display_cell(text, oid) for text, oid in zip(row, types, strict=True)] for row in result.text_rows]


_TOKEN_BREAK = re.compile(r"(?<=[(,])(?=.)")  # after an opening parenthesis or a comma: between tokens


_JOINT = "\x01 "


def wrap_cell(text: str, width: int, indent: str = "  ") -> list[str]:
    """Wrap at spaces, never inside a token.

    A word longer than the line stays whole, except that a long call may break after its
    ``(`` or a ``,`` (``current_setting(`` / ``'application_name')``) when both sides are
    substantial: ``pg_advisory_xact_lock(42)`` and ``(AccessExclusiveLock)`` stay whole.
    """
    room = max(1, width - len(indent))
    words = [word if len(word) <= room else _JOINT.join(_token_pieces(word, room)) for word in text.split(" ")]
    wrapped = textwrap.wrap(
        " ".join(words), width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )
    return [line.replace(_JOINT, "").replace(_JOINT[0], "") for line in wrapped] or [""]


def _token_pieces(word: str, room: int) -> list[str]:
    """A long token cut after ``(`` or ``,``: as late as fits, each side at least a few characters."""
    if len(word) <= room:
        return [word]
    cuts = [m.start() for m in _TOKEN_BREAK.finditer(word) if m.start() >= 8 and len(word) - m.start() >= 4]
    if not cuts:
        return [word]
    fitting = [cut for cut in cuts if cut <= room]
    cut = fitting[-1] if fitting else cuts[0]
    return [word[:cut], *_token_pieces(word[cut:], room)]


def release_phrase(seq: int, release: Release | None, launched: Mapping[int, StepLaunched], sql_limit: int = 30) -> str:
    """What ended step ``seq``'s wait, after ``↳ step N``: the same words in every format.

    ``resumes after alice's COMMIT (step 6)``; ``ends: the deadlock detector chose it as the
    victim``; ``resumes: released by the deadlock detector (victim: step 6)``; ``ends: its
    lock_timeout expired``; ``resumes: worker1's connection is gone`` (its backend was
    terminated, or it crashed: its transaction rolled back) ...
    """
    if release is None or release.cause == "unknown":
        return "resumes; no step of the scenario released it"
    if release.cause == "step" and release.seq is not None and release.seq in launched:
        trigger = launched[release.seq]
        failed = " failed" if release.failed else ""
        return f"resumes after {trigger.session}'s {shorten_sql(trigger.sql, sql_limit)} (step {release.seq}){failed}"
    if release.cause == "deadlock":
        if release.seq == seq or release.seq is None:
            return "ends: the deadlock detector chose it as the victim"
        return f"resumes: released by the deadlock detector (victim: step {release.seq})"
    if release.cause == "terminated":
        own = launched[seq].session if seq in launched else None
        if release.session is None or release.session == own:
            return "ends: its connection is gone"
        if release.reason:
            return f"resumes: the server ended {release.session}'s connection ({release.reason})"
        during = f" (step {release.seq})" if release.seq is not None and release.seq in launched else ""
        return f"resumes: {release.session}'s connection is gone{during}"
    return {
        "lock_timeout": "ends: its lock_timeout expired",
        "statement_timeout": "ends: its statement_timeout expired",
        "cancel": "ends: a cancel request stopped it",
        "step_timeout": "ends: pgrace cancelled it (--step-timeout)",
    }.get(release.cause, f"ends ({release.cause})")


def steps_waited(seq: int, release: Release | None, last_launched: int) -> int:
    """How many steps were launched while the step waited (up to the step that released it)."""
    if release is not None and release.cause == "step" and release.seq is not None and release.seq > seq:
        return release.seq - seq  # launched after it: the count stops at the step that freed it
    return max(0, last_launched - seq)  # freed by the server, or by a step that was already running


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def cancel_text(event: StepCancelled) -> str:
    """Why a cancelled step could not finish: who waited on whom, and what the held-on sessions were doing."""
    parts = [f"{who} waits for {', '.join(on)}" for who, on in event.graph]
    parts += [describe_holder(holder) for holder in event.holders]
    return "; ".join(parts) or "no lock waits"


def describe_holder(holder: Holder) -> str:
    """``a is idle in transaction, its next step (a-3: COMMIT) comes later``: the usual endless wait."""
    who = holder.session
    if holder.running is not None:
        return f"{who} is still running its step {holder.running}"
    state = holder.state or "disconnected"
    if holder.next_step is not None:
        upcoming = f"{holder.next_step}: {shorten(one_line(holder.next_sql), 30)}"
        return f"{who} is {state}, its next step ({upcoming}) comes later"
    return f"{who} is {state} and has no step left to end it"


def lost_text(event: SessionLost) -> str:
    """The one row a lost connection gets; the step that found it shows the server's message, or this row does."""
    if event.idle:
        return f"⚡ the server ended {event.session}'s connection ({event.sqlstate}: {event.message})"
    return f"⚡ {event.session}'s connection is gone ({event.sqlstate}); its later steps are not sent"


def lock_label(lock: RowLock) -> str:
    return lock.label()


def shown_locks(run: Run, event: LocksObserved) -> tuple[RowLock, ...] | None:
    """The locks the locks column shows after ``event``: rows, or (``--locks all``) every kind."""
    if run.lock_kinds == "rows":
        return event.locks
    return (event.locks or ()) + event.other_locks


def locks_heading(run: Run) -> str:
    """The locks column's heading: what :func:`shown_locks` puts in it."""
    return "row locks held" if run.lock_kinds == "rows" else "locks held"


_CLAUSE = re.compile(
    r"\s+(?=(?:FROM|WHERE|ORDER\s+BY|GROUP\s+BY|HAVING|LIMIT|OFFSET|FOR\s+(?:NO\s+KEY\s+)?UPDATE"
    r"|FOR\s+(?:KEY\s+)?SHARE|SET|VALUES|RETURNING|ON\s+CONFLICT)\b)",
    re.IGNORECASE,
)


def _statements(sql: str) -> list[str]:
    """Split on semicolons outside quotes, each statement keeping its semicolon."""
    out: list[str] = []
    quote = ""
    current = ""
    for char in sql:
        current += char
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == ";":
            out.append(current.strip())
            current = ""
    if current.strip():
        out.append(current.strip())
    return out


def _clauses(statement: str) -> list[str]:
    pieces: list[str] = []
    start = 0
    for match in _CLAUSE.finditer(statement):
        before = statement[: match.start()]
        if before.count("'") % 2 == 0 and before.count('"') % 2 == 0:
            pieces.append(statement[start : match.start()])
            start = match.end()
    pieces.append(statement[start:])
    return [p for p in pieces if p]


def sql_lines(sql: str, width: int, max_lines: int | None = None) -> list[str]:
    """SQL on lines of at most ``width`` characters, broken before its clauses.

    Short statements stay on one line; a long one breaks before FROM, WHERE, ORDER BY,
    FOR UPDATE, SET and so on, continuation lines indented, so a projector or a picture
    shows its shape. Beyond ``max_lines`` the last line ends with an ellipsis.
    """
    width = max(12, width)
    lines: list[str] = []
    for statement in _statements(one_line(sql)):
        chunks: list[str] = []
        for piece in _clauses(statement):
            room = width - (2 if chunks else 0)
            if chunks and len(chunks[-1]) + 1 + len(piece) <= room:
                chunks[-1] += " " + piece
            else:
                chunks.append(piece)
        for i, chunk in enumerate(chunks):
            indent = "  " if i else ""
            lines += [indent + line for line in wrap_cell(chunk, width - len(indent))]
    if max_lines is not None and len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][: width - 2].rstrip() + " …"
    return lines or ["(empty step)"]


# -- the timeline as drawable rows ------------------------------------------------------

EntryKind = Literal["step", "resume", "cancel", "notice", "lost"]


@dataclass
class Entry:
    """One row of a picture: something that happened in one session's lane."""

    kind: EntryKind
    session: str
    seq: int | None = None  # the launched step (for a resume: the step that resumes)
    step: str = ""
    sql: str = ""
    note: str = ""
    waits: tuple[Wait, ...] = ()
    by_marker: bool = False
    outcome: Outcome | None = None
    released_by: int | None = None  # the step that released it, when a step did
    release: Release | None = None  # what ended the wait (a resume)
    release_text: str = ""  # release_phrase(): "resumes after a's COMMIT (step 6)", "ends: ..."
    text: str = ""
    locks: tuple[RowLock, ...] | None = ()  # row locks held after this row (carried forward)
    sireads: tuple[RowLock, ...] | None = None  # a 40001: the SIRead locks last seen before it

    def outcome_lines(self) -> list[str]:
        """The outcome's lines, and the SIRead locks that explain a serialization failure."""
        lines = outcome_lines(self.outcome) if self.outcome is not None else []
        if self.sireads is not None:
            lines.append(serialization_text(self.sireads))
        return lines

    @property
    def error_state(self) -> str | None:
        if self.outcome is not None and self.outcome.error is not None:
            return self.outcome.error.sqlstate
        return None


@dataclass
class WaitSpan:
    """A step that waited: the row where it blocked and the row where it ended."""

    seq: int
    session: str
    start: int
    end: int | None  # None: still waiting when the section ended
    waits: tuple[Wait, ...]
    steps_waited: int = 0


@dataclass
class Section:
    """One permutation: its heading (only when there are several) and its rows."""

    heading: str
    entries: list[Entry] = field(default_factory=list)
    spans: list[WaitSpan] = field(default_factory=list)

    def locked_rows(self) -> list[str]:
        """Every row anyone held during the section, in the order they were first held."""
        seen: list[str] = []
        for entry in self.entries:
            for lock in entry.locks or ():
                if lock.describe_row() not in seen:
                    seen.append(lock.describe_row())
        return seen


def timeline_sections(run: Run) -> list[Section]:
    """Fold the events into rows per permutation, the way the text timeline does."""
    sections: list[Section] = []
    launched: dict[int, StepLaunched] = {}
    section = Section("")
    locks: tuple[RowLock, ...] | None = ()
    predicate: tuple[RowLock, ...] = ()  # SIRead locks last seen, for a 40001
    open_spans: dict[int, WaitSpan] = {}
    paused: dict[int, Entry] = {}  # sleep steps, shown when they start; a long step, when others act during it
    unshown: dict[int, StepLaunched] = {}  # launched, no row yet (it has neither waited nor finished)
    many = len(run.scenario.permutations) > 1

    def add(entry: Entry) -> int:
        entry.locks = locks
        section.entries.append(entry)
        return len(section.entries) - 1

    def show_running(besides: int | None = None, session: str | None = None) -> None:
        """Steps still running when another session's step ends get their row first: where they started."""
        for seq in sorted(unshown):
            if seq != besides and unshown[seq].session != session:
                step = unshown.pop(seq)
                paused[seq] = section.entries[
                    add(Entry("step", step.session, seq, step.step, step.sql, _note(run, step.step)))
                ]

    for event in run.events:
        if isinstance(event, PermutationStarted):
            section = Section(f"permutation {event.index + 1}: {' '.join(event.steps)}" if many else "")
            sections.append(section)
            locks = ()
            predicate = ()
            open_spans = {}
        elif isinstance(event, StepLaunched):
            launched[event.seq] = event
            if run.scenario.step(event.step).sleep is not None:  # its row when it starts: others act during it
                paused[event.seq] = section.entries[
                    add(Entry("step", event.session, event.seq, event.step, event.sql, _note(run, event.step)))
                ]
            else:
                unshown[event.seq] = event
        elif isinstance(event, StepFinished) and event.seq in paused and not event.after_wait:
            paused[event.seq].outcome = event.outcome
        elif isinstance(event, StepWaiting) and event.seq in paused:  # a long step that began to wait
            entry = paused[event.seq]
            entry.waits, entry.by_marker = event.waits, event.by_marker
            if not event.by_marker:
                span = WaitSpan(event.seq, entry.session, section.entries.index(entry), None, event.waits)
                section.spans.append(span)
                open_spans[event.seq] = span
        elif isinstance(event, StepWaiting):
            unshown.pop(event.seq, None)
            step = launched[event.seq]
            index = add(
                Entry(
                    "step",
                    step.session,
                    event.seq,
                    step.step,
                    step.sql,
                    _note(run, step.step),
                    waits=event.waits,
                    by_marker=event.by_marker,
                )
            )
            if not event.by_marker:
                span = WaitSpan(event.seq, step.session, index, None, event.waits)
                section.spans.append(span)
                open_spans[event.seq] = span
        elif isinstance(event, StepFinished):
            show_running(besides=event.seq)
            unshown.pop(event.seq, None)
            step = launched[event.seq]
            sireads = predicate if _serialization_failure(event.outcome) else None
            if event.after_wait:
                index = add(
                    Entry(
                        "resume",
                        step.session,
                        event.seq,
                        step.step,
                        step.sql,
                        outcome=event.outcome,
                        released_by=event.released_by,
                        release=event.release,
                        release_text=release_phrase(event.seq, event.release, launched, sql_limit=24),
                        sireads=sireads,
                    )
                )
                resumed = open_spans.pop(event.seq, None)
                if resumed is not None:
                    resumed.end = index
                    resumed.steps_waited = steps_waited(event.seq, event.release, max(launched))
            else:
                add(
                    Entry(
                        "step",
                        step.session,
                        event.seq,
                        step.step,
                        step.sql,
                        _note(run, step.step),
                        outcome=event.outcome,
                        sireads=sireads,
                    )
                )
        elif isinstance(event, StepCancelled):
            show_running(besides=event.seq)
            step = launched[event.seq]
            text = f"cancelled after {event.after_s:g} s ({cancel_text(event)})"
            index = add(Entry("cancel", step.session, event.seq, step.step, text=text))
            cancelled = open_spans.get(event.seq)
            if cancelled is not None and cancelled.end is None:
                cancelled.end = index
        elif isinstance(event, SessionLost):
            show_running(session=event.session)
            add(Entry("lost", event.session, event.during_seq, text=lost_text(event)))
        elif isinstance(event, NoticeReceived):
            show_running(session=event.session)
            add(Entry("notice", event.session, text=f"{event.severity}: {event.message}"))
        elif isinstance(event, NotifyReceived):
            show_running(session=event.session)
            add(Entry("notice", event.session, text=f'NOTIFY "{event.channel}" "{event.payload}" from {event.sender}'))
        elif isinstance(event, LocksObserved):
            locks = shown_locks(run, event)
            predicate = tuple(lock for lock in event.other_locks if lock.kind == "predicate")
            if section.entries:
                section.entries[-1].locks = locks
    return sections


def _launched(run: Run) -> dict[int, StepLaunched]:
    return {e.seq: e for e in run.events if isinstance(e, StepLaunched)}


def _serialization_failure(outcome: Outcome) -> bool:
    return outcome.error is not None and outcome.error.sqlstate == "40001"


def _note(run: Run, step: str) -> str:
    try:
        return run.scenario.step(step).note
    except KeyError:
        return ""


# -- the story ---------------------------------------------------------------------------


def story_facts(run: Run) -> list[str]:
    """What happened, one sentence per wait, error and cancel: the summary's facts."""
    facts: list[str] = []
    by_seq = {s.seq: s for s in run.step_runs()}
    launched = _launched(run)
    lost = {event.during_seq: event for event in run.sessions_lost() if not event.idle}
    for step in by_seq.values():
        who = f"{step.session}'s {step.step}"
        if step.waited:
            phrases = "; ".join(wait_phrase(w) for w in step.waits) or "waited"
            fact = f"{who} (step {step.seq}) {phrases}"
            if step.outcome is not None:
                fact += f"; it {release_phrase(step.seq, step.release, launched)}"
            facts.append(fact)
        if step.cancelled:
            facts.append(f"{who} (step {step.seq}) never finished and was cancelled")
        elif step.seq in lost:
            gone = lost[step.seq]
            facts.append(
                f"{step.session}'s connection was lost during step {step.seq} ({gone.sqlstate}: {gone.message});"
                " its later steps were not sent"
            )
        elif step.outcome is not None and step.outcome.error is not None and step.outcome.error.sqlstate != "08003":
            error = step.outcome.error  # 08003: not sent after a lost connection, already told above
            fact = f"{who} (step {step.seq}) failed with {error.sqlstate}: {error.message}"
            if error.cycle:
                fact += f" ({'; '.join(error.cycle)})"
            if error.sqlstate == "40001":
                fact += f" ({serialization_text(step.predicate_locks_at_error).removeprefix('⚑ ')})"
            if step.outcome.retry is not None:
                fact += f"; its retry loop ran attempt {step.outcome.retry}"
            facts.append(fact)
    for gone in (event for event in run.sessions_lost() if event.idle):  # no step of its own carries it
        facts.append(
            f"the server ended {gone.session}'s connection while it ran nothing, found after step"
            f" {gone.during_seq} ({gone.sqlstate}: {gone.message})"
        )
    if not facts:
        facts.append("no step waited and none failed")
    return facts


def verdict_line(run: Run) -> str:
    stopped = setup_failure(run)
    return f"not run: {stopped}" if stopped else verdict_words(run.checks)


def setup_failure(run: Run) -> str | None:
    """Why the steps never ran, when the setup failed: no expectation was checked, none held or failed."""
    event = run.failed_setup()
    if event is None or event.outcome.error is None:
        return None
    where = f"session {event.session}'s setup" if event.session else "the setup"
    return f"{where} failed ({event.outcome.error.sqlstate}: {event.outcome.error.message})"


def verdict_words(checks: Sequence[CheckResult]) -> str:
    """``✔ all 3 expectations held``, ``✔ 1 expectation held``, ``✘ 1 of 3 expectations did not hold``."""
    failed = [c for c in checks if not c.ok]
    if not checks:
        return "no expectations to check"
    if failed:
        return f"✘ {len(failed)} of {plural(len(checks), 'expectation')} did not hold"
    if len(checks) == 1:
        return "✔ 1 expectation held"
    return f"✔ all {len(checks)} expectations held"


def variant_flag(variant: str) -> str:
    return "--fix" if variant == "fix" else "--bug"


# -- steps side by side ------------------------------------------------------------------


@dataclass(frozen=True)
class StepSummary:
    """One launched step in a single cell: its SQL, then how it went (wait, result)."""

    seq: int
    session: str
    step: str
    sql: str
    note: str
    lines: tuple[str, ...]
    waited: bool
    failed: bool


def step_summaries(run: Run) -> list[StepSummary]:
    """Every launched step in launch order, folded: what a comparison lines up by position."""
    summaries: list[StepSummary] = []
    by_seq = {s.seq: s for s in run.step_runs()}
    launched = _launched(run)
    for step in by_seq.values():
        lines: list[str] = []
        if step.waited:
            lines += [describe_wait(w) for w in step.waits]
            if step.outcome is not None:
                lines.append(f"↳ {release_phrase(step.seq, step.release, launched, sql_limit=24)}")
        if step.cancelled:
            lines.append("⌛ cancelled: it could not finish")
        if step.outcome is not None:
            lines += outcome_lines(step.outcome)
            if _serialization_failure(step.outcome):
                lines.append(serialization_text(step.predicate_locks_at_error))
        summaries.append(
            StepSummary(
                step.seq,
                step.session,
                step.step,
                step.sql,
                _note(run, step.step),
                tuple(lines),
                step.waited,
                step.status in ("error", "cancelled"),
            )
        )
    return summaries


def same_sessions(columns: list[list[StepSummary]]) -> bool:
    """Whether step N is sent by the same session in every variant, for every N both have."""
    return all(len({column[i].session for column in columns if i < len(column)}) == 1 for i in range(rows(columns)))


def rows(columns: list[list[StepSummary]]) -> int:
    return max((len(c) for c in columns), default=0)
