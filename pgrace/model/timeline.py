"""What happened during a run, as typed events in the order they were observed.

The runner appends events; it never prints. Renderers read a :class:`Run` and turn it
into text, JSON, isolationtester output and so on. Events keep the order in which
isolationtester would have *decided* them: a step's :class:`StepFinished` (done at once)
or :class:`StepWaiting` is recorded when its fate is known, so notices that arrived while
it ran come before it, exactly as isolationtester prints them.

Times are milliseconds since the run started. They belong in JSON, never in the text
timeline, which must be byte-stable from run to run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, get_args

from pgrace.model.scenario import RowRef, Scenario
from pgrace.model.words import ReleaseWords, RowKeyWords, RunWords, ServerChoseWords, StepRunWords

WaitKind = Literal["row", "transaction", "relation", "advisory", "virtualxid", "speculative", "other"]
"""What a step waits for: a row, a transaction to end, a table, an advisory lock, a
virtual transaction (CREATE INDEX CONCURRENTLY waiting for older transactions), a
speculative insertion (INSERT ... ON CONFLICT), or another heavyweight lock."""

LockKind = Literal["row", "relation", "advisory", "predicate"]
"""What a session holds: a row (pgrowlocks), a table lock, an advisory lock, or an
SIRead (predicate) lock of a SERIALIZABLE transaction."""

LockKinds = Literal["rows", "all"]
"""Which held locks the locks column shows: row locks only, or every kind."""

ReleaseCause = Literal[
    "step", "deadlock", "lock_timeout", "statement_timeout", "cancel", "step_timeout", "terminated", "unknown"
]
RELEASE_CAUSES: tuple[str, ...] = get_args(ReleaseCause)


@dataclass(frozen=True)
class ResultSet:
    """One result of a statement: the server's text for every cell, and its column types.

    The text is what every renderer shows. Python values (``rows``) are made only when
    something compares or captures them, cell by cell: a cell psycopg cannot load (a
    date in ``DateStyle = Postgres, MDY``, a type it does not know) stays its text.
    """

    columns: tuple[str, ...]
    text_rows: tuple[tuple[str | None, ...], ...]
    types: tuple[int, ...] = ()  # type OIDs, one per column (empty: unknown, every cell stays text)
    command: str = ""

    @cached_property
    def rows(self) -> tuple[tuple[Any, ...], ...]:
        """The cells as Python values where psycopg can load them, else as the server's text."""
        from pgrace.model.values import cell_value  # psycopg's loaders: only when a value is compared

        types = self.types or (0,) * len(self.columns)
        return tuple(
            tuple(cell_value(text, oid) for text, oid in zip(row, types, strict=True)) for row in self.text_rows
        )


@dataclass(frozen=True)
class SqlError:
    """A server error as data; classify by ``sqlstate``, never by message text."""

    sqlstate: str
    message: str
    severity: str = "ERROR"
    detail: str | None = None
    cycle: tuple[str, ...] = ()
    """A deadlock (40P01): who waited for whom, in session names, the victim first.

    Filled by the runner from the DETAIL, whose pids and xids change from run to run
    and so never reach the text timeline.
    """
    text: str = ""
    """libpq's whole message (``PQresultErrorMessage``: DETAIL, HINT, position included).

    isolationtester prints it for a failed setup or teardown.
    """
    libpq: str = ""
    """What libpq reported itself after the server's error, verbatim: e.g. "server closed the
    connection unexpectedly ..." once a FATAL ended the session. isolationtester prints it too."""


@dataclass(frozen=True)
class Outcome:
    """Everything one step's SQL produced: every tuple result, command tags, the error."""

    results: tuple[ResultSet, ...] = ()
    commands: tuple[str, ...] = ()
    error: SqlError | None = None
    retry: int | None = None  # the error made the step's retry loop run again: this attempt follows

    @property
    def last_rows(self) -> ResultSet | None:
        return self.results[-1] if self.results else None


@dataclass(frozen=True)
class AdvisoryKey:
    """An advisory lock's key as the server stores it: one bigint, or two int4 keys."""

    keys: tuple[int, ...]
    shared: bool
    level: Literal["session", "transaction"] | None = None  # None: the server did not say

    def __str__(self) -> str:
        return str(self.keys[0]) if len(self.keys) == 1 else "(" + ", ".join(str(k) for k in self.keys) + ")"


