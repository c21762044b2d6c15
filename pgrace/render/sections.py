"""The run folded into drawable rows (steps, resumes, cancels, notices).

Each row carries the row locks held after it, and each wait its span, so that every
picture draws the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pgrace.model.timeline import (
    HeldLock,
    LocksObserved,
    NoticeReceived,
    NotifyReceived,
    Outcome,
    PermutationStarted,
    Release,
    Run,
    ServerChose,
    SessionLost,
    StepCancelled,
    StepFinished,
    StepLaunched,
    StepWaiting,
    Wait,
)
from pgrace.render.wording import (
    cancel_text,
    chosen_text,
    lost_text,
    outcome_lines,
    release_phrase,
    serialization_text,
    shown_locks,
    steps_waited,
)

EntryKind = Literal["step", "resume", "cancel", "chosen", "notice", "lost"]


@dataclass
class LaneEntry:
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
    locks: tuple[HeldLock, ...] | None = ()  # row locks held after this row (carried forward)
    sireads: tuple[HeldLock, ...] | None = None  # a 40001: the SIRead locks last seen before it

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
    entries: list[LaneEntry] = field(default_factory=list)
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
    locks: tuple[HeldLock, ...] | None = ()
    predicate: tuple[HeldLock, ...] = ()  # SIRead locks last seen, for a 40001
    open_spans: dict[int, WaitSpan] = {}
    paused: dict[int, LaneEntry] = {}  # sleep steps, shown when they start; a long step, when others act during it
    unshown: dict[int, StepLaunched] = {}  # launched, no row yet (it has neither waited nor finished)
    many = len(run.scenario.permutations) > 1

    def add(entry: LaneEntry) -> int:
        entry.locks = locks
        section.entries.append(entry)
        return len(section.entries) - 1

    def step_row(
        step: StepLaunched,
        waits: tuple[Wait, ...] = (),
        by_marker: bool = False,
        outcome: Outcome | None = None,
        sireads: tuple[HeldLock, ...] | None = None,
    ) -> LaneEntry:
        """A launched step's own row: its SQL, with the scenario's note on the step."""
        return LaneEntry(
            "step",
            step.session,
            step.seq,
            step.step,
            step.sql,
            step_note(run, step.step),
            waits=waits,
            by_marker=by_marker,
            outcome=outcome,
            sireads=sireads,
        )

    def show_running(besides: int | None = None, session: str | None = None) -> None:
        """Steps still running when another session's step ends get their row first: where they started."""
        for seq in sorted(unshown):
            if seq != besides and unshown[seq].session != session:
                step = unshown.pop(seq)
                paused[seq] = section.entries[add(step_row(step))]

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
                paused[event.seq] = section.entries[add(step_row(event))]
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
            index = add(step_row(step, waits=event.waits, by_marker=event.by_marker))
            if not event.by_marker:
                span = WaitSpan(event.seq, step.session, index, None, event.waits)
                section.spans.append(span)
                open_spans[event.seq] = span
        elif isinstance(event, StepFinished):
            show_running(besides=event.seq)
            unshown.pop(event.seq, None)
            step = launched[event.seq]
            sireads = predicate if is_serialization_failure(event.outcome) else None
            if event.after_wait:
                index = add(
                    LaneEntry(
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
                add(step_row(step, outcome=event.outcome, sireads=sireads))
        elif isinstance(event, StepCancelled):
            show_running(besides=event.seq)
            step = launched[event.seq]
            text = f"cancelled after {event.after_s:g} s ({cancel_text(event)})"
            index = add(LaneEntry("cancel", step.session, event.seq, step.step, text=text))
            cancelled = open_spans.get(event.seq)
            if cancelled is not None and cancelled.end is None:
                cancelled.end = index
        elif isinstance(event, ServerChose):
            step = launched[event.seq]
            text = chosen_text(event, launched)
            add(LaneEntry("chosen", step.session, event.seq, step.step, waits=event.waits, text=text))
        elif isinstance(event, SessionLost):
            show_running(session=event.session)
            add(LaneEntry("lost", event.session, event.during_seq, text=lost_text(event)))
        elif isinstance(event, NoticeReceived):
            show_running(session=event.session)
            add(LaneEntry("notice", event.session, text=f"{event.severity}: {event.message}"))
        elif isinstance(event, NotifyReceived):
            show_running(session=event.session)
            add(
                LaneEntry(
                    "notice", event.session, text=f'NOTIFY "{event.channel}" "{event.payload}" from {event.sender}'
                )
            )
        elif isinstance(event, LocksObserved):
            locks = shown_locks(run, event)
            predicate = tuple(lock for lock in event.other_locks if lock.kind == "predicate")
            if section.entries:
                section.entries[-1].locks = locks
    return sections


def launches(run: Run) -> dict[int, StepLaunched]:
    return {e.seq: e for e in run.events if isinstance(e, StepLaunched)}


def is_serialization_failure(outcome: Outcome) -> bool:
    return outcome.error is not None and outcome.error.sqlstate == "40001"


def step_note(run: Run, step: str) -> str:
    try:
        return run.scenario.step(step).note
    except KeyError:
        return ""
