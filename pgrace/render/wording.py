"""How every renderer words a run: waits and their holders, outcomes, releases, locks, SQL broken at its clauses."""

from __future__ import annotations

from collections.abc import Mapping

from pgrace.model.timeline import (
    HeldLock,
    Holder,
    LocksObserved,
    Outcome,
    Release,
    ResultSet,
    Run,
    ServerChose,
    SessionLost,
    StepCancelled,
    StepLaunched,
    Wait,
    WaitLink,
)
from pgrace.model.values import display_cell
from pgrace.render.common import MAX_ROWS_SHOWN, QUIET_TAGS, one_line, shorten, shorten_sql


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


def _queued_link(wait: Wait, link: WaitLink) -> str:
    return f"{link.session} (wants {_advisory_mode(wait, link.mode)})"


def _advisory_mode(wait: Wait, mode: str | None) -> str:
    """Advisory locks read shared or exclusive."""
    if wait.kind != "advisory":
        return _mode_text(mode)
    return "shared" if mode == "ShareLock" else "exclusive" if mode == "ExclusiveLock" else _mode_text(mode)


def serialization_text(locks: tuple[HeldLock, ...]) -> str:
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


def chosen_text(event: ServerChose, launched: Mapping[int, StepLaunched], sql_limit: int = 30) -> str:
    """A release woke this step and another; the server let the other go first: the same words in every format.

    ``⇄ the server chose: worker3's step 4 went first after worker1's COMMIT (step 8); step 6
    now waits for worker3``. Which row it waits on now is in the JSON: it is timing's, not the scenario's.
    """
    trigger = launched.get(event.released_by)
    after = f"{trigger.session}'s {shorten_sql(trigger.sql, sql_limit)} (step {event.released_by})" if trigger else ""
    woke = f" after {after}" if after else ""
    return (
        f"⇄ the server chose: {event.winner}'s step {event.winner_seq} went first{woke};"
        f" step {event.seq} now waits for {event.winner}"
    )


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


def lock_label(lock: HeldLock) -> str:
    return lock.label()


def shown_locks(run: Run, event: LocksObserved) -> tuple[HeldLock, ...] | None:
    """The locks the locks column shows after ``event``: rows, or (``--locks all``) every kind."""
    if run.lock_kinds == "rows":
        return event.locks
    return (event.locks or ()) + event.other_locks


def locks_heading(run: Run) -> str:
    """The locks column's heading: what :func:`shown_locks` puts in it."""
    return "row locks held" if run.lock_kinds == "rows" else "locks held"