@dataclass(frozen=True)
class HeldLock(RowKeyWords):
    """A lock held by a session: a row lock from pgrowlocks, or (``kind``) another kind from pg_locks.

    A table, advisory or SIRead lock has ``row`` None and ``ctid`` "" (a predicate lock on
    a tuple keeps its ctid and row).
    """

    row: RowRef | None  # None when the row's key could not be read
    ctid: str
    table: str
    session: str  # a scenario session, or "pid N" for an outsider
    mode: str  # rows: "FOR UPDATE", ..., "UPDATE"; tables: "AccessShareLock", ...; "SIReadLock"
    kind: LockKind = "row"
    advisory: AdvisoryKey | None = None
    granularity: Literal["relation", "page", "tuple"] | None = None  # a predicate lock's target
    page: int | None = None

    def describe_row(self) -> str:
        """What is locked, named as a person would: ``jobs id=1``, ``table jobs``, ``advisory 42``."""
        if self.kind == "relation":
            return f"table {self.table}"
        if self.kind == "advisory":
            return f"advisory {self.advisory}"
        if self.kind == "predicate" and self.granularity != "tuple":
            return self.table if self.granularity == "relation" else f"{self.table} page {self.page}"
        return str(self.row) if self.row is not None else f"{self.table} ctid={self.ctid}"

    def describe_mode(self) -> str:
        """The mode as shown next to the lock: row strength, table mode, shared/exclusive."""
        if self.kind == "advisory" and self.advisory is not None:
            level = f", {self.advisory.level}" if self.advisory.level else ""
            return ("shared" if self.advisory.shared else "exclusive") + level
        if self.kind == "predicate":
            return "SIRead"
        return self.mode

    def label(self) -> str:
        """``s1: table jobs AccessShareLock``; an SIRead lock reads ``a: SIRead doctors``."""
        if self.kind == "predicate":
            return f"{self.session}: SIRead {self.describe_row()}"
        return f"{self.session}: {self.describe_row()} {self.describe_mode()}"


@dataclass(frozen=True)
class WaitLink:
    """One link of a wait chain: ``waiter`` is held up by ``session``.

    ``how`` is "holds" when ``session`` holds a granted lock whose mode conflicts with
    the one ``waiter`` wants (hard blocking), "queued" when ``session`` only waits ahead
    of it in the lock's queue for a conflicting mode (soft blocking). ``mode`` is the
    mode ``session`` holds or wants; ``wants`` the mode ``waiter`` asked for.
    """

    waiter: str
    session: str
    how: Literal["holds", "queued"]
    mode: str | None = None
    wants: str | None = None


@dataclass(frozen=True)
class Wait(RowKeyWords):
    """Why a step is blocked: one heavyweight-lock wait, attributed to sessions and a row.

    ``blocked_by`` is what ``pg_blocking_pids`` says (the next link of the chain);
    ``holder`` is the session that holds the row itself (the end of the chain), which
    differs from ``blocked_by`` when the step is queued behind another waiter.
    ``chain`` spells the whole way out, link by link, from this step to the holder.
    """

    kind: WaitKind
    blocked_by: tuple[str, ...]
    mode: str | None = None
    row: RowRef | None = None
    ctid: str | None = None
    table: str | None = None
    holder: str | None = None
    holder_mode: str | None = None
    queued_behind: tuple[str, ...] = ()
    lock_type: str = ""
    detail: str = ""
    chain: tuple[WaitLink, ...] = ()
    advisory: AdvisoryKey | None = None
    unique_indexes: tuple[str, ...] = ()
    """A transaction wait of an insert into a unique index: the index, or every candidate.

    The server does not say which unique index an insert waits on; these are the unique
    indexes of the table both transactions wrote to. One name is the index; several are
    candidates, never a guess. The key is never shown (only a 23505 error names it).
    """
    reason: str = ""  # what the server says the waiter is doing (e.g. "waiting for old snapshots")


