"""The default output: a timeline table with one column per session, then the verdict.

Deterministic by design: no pids, xids or clock times, so the text of a run is
byte-stable and can serve as a golden file. How long a step waited is counted in steps.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

import click
from tabulate import tabulate

from pgrace.model.timeline import (
    CheckQueried,
    CheckResult,
    HeldLock,
    LocksObserved,
    NoticeReceived,
    NotifyReceived,
    PermutationStarted,
    Run,
    ServerChose,
    SessionLost,
    StepCancelled,
    StepFinished,
    StepLaunched,
    StepWaiting,
)
from pgrace.render.common import SESSION_COLOURS, shorten_sql, wrap_cell
from pgrace.render.story import setup_failure, verdict_words
from pgrace.render.wording import (
    cancel_text,
    chosen_text,
    describe_wait,
    locks_heading,
    lost_text,
    outcome_lines,
    plural,
    release_phrase,
    serialization_text,
    shown_locks,
    steps_waited,
)
from pgrace.text import without_controls

DEFAULT_WIDTH = 120


@dataclass(frozen=True)
class Style:
    """Whether to colour, and how wide the whole table may be."""

    colour: bool = False
    width: int = DEFAULT_WIDTH
    show_server: bool = True  # golden files leave it out: the same timeline on every server
    until_server_chose: bool = False  # golden files stop a permutation where the server chose the order


@dataclass
class Row:
    number: str
    session: str
    lines: list[str]
    locks: list[str] = field(default_factory=list)


def render_text(run: Run, style: Style | None = None) -> str:
    """Header, narrative, one table per permutation, final state and verdict."""
    style = style or Style()
    run = without_controls(run)  # the terminal gets pgrace's own escape sequences only
    scenario = run.scenario
    out: list[str] = []
    title = f"{scenario.name} ({scenario.variant}): {scenario.title}"
    out.append(click.style(title, bold=True) if style.colour else title)
    if style.show_server:
        out.append(f"server: {run.server_label or 'PostgreSQL ' + run.server_version}")
    if scenario.narrative:
        out.append("")
        out.extend(textwrap.fill(p, width=min(style.width, 100)) for p in scenario.narrative.split("\n\n"))
    for heading, rows, chose in _permutation_rows(run, style.until_server_chose):
        out.append("")
        if heading:
            out.append(heading)
        out.append(_table(run, rows, style))
        if chose:
            out.append(chose)
    if not run.row_locks_available:
        out.append("")
        out.append("row locks: unknown (pgrowlocks is not installed in the scratch database)")
    out.extend(_final_state(run))
    stopped = setup_failure(run)
    out.extend(["", f"verdict: not run: {stopped}"] if stopped else render_verdict(run.checks, style))
    return "\n".join(out) + "\n"


def _permutation_rows(run: Run, until_server_chose: bool = False) -> list[tuple[str, list[Row], str]]:
    """Fold the events into table rows, one table per permutation, and what the server chose in it.

    ``until_server_chose``: a permutation stops at the step whose end woke the waiters
    the server chose among, so that a golden timeline is the same whichever it chose.
    """
    tables: list[tuple[str, list[Row], str]] = []
    choices = _first_choices(run) if until_server_chose else {}
    choice: ServerChose | None = None
    stopped = False
    launched: dict[int, StepLaunched] = {}
    paused: set[int] = set()  # sleep steps, shown when they start; a long step, when others act during it
    unshown: dict[int, StepLaunched] = {}  # launched, no row yet (it has neither waited nor finished)
    rows: list[Row] = []

    def show_running(besides: int | None = None, session: str | None = None) -> None:
        """Steps still running when another session's step ends get their row first: where they started."""
        for seq in sorted(unshown):
            if seq != besides and unshown[seq].session != session:
                step = unshown.pop(seq)
                rows.append(Row(str(seq), step.session, _sql_lines(run, step)))
                paused.add(seq)

    last_locks: tuple[HeldLock, ...] | None = ()
    predicate: tuple[HeldLock, ...] = ()  # SIRead locks last seen: what a 40001 is explained by
    many = len(run.scenario.permutations) > 1
    for event in run.events:
        if isinstance(event, PermutationStarted):
            rows = []
            heading = f"permutation {event.index + 1}: {' '.join(event.steps)}" if many else ""
            choice, stopped = choices.get(len(tables)), False
            tables.append((heading, rows, ""))
            last_locks = ()
            predicate = ()
        elif stopped:
            continue
        elif choice is not None and isinstance(event, StepFinished) and event.seq in (choice.seq, choice.winner_seq):
            stopped = True  # a chosen waiter's end came before the releasing step's own row
            tables[-1] = (tables[-1][0], rows, _chose_text(choice, launched))
            continue
        elif isinstance(event, StepLaunched):
            launched[event.seq] = event
            if run.scenario.step(event.step).sleep is not None:  # its row when it starts: others act during it
                rows.append(Row(str(event.seq), event.session, _sql_lines(run, event)))
                paused.add(event.seq)
            else:
                unshown[event.seq] = event
        elif isinstance(event, StepFinished) and event.seq in paused and not event.after_wait:
            if lines := outcome_lines(event.outcome):
                rows.append(Row("", launched[event.seq].session, lines))
        elif isinstance(event, StepWaiting):
            step = launched[event.seq]
            shown_already = event.seq in paused
            unshown.pop(event.seq, None)
            lines = [] if shown_already else _sql_lines(run, step)
            lines += [describe_wait(w) for w in event.waits]
            if event.by_marker:
                lines.append("… reported later (completion marker)")
            rows.append(Row("" if shown_already else str(event.seq), step.session, lines))
        elif isinstance(event, StepFinished):
            show_running(besides=event.seq)
            unshown.pop(event.seq, None)
            step = launched[event.seq]
            lines = [_released(event, launched)] if event.after_wait else _sql_lines(run, step)
            lines += outcome_lines(event.outcome)
            if event.outcome.error is not None and event.outcome.error.sqlstate == "40001":
                lines.append(serialization_text(predicate))
            rows.append(Row("" if event.after_wait else str(event.seq), step.session, lines))
            if choice is not None and event.seq == choice.released_by:
                stopped = True
                tables[-1] = (tables[-1][0], rows, _chose_text(choice, launched))
        elif isinstance(event, StepCancelled):
            show_running(besides=event.seq)
            step = launched[event.seq]
            text = f"⌛ {step.step} cancelled after {event.after_s:g} s ({cancel_text(event)})"
            rows.append(Row("", step.session, [text]))
        elif isinstance(event, ServerChose):
            rows.append(Row("", launched[event.seq].session, [chosen_text(event, launched, sql_limit=24)]))
        elif isinstance(event, SessionLost):
            show_running(session=event.session)
            rows.append(Row("", event.session, [lost_text(event)]))
        elif isinstance(event, NoticeReceived):
            show_running(session=event.session)
            rows.append(Row("", event.session, [f"{event.severity}: {event.message}"]))
        elif isinstance(event, NotifyReceived):
            show_running(session=event.session)
            rows.append(Row("", event.session, [f'NOTIFY "{event.channel}" "{event.payload}" from {event.sender}']))
        elif isinstance(event, LocksObserved):
            predicate = tuple(lock for lock in event.other_locks if lock.kind == "predicate")
            shown = shown_locks(run, event)
            if rows and shown != last_locks:
                rows[-1].locks = _lock_lines(event, shown)
                last_locks = shown
    return tables


