"""Print a run exactly as PostgreSQL's isolationtester prints it.

The output is compared byte for byte with upstream ``expected/*.out`` files, so every
space counts: see section 3 of ``ISOLATIONTESTER.md`` in the isolation corpus. Lines
that isolationtester writes to stderr (the unused-step warnings, teardown failures)
are included too, where ``pg_isolation_regress`` would merge them into the results.
"""

from __future__ import annotations

from pgrace.frontends.spec import unused_steps
from pgrace.model.timeline import (
    Event,
    NoticeReceived,
    NotifyReceived,
    Outcome,
    PermutationStarted,
    ResultSet,
    Run,
    SetupRan,
    SqlError,
    StepCancelled,
    StepFinished,
    StepLaunched,
    StepWaiting,
)

NUMERIC_CHARS = frozenset("0123456789.Ee -")
DIGITS = frozenset("0123456789")
NO_CONNECTION = "no connection to the server"  # libpq's words for a query on a lost connection


def render_isolation(run: Run) -> str:
    """The complete isolationtester output for ``run``."""
    out = [f"unused step name: {name}\n" for name in unused_steps(run.scenario)]
    out.append(f"Parsed test spec with {len(run.scenario.sessions)} sessions\n")
    launched: dict[int, StepLaunched] = {}
    reported_waiting: set[int] = set()
    for event in run.events:
        if isinstance(event, StepFinished) and _not_sent(event):
            # isolationtester cannot send on a lost connection: it says so and exits.
            out.append(f"failed to send query for step {launched[event.seq].step}: {NO_CONNECTION}\n\n")
            break
        if isinstance(event, StepLaunched):
            launched[event.seq] = event
        elif isinstance(event, StepWaiting):
            if event.seq in reported_waiting:
                continue  # isolationtester says "<waiting ...>" once per launch
            reported_waiting.add(event.seq)
        out.append(_render_event(event, launched))
    return "".join(out)


def _not_sent(event: StepFinished) -> bool:
    """The runner did not send the step: its session's connection was already lost (08003)."""
    return event.outcome.error is not None and event.outcome.error.sqlstate == "08003"


def _render_event(event: Event, launched: dict[int, StepLaunched]) -> str:
    if isinstance(event, PermutationStarted):
        return "\nstarting permutation:" + "".join(f" {s}" for s in event.steps) + "\n"
    if isinstance(event, SetupRan):
        return _render_setup(event)
    if isinstance(event, StepWaiting):
        step = launched[event.seq]
        return f"step {step.step}: {step.sql} <waiting ...>\n"
    if isinstance(event, StepFinished):
        step = launched[event.seq]
        header = "<... completed>" if event.after_wait else step.sql
        return f"step {step.step}: {header}\n" + _render_outcome(event.outcome)
    if isinstance(event, StepCancelled):
        step = launched[event.seq]
        seconds = int(event.after_s)
        return f"isolationtester: canceling step {step.step} after {seconds} seconds\n"
    if isinstance(event, NoticeReceived):
        return f"{event.session}: {event.severity}:  {event.message}\n"
    if isinstance(event, NotifyReceived):
        return f'{event.session}: NOTIFY "{event.channel}" with payload "{event.payload}" from {event.sender}\n'
    return ""  # StepLaunched, LocksObserved, CheckQueried, SessionLost: nothing to print (the step shows the FATAL)


def _render_outcome(outcome: Outcome) -> str:
    """Every result table in order, then the error (severity and primary text only).

    An error libpq made itself (no fields: a lost connection) is printed whole, plus a
    newline, after the server's error if there was one: isolationtester prints each
    error result it gets that way.
    """
    text = "".join(pqprint(result) for result in outcome.results)
    error = outcome.error
    if error is not None:
        if not (error.libpq and error.libpq == error.text):  # the server said something
            text += f"{error.severity}:  {error.message}\n"
        if error.libpq:
            text += f"{error.libpq}\n"
    return text


def _render_setup(event: SetupRan) -> str:
    """Setup and teardown print their tables bare, with no ``step`` line.

    A failure is reported the way isolationtester reports it on stderr: the text of
    ``PQerrorMessage`` (severity, primary message, DETAIL, HINT and position as libpq
    formats them).
    """
    text = "".join(pqprint(result) for result in event.outcome.results)
    error = event.outcome.error
    if error is not None:
        where: str = event.phase
        if event.session is not None:
            where += f" of session {event.session}"
        text += f"{where} failed: {error.text or _error_message(error)}"
    return text


def _error_message(error: SqlError) -> str:
    text = f"{error.severity}:  {error.message}\n"
    if error.detail:
        text += f"DETAIL:  {error.detail}\n"
    return text


# -- libpq PQprint -----------------------------------------------------------------------


def _byte_len(text: str) -> int:
    """libpq pads by ``strlen``: bytes of the UTF-8 text, not characters."""
    return len(text.encode("utf-8", "replace"))


def _is_numeric(values: list[str]) -> bool:
    """libpq's guess: every non-empty value looks like a number."""
    for value in values:
        if not value:
            continue  # NULL and empty are skipped
        if value[0] in "Ee" or value[-1] not in DIGITS:
            return False
        if not NUMERIC_CHARS.issuperset(value):
            return False
    return True


def pqprint(result: ResultSet) -> str:
    """One result as libpq's ``PQprint`` prints it (header, aligned, ``|`` separator).

    Numeric columns are right-aligned, others left-aligned; every column, the last
    included, is padded to its width in bytes. NULL prints like the empty string. A
    result with no columns prints nothing at all.
    """
    if not result.columns:
        return ""
    rows = [[value or "" for value in row] for row in result.text_rows]
    widths: list[int] = []
    numeric: list[bool] = []
    for index, name in enumerate(result.columns):
        values = [row[index] for row in rows]
        widths.append(max(_byte_len(v) for v in [name, *values]))
        numeric.append(_is_numeric(values))

    def line(cells: list[str]) -> str:
        padded = []
        for cell, width, right in zip(cells, widths, numeric, strict=True):
            padding = " " * (width - _byte_len(cell))
            padded.append(padding + cell if right else cell + padding)
        return "|".join(padded) + "\n"

    text = line(list(result.columns))
    text += "+".join("-" * width for width in widths) + "\n"
    text += "".join(line(row) for row in rows)
    count = len(rows)
    return text + f"({count} row{'' if count == 1 else 's'})\n\n"