@dataclass(frozen=True)
class PermutationStarted:
    index: int
    steps: tuple[str, ...]
    t: float


@dataclass(frozen=True)
class SetupRan:
    """Global or session setup/teardown SQL ran (isolationtester prints its last result)."""

    phase: Literal["setup", "teardown"]
    session: str | None
    outcome: Outcome
    t: float


@dataclass(frozen=True)
class StepLaunched:
    seq: int
    step: str
    session: str
    sql: str
    t: float


@dataclass(frozen=True)
class StepWaiting:
    """The step is blocked (seen by the server) or held back by a completion marker."""

    seq: int
    waits: tuple[Wait, ...]
    t: float
    by_marker: bool = False


@dataclass(frozen=True)
class Holder:
    """A session that others waited for when a step was cancelled, and why it held on.

    A wait graph alone says "b waits for a"; the diagnosis is what *a* was doing: idle
    in its transaction until a later step (the scenario's order makes the wait
    endless), with no step left, or still running one.
    """

    session: str
    state: str  # pg_stat_activity.state: "idle in transaction", "active", ... ("" if unknown)
    running: str | None = None  # the step it was running, if any
    next_step: str | None = None  # its next step in the permutation, not sent yet
    next_sql: str = ""


@dataclass(frozen=True)
class StepCancelled:
    """The step timed out; pgrace sent a cancel request. ``graph`` is who waited on whom.

    ``holders`` describes each session waited for that was not itself waiting.
    """

    seq: int
    after_s: float
    graph: tuple[tuple[str, tuple[str, ...]], ...]
    t: float
    holders: tuple[Holder, ...] = ()


@dataclass(frozen=True)
class ServerChose(ServerChoseWords):
    """One release woke several waiters and the server, not the scenario, chose which went first.

    Step ``seq`` was woken with step ``winner_seq`` (of session ``winner``) when step
    ``released_by`` ended the transaction both waited for; the winner went first and
    ``seq`` now waits for it (``waits``). The scenario's next step of ``seq``'s session
    needed it finished: that session's steps are held back until it is, the others go on.
    """

    seq: int
    winner_seq: int
    winner: str
    released_by: int
    waits: tuple[Wait, ...]
    t: float


@dataclass(frozen=True)
class SessionLost:
    """A session's connection is gone (its backend was terminated, or the server died).

    Recorded once, when pgrace first sees it: ``during_seq`` is the step whose outcome
    carries the error. Later steps of the session are not sent. ``sqlstate`` and
    ``message`` are the server's FATAL (57P01 for pg_terminate_backend) when libpq
    received one, else 08006 and libpq's own message. ``idle``: the server ended it while
    it had no statement running (``idle_in_transaction_session_timeout``, a terminate
    from outside): no step's outcome shows the server's message, so this event does.
    """

    session: str
    message: str
    sqlstate: str
    t: float
    during_seq: int
    idle: bool = False


@dataclass(frozen=True)
class Release(ReleaseWords):
    """What ended a wait: one fact every renderer draws from.

    * ``step``: step ``seq`` of ``session`` ended the transaction (or the lock) the
      waiter waited for; ``failed`` when it did so by failing (its transaction aborted).
    * ``deadlock``: the deadlock detector aborted step ``seq``, the victim (which may be
      the step itself).
    * ``lock_timeout`` (55P03), ``statement_timeout`` / ``cancel`` (57014): the
      server ended the waiting statement itself.
    * ``step_timeout``: pgrace's own ``--step-timeout`` cancel.
    * ``terminated``: ``session``'s backend was terminated (the waiter's own, or a holder's),
      during step ``seq`` when pgrace saw it there (a ``crash`` step); ``reason`` is the
      server's own word when no step of the scenario did it (``25P03: terminating
      connection due to idle-in-transaction timeout``).
    * ``unknown``: nothing pgrace saw explains it (a session outside the scenario).
    """

    cause: ReleaseCause
    seq: int | None = None
    session: str | None = None
    failed: bool = False
    reason: str | None = None


@dataclass(frozen=True)
class StepFinished:
    """The step's result is known. ``release`` says what ended its wait, if it waited."""

    seq: int
    outcome: Outcome
    t: float
    after_wait: bool = False
    release: Release | None = None

    @property
    def released_by(self) -> int | None:
        """The step that freed it, when a step did."""
        return _releasing_step(self.release)