def _first_choices(run: Run) -> dict[int, ServerChose]:
    """The first choice the server made in each permutation (by its index among the permutations run)."""
    found: dict[int, ServerChose] = {}
    index = -1
    for event in run.events:
        if isinstance(event, PermutationStarted):
            index += 1
        elif isinstance(event, ServerChose):
            found.setdefault(index, event)
    return found


def _chose_text(choice: ServerChose, launched: dict[int, StepLaunched]) -> str:
    """Where a golden timeline stops: the same words whichever waiter the server let go first."""
    both = {launched[choice.seq].session, choice.winner}
    trigger = launched[choice.released_by]
    return (
        f"⇄ the server chose the order after step {choice.released_by}: {trigger.session}'s"
        f" {shorten_sql(trigger.sql, 24)} woke {' and '.join(sorted(both))} together; the timeline stops here"
    )


def _sql_lines(run: Run, step: StepLaunched) -> list[str]:
    sql = " ".join(step.sql.split()) or "(empty step)"
    lines = [sql]
    note = run.scenario.step(step.step).note
    if note:
        lines.append(f"» {note}")
    return lines


def _released(event: StepFinished, launched: dict[int, StepLaunched]) -> str:
    phrase = release_phrase(event.seq, event.release, launched, sql_limit=24)
    waited = steps_waited(event.seq, event.release, max(launched))
    if not waited:  # ended by the server before another step was launched: no step count to tell
        return f"↳ step {event.seq} {phrase}"
    return f"↳ step {event.seq} {phrase}; waited {plural(waited, 'step')}"