@dataclass(frozen=True)
class NoticeReceived:
    session: str
    severity: str
    message: str
    sqlstate: str
    t: float


@dataclass(frozen=True)
class NotifyReceived:
    session: str
    channel: str
    payload: str
    sender: str
    t: float


@dataclass(frozen=True)
class LocksObserved:
    """Row locks held by every session after step ``after_seq`` (None: unknowable).

    ``other_locks`` are the other kinds held at the same moment (tables, advisory and
    SIRead locks), from pg_locks; they are known even when row locks are not.
    """

    after_seq: int
    locks: tuple[HeldLock, ...] | None
    t: float
    skipped: tuple[str, ...] = ()  # tables whose locks could not be read safely
    other_locks: tuple[HeldLock, ...] = ()


@dataclass(frozen=True)
class FootprintObserved:
    """What every session held once step ``after_seq`` was launched and seen done or blocked, for the reduction.

    ``held`` is one ``(session, busy, entries)`` per connected session; an entry is
    ``locktype|database|relation|classid|objid|objsubid|virtualxid|mode|granted|relkind``
    (an index's lock as its table's), ``snapshot`` when the idle session keeps a
    transaction snapshot (REPEATABLE READ or SERIALIZABLE after its first statement, or an
    open cursor), ``rows|table`` when every row of the table its transaction locked or
    changed is named, each by ``row|["table", "FOR ... strength", "(primary key)"]``.
    """

    after_seq: int
    held: tuple[tuple[str, bool, frozenset[str]], ...]
    t: float


@dataclass(frozen=True)
class CheckQueried:
    """A final-state check query ran; its rows are compared by :mod:`pgrace.model.checks`."""

    index: int
    outcome: Outcome
    t: float
    sql: str = ""


Event = (
    PermutationStarted
    | SetupRan
    | StepLaunched
    | StepWaiting
    | StepCancelled
    | ServerChose
    | StepFinished
    | SessionLost
    | NoticeReceived
    | NotifyReceived
    | LocksObserved
    | FootprintObserved
    | CheckQueried
)


@dataclass
class StepRun(StepRunWords):
    """One launched step with everything known about it, folded from the events."""

    seq: int
    permutation: int
    step: str
    session: str
    sql: str
    started_ms: float
    waits: list[Wait] = field(default_factory=list)
    by_marker: bool = False
    wait_detected_ms: float | None = None
    finished_ms: float | None = None
    outcome: Outcome | None = None
    release: Release | None = None
    cancelled: bool = False
    overtaken: list[ServerChose] = field(default_factory=list)  # woken with others, and another went first
    locks_after: tuple[HeldLock, ...] | None = None
    locks_unreadable: tuple[str, ...] = ()  # tables whose row locks could not be read
    other_locks_after: tuple[HeldLock, ...] = ()
    predicate_locks_at_error: tuple[HeldLock, ...] = ()
    """For a serialization failure (40001): the SIRead locks last seen before it, which
    record the reads whose read/write conflicts the server detected."""
    loop: str | None = None  # the retry loop it is in (the loop's last step), and which attempt
    attempt: int = 1
    retried: bool = False
    """A step of a retry loop's attempt that another attempt followed: its error (one the
    loop retries on) is not the run's, and its expectations belong to the last attempt."""

    @property
    def waited(self) -> bool:
        return self.wait_detected_ms is not None and not self.by_marker

    @property
    def released_by(self) -> int | None:
        return _releasing_step(self.release)

    @property
    def status(self) -> Literal["ok", "error", "cancelled", "pending"]:
        if self.cancelled:
            return "cancelled"
        if self.outcome is None:
            return "pending"
        return "error" if self.outcome.error is not None else "ok"

    @property
    def blocked_by(self) -> list[str]:
        seen: list[str] = []
        for wait in self.waits:
            for who in wait.blocked_by:
                if who not in seen:
                    seen.append(who)
        return seen


@dataclass(frozen=True)
class CheckResult:
    """One expectation evaluated: its ``description`` as the verdict says it, whether it held (``ok``), ``expected``
    and ``actual`` in words, the ``step`` it is about (None for a final check) and the file's ``line``."""

    description: str
    ok: bool
    expected: str = ""
    actual: str = ""
    step: str | None = None
    line: int | None = None


@dataclass
class Run(RunWords):
    """The record of running one scenario variant on one server."""

    scenario: Scenario
    server_version: str
    server_label: str
    row_locks_available: bool
    events: list[Event] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    lock_kinds: LockKinds = "rows"  # what the locks column shows (JSON always has every kind)

    @property
    def ok(self) -> bool:
        """Every expectation held, and there were some to hold: a run whose setup failed checked none."""
        return self.failed_setup() is None and all(check.ok for check in self.checks)

    def failed_setup(self) -> SetupRan | None:
        """The setup (global or a session's) that failed, when one did: the steps never ran."""
        for event in self.events:
            if isinstance(event, SetupRan) and event.phase == "setup" and event.outcome.error is not None:
                return event
        return None

    def step_runs(self) -> list[StepRun]:
        """Fold the events into one record per launched step, in launch order."""
        runs: dict[int, StepRun] = {}
        permutation = 0
        others: tuple[HeldLock, ...] = ()  # the other kinds of locks last seen
        resumed: list[int] = []  # steps that finished after a wait since the last lock reading: theirs is the next
        for event in self.events:
            if isinstance(event, PermutationStarted):
                permutation = event.index
                others = ()
            elif isinstance(event, StepLaunched):
                runs[event.seq] = StepRun(
                    event.seq,
                    permutation,
                    event.step,
                    event.session,
                    event.sql,
                    event.t,
                )
            elif isinstance(event, StepWaiting):
                run = runs[event.seq]
                run.waits = list(event.waits)
                run.by_marker = event.by_marker
                run.wait_detected_ms = event.t
            elif isinstance(event, StepCancelled):
                runs[event.seq].cancelled = True
            elif isinstance(event, ServerChose):
                runs[event.seq].overtaken.append(event)
            elif isinstance(event, StepFinished):
                run = runs[event.seq]
                run.outcome = event.outcome
                run.finished_ms = event.t
                run.release = event.release
                if event.outcome.error is not None and event.outcome.error.sqlstate == "40001":
                    run.predicate_locks_at_error = tuple(lock for lock in others if lock.kind == "predicate")
                if event.after_wait:
                    resumed.append(event.seq)
            elif isinstance(event, LocksObserved):
                others = event.other_locks
                for seq in dict.fromkeys((event.after_seq, *resumed)):
                    if seq in runs:
                        runs[seq].locks_after = event.locks
                        runs[seq].locks_unreadable = event.skipped
                        runs[seq].other_locks_after = event.other_locks
                resumed = []
        _mark_retried(list(runs.values()), self.scenario)
        return list(runs.values())

    def sessions_lost(self) -> list[SessionLost]:
        """Every session whose connection was lost during the run, in the order seen."""
        return [e for e in self.events if isinstance(e, SessionLost)]

    def check_outcomes(self) -> dict[int, Outcome]:
        return {e.index: e.outcome for e in self.events if isinstance(e, CheckQueried)}


def _mark_retried(runs: list[StepRun], scenario: Scenario) -> None:
    """Mark the steps of every attempt that a later attempt of the same loop followed (per permutation)."""
    steps = {s.name: s for s in scenario.steps}
    last: dict[tuple[int, str], int] = {}  # (permutation, loop) -> its latest attempt that ran
    for run in runs:
        step = steps.get(run.step)
        if step is not None and step.loop is not None:
            run.loop, run.attempt = step.loop, step.attempt
            key = (run.permutation, step.loop)
            last[key] = max(last.get(key, 1), step.attempt)
    for run in runs:
        step = steps.get(run.step)
        if step is not None and step.loop is not None:
            run.retried = step.attempt < last[(run.permutation, step.loop)]


def _releasing_step(release: Release | None) -> int | None:
    """The step that freed the waiter: one that ended a transaction, or a crash step that killed the holder."""
    return release.seq if release is not None and release.cause in ("step", "terminated") else None