def _lock_lines(event: LocksObserved, shown: tuple[HeldLock, ...] | None) -> list[str]:
    if shown is None:
        return ["unknown (no pgrowlocks)"]
    lines = [lock.label() for lock in shown] or ["none"]
    lines += [f"{table}: unknown (exclusively locked)" for table in event.skipped]
    return lines


def _table(run: Run, rows: list[Row], style: Style) -> str:
    sessions = run.scenario.session_names
    with_locks = run.row_locks_available
    lock_width = (30 if run.lock_kinds == "rows" else 40) if with_locks else 0  # all: "b: advisory (1, 2) shared, …"
    column = max(24, (style.width - 6 - lock_width - 2 * len(sessions)) // max(1, len(sessions)))
    colours = {name: SESSION_COLOURS[i % len(SESSION_COLOURS)] for i, name in enumerate(sessions)}

    def paint(text: str, session: str) -> str:
        if not style.colour:
            return text
        return "\n".join(click.style(line, fg=colours[session]) for line in text.split("\n"))

    table = []
    for row in rows:
        cells: list[str] = [row.number]
        for name in sessions:
            if name == row.session:
                wrapped = [w for line in row.lines for w in wrap_cell(line, column)]
                cells.append(paint("\n".join(wrapped), name))
            else:
                cells.append("")
        if with_locks:
            cells.append("\n".join(w for line in row.locks for w in wrap_cell(line, lock_width, indent="")))
        table.append(cells)
    title = locks_heading(run)
    headers = ["#"] + [paint(name, name) for name in sessions] + ([title] if with_locks else [])
    return tabulate(table, headers=headers, tablefmt="simple", disable_numparse=True)


def _final_state(run: Run) -> list[str]:
    queried = [e for e in run.events if isinstance(e, CheckQueried)]
    if not queried:
        return []
    lines = ["", "final state:"]
    for event in queried:
        got = "; ".join(outcome_lines(event.outcome)) or "→ nothing"
        lines.append(f"  {' '.join(event.sql.split())}  {got}")
    return lines


def render_verdict(checks: list[CheckResult], style: Style) -> list[str]:
    if not checks:
        return ["", "verdict: no expectations to check"]
    failed = [c for c in checks if not c.ok]
    head = f"verdict: {verdict_words(checks)}"
    if style.colour:
        head = click.style(head, fg="red" if failed else "green", bold=True)
    lines = ["", head]
    for check in checks:
        mark = "✔" if check.ok else "✘"
        line = f"  {mark} {check.description}"
        if not check.ok:
            line += f": expected {check.expected}, got {check.actual}"
        lines.append(line)
    return lines
