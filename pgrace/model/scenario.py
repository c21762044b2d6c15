"""The one scenario model every front end produces and the runner consumes.

A scenario file (pgrace's TOML) and an isolation ``.spec`` file both become a
:class:`Scenario`: plain frozen dataclasses, no behaviour beyond small lookups, so the
runner, the validator and the renderers all agree on what a scenario *is*.

Vocabulary, shared with PostgreSQL's isolationtester:

* a *session* is one connection;
* a *step* is SQL that one session sends (it may hold several statements);
* a *permutation* is the order in which steps are launched. A pgrace scenario has one
  (its steps in file order); a spec may have many.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal

Dialect = Literal["pgrace", "spec"]
CheckKind = Literal["invariant", "bug"]  # a final check's polarity (see FinalCheck)
CrashMode = Literal["terminate", "disconnect"]  # backend terminated by the server, or the client's socket closed


#: PostgreSQL's eight table-level lock modes, weakest first, as pg_locks names them.
LOCK_MODES = (
    "AccessShareLock",
    "RowShareLock",
    "RowExclusiveLock",
    "ShareUpdateExclusiveLock",
    "ShareLock",
    "ShareRowExclusiveLock",
    "ExclusiveLock",
    "AccessExclusiveLock",
)


@dataclass(frozen=True)
class RowRef:
    """A row named by its table and primary key, as a person would name it."""

    table: str
    key: tuple[tuple[str, Any], ...]

    def key_dict(self) -> dict[str, Any]:
        return dict(self.key)

    def __str__(self) -> str:
        return f"{self.table} " + " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in self.key)


@dataclass(frozen=True)
class LockExpectation:
    """One row lock a session should hold after a step (``mode`` None: any mode)."""

    row: RowRef
    session: str
    mode: str | None = None


@dataclass(frozen=True)
class WaitTarget:
    """A wait on something other than one row, as a scenario expects it.

    ``relation``: a table's lock (``mode``, if given, is the mode the step wants, as
    pg_locks names it: ``AccessExclusiveLock``); ``advisory``: an advisory lock's key
    (one bigint or two int4); ``transaction``: the end of ``session``'s transaction;
    ``unique``: an insert waiting for another transaction that wrote the same key of a
    unique index (``index``, if given, must be the index or among its candidates).
    """

    kind: Literal["relation", "advisory", "transaction", "unique"]
    table: str | None = None
    mode: str | None = None
    advisory: tuple[int, ...] = ()
    session: str | None = None
    index: str | None = None

    def __str__(self) -> str:
        if self.kind == "relation":
            return f"table {self.table}" + (f" ({self.mode})" if self.mode else "")
        if self.kind == "advisory":
            return "advisory lock " + (str(self.advisory[0]) if len(self.advisory) == 1 else str(self.advisory))
        if self.kind == "transaction":
            return f"{self.session}'s transaction"
        return "a unique key" + (f" of {self.index}" if self.index else "")


@dataclass(frozen=True)
class StepExpectation:
    """What a scenario author pins about one step; every field None means "not checked".

    ``sqlstate`` is an SQLSTATE, or the empty string for "must not fail"; ``message`` a
    shell-style pattern (``*lock timeout*``) the error's message must match.
    ``deadlock``: the step is a deadlock's victim (40P01), the cycle made of these
    sessions (empty: any cycle).
    ``locks`` is the exact set of row locks held by all sessions after the step.
    ``released_by`` is a session whose step ended the wait, or a cause
    (:data:`pgrace.model.timeline.RELEASE_CAUSES`: ``deadlock``, ``lock_timeout`` ...).
    ``may_fail``: an error of the step is allowed (any SQLSTATE); an error no
    expectation allows fails the verdict. ``allowed``: SQLSTATEs the step may raise,
    asserting nothing (what other orders than the file's keep of its expectations).
    """

    waits: bool | None = None
    waits_for: tuple[str, ...] | None = None
    waits_on: RowRef | WaitTarget | None = None
    sqlstate: str | None = None
    rows: tuple[tuple[Any, ...], ...] | None = None
    locks: tuple[LockExpectation, ...] | None = None
    released_by: str | None = None
    may_fail: bool = False
    message: str | None = None
    deadlock: tuple[str, ...] | None = None
    allowed: tuple[str, ...] = ()

    def allows_error(self, sqlstate: str) -> bool:
        """An error with this SQLSTATE is what the author expects (exactly, "may fail", a message, a deadlock)."""
        return (
            self.may_fail
            or self.sqlstate == sqlstate
            or self.message is not None
            or (self.deadlock is not None and sqlstate == "40P01")
            or sqlstate in self.allowed
        )

    def declarations(self) -> StepExpectation:
        """Only the errors this step may raise, asserting nothing.

        Other orders than the file's do not check what a step does (in another order another
        step waits), but an error the author declared is declared in every order, and one
        not declared is unexpected in every order.
        """
        if self.may_fail or self.message is not None:
            return StepExpectation(may_fail=True)
        codes = [*([self.sqlstate] if self.sqlstate else []), *(["40P01"] if self.deadlock is not None else [])]
        return StepExpectation(allowed=tuple(dict.fromkeys([*codes, *self.allowed])))

    def is_empty(self) -> bool:
        return self == StepExpectation()


#: The most attempts a retry may add: each is a copy of the loop's steps, and explore runs them all.
MAX_RETRIES = 10


@dataclass(frozen=True)
class Retry:
    """The application's own retry loop, as a step's ``retry`` key writes it.

    When a step from ``start`` through the step that has this key fails with one of
    ``on`` (SQLSTATEs), the session rolls back and runs those steps again, at most
    ``max`` more times. ``start`` is the name of the loop's first step in the session.
    """

    on: tuple[str, ...]
    start: str
    max: int
    line: int | None = None


@dataclass(frozen=True)
class Step:
    """SQL one session sends; ``capture`` maps variable names to result columns.

    A step may be an action instead of SQL (``sql`` then only says what it does, for
    the timeline): ``sleep`` pauses the schedule that many seconds while waiting steps
    are still watched; ``crash`` kills the session as a dying worker process would.

    A step in a retry loop names the loop by its last step (``loop``); attempt 2 and
    later of the loop are steps of their own (``attempt`` > 1), named ``NAME#K``, each
    after a ``rollback`` step (``LAST#K-rollback``). The runner sends an attempt only
    when the one before it failed with a listed SQLSTATE (see ``with_retries``).
    """

    name: str
    """The step's name (``claim.worker2`` for a group's member)."""
    session: str
    """The session that sends it."""
    sql: str
    """What it sends; for a ``sleep`` or ``crash`` step, what it does, as the timeline says it."""
    note: str = ""
    """One line shown under the step in the timeline."""
    capture: tuple[tuple[str, str], ...] = ()
    """``(variable, column)`` pairs: the first row's values, kept for later steps."""
    expect: StepExpectation = field(default_factory=StepExpectation)
    """What must happen in the file's order."""
    line: int | None = None
    """Where the file declares it, for messages."""
    sleep: float | None = None
    """Seconds the schedule pauses, for a ``sleep`` step."""
    crash: CrashMode | None = None
    """How the session dies, for a ``crash`` step: ``"terminate"`` or ``"disconnect"``."""
    retry: Retry | None = None
    """On the loop's last step, attempt 1: the loop's definition."""
    loop: str | None = None
    """The last step (attempt 1's name) of the retry loop this step is in."""
    attempt: int = 1
    """Which attempt of its retry loop it is, from 1."""
    rollback: bool = False
    """The ROLLBACK before attempt ``attempt``, sent only if a transaction is open."""
    prepares_only: bool = False
    """A client's step through the proxy that only parses and describes its SQL (a Parse/Describe/Flush prefix):
    it runs nothing, so it reads, writes and locks no row; parsing locks the tables the SQL names."""


def attempt_name(name: str, attempt: int) -> str:
    """``transfer``, ``transfer#2``, ``transfer#3``: '#' is in no name a file can give a step."""
    return name if attempt == 1 else f"{name}#{attempt}"


def with_retries(steps: tuple[Step, ...] | list[Step]) -> tuple[Step, ...]:
    """The step list with every retry loop's extra attempts, each right after the attempt before it.

    A loop's steps are its session's steps from ``retry.start`` through the step with the
    ``retry`` key; the caller has checked that ``start`` is such a step and that loops do
    not overlap. Attempt K (2 ... max + 1) is a ``ROLLBACK`` step and copies of the loop's
    steps named ``NAME#K``, with their captures and expectations; their note says which attempt they are.
    """
    steps = list(steps)
    loops: dict[str, list[Step]] = {}
    sessions: dict[str, list[Step]] = {}
    for step in steps:
        own = sessions.setdefault(step.session, [])
        own.append(step)
        if step.retry is None:
            continue
        first = next(i for i in range(len(own) - 1, -1, -1) if own[i].name == step.retry.start)
        loops[step.name] = own[first:]
    if not loops:
        return tuple(steps)
    member = {s.name: last for last, body in loops.items() for s in body}
    result: list[Step] = []
    for step in steps:
        result.append(replace(step, loop=member.get(step.name)))
        if step.retry is None:
            continue
        for attempt in range(2, step.retry.max + 2):
            result.append(
                Step(
                    name=f"{attempt_name(step.name, attempt)}-rollback",
                    session=step.session,
                    sql="ROLLBACK",
                    note=f"attempt {attempt} begins: attempt {attempt - 1}'s transaction is rolled back",
                    line=step.retry.line,
                    loop=step.name,
                    attempt=attempt,
                    rollback=True,
                )
            )
            result.extend(
                replace(
                    s,
                    name=(name := attempt_name(s.name, attempt)),
                    note=f"attempt {attempt} ({name})",
                    retry=None,
                    loop=step.name,
                    attempt=attempt,
                )
                for s in loops[step.name]
            )
    return tuple(result)


@dataclass(frozen=True)
class CompletionMarker:
    """An isolationtester completion marker: ``(*)``, ``(step)`` or ``(step notices N)``."""

    step: str | None  # None for "*"
    notices: int | None = None

    def __str__(self) -> str:
        if self.step is None:
            return "*"
        return self.step if self.notices is None else f"{self.step} notices {self.notices}"


@dataclass(frozen=True)
class PermutationStep:
    step: str
    blockers: tuple[CompletionMarker, ...] = ()


@dataclass(frozen=True)
class Session:
    """One connection of the scenario: its ``setup`` runs on it before the first step, its ``teardown`` after the last.

    ``line`` is where the file declares it, for messages.
    """

    name: str
    setup: str | None = None
    teardown: str | None = None
    line: int | None = None


@dataclass(frozen=True)
class FinalCheck:
    """A query run on the final state, the rows it must return, and what those rows mean.

    ``kind`` is the check's polarity. An ``"invariant"`` (the default) states what every
    correct outcome keeps: the bug happened where it fails. A ``"bug"`` check is the bug's
    signature, the state only the bug leaves: the bug happened where it holds. Every
    "reproduces the bug" and "holds" follows from it, never from the variant's name.
    """

    description: str
    sql: str
    rows: tuple[tuple[Any, ...], ...]
    line: int | None = None
    kind: CheckKind = "invariant"

    @property
    def is_signature(self) -> bool:
        return self.kind == "bug"


@dataclass(frozen=True)
class LoadCommand:
    """One line of a load worker's transaction, as pgbench will run it.

    ``sql``: a statement (pgrace ``:variables`` as written; ``capture`` becomes pgbench's
    ``\\gset``); ``set``: ``\\set name random(low, high)``; ``sleep``: ``\\sleep``, the simulated work.
    ``step`` names the scenario step the SQL was taken from, if any.
    """

    kind: Literal["sql", "set", "sleep"]
    sql: str = ""
    capture: tuple[tuple[str, str], ...] = ()
    name: str = ""
    low: int = 0
    high: int = 0
    seconds: float = 0.0
    step: str | None = None
    line: int | None = None


@dataclass(frozen=True)
class LoadCheck:
    """An invariant checked after a load run: ``sql`` returns one row ``(expected, actual[, detail])``."""

    description: str
    sql: str
    line: int | None = None


@dataclass(frozen=True)
class Load:
    """A scenario's ``[load]`` section: one worker's transaction, run by pgbench's clients."""

    transaction: tuple[LoadCommand, ...]
    setup: tuple[str, ...] = ()
    checks: tuple[LoadCheck, ...] = ()
    line: int | None = None


@dataclass(frozen=True)
class Command:
    """A command whose connections are sessions (``--exec NAME='COMMAND'``, or an ``[exec]`` entry of a file):
    a shell command line, started once per run."""

    name: str
    line: str
    cwd: str | None = None
    """Its working folder (None: pgrace's); a file's commands run in the file's folder unless they say."""
    env: tuple[tuple[str, str], ...] = ()
    """Variables set for it, besides the ones pgrace points at its proxy."""
    source: str | None = None
    """The file that gave it, and its ``line`` there, for messages (None: the command line)."""
    line_number: int | None = None


def set_by_pgrace(variable: str) -> bool:
    """Whether pgrace sets this variable for a command, to point it at its proxy (libpq's ``PG*``, ``DATABASE_URL``)."""
    return variable == "DATABASE_URL" or variable.startswith("PG")


def merged_commands(base: Sequence[Command], more: Sequence[Command]) -> tuple[Command, ...]:
    """``base`` with ``more`` over it: a command of the same name replaces it in place, a new name is added."""
    given = {c.name: c for c in more}
    return (*(given.pop(c.name, c) for c in base), *given.values())


@dataclass(frozen=True)
class Scenario:
    """A complete, validated scenario for one variant ("bug" or "fix") of one file."""

    name: str
    """The file's ``name`` (by default the file's name without its suffix)."""
    title: str
    """One line that says what the story is."""
    source: str
    """The file it was read from, as messages name it."""
    dialect: Dialect = "pgrace"
    """The front end that read it: ``"pgrace"`` (TOML) or ``"spec"`` (an isolation spec)."""
    narrative: str = ""
    """The story, told under the title."""
    variant: str = "bug"
    """Which of the file's stories this is: ``"bug"`` or ``"fix"``."""
    setup: tuple[str, ...] = ()
    """SQL run on the control connection before the first step (``setup_file``'s schema first)."""
    setup_line: int | None = None
    """The line of ``setup`` in the file, for messages."""
    teardown: tuple[str, ...] = ()
    """SQL run on the control connection after the last step."""
    sessions: tuple[Session, ...] = ()
    """The sessions, in order; each member of a group is one."""
    steps: tuple[Step, ...] = ()
    """The steps in the file's order, retry loops unrolled."""
    permutations: tuple[tuple[PermutationStep, ...], ...] = ()
    """The orders the steps run in: the file's own, or a spec's permutations."""
    checks: tuple[FinalCheck, ...] = ()
    """The final checks, run on the state the steps leave."""
    params: tuple[tuple[str, Any], ...] = ()
    """Each param's value (``-p`` applied), as ``(name, value)`` pairs."""
    param_choices: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Params whose ``:name`` is one of these SQL words."""
    other: Scenario | None = None
    """The other variant: the cure of a bug, or the bug a cure avoids."""
    load: Load | None = None
    """The ``[load]`` section, resolved against this variant's steps."""
    topic: str = ""
    """What the story is about (``"job queue"``, ``"money"``): ``pgrace list`` groups by it."""
    tags: tuple[str, ...] = ()
    """Words to find it by (``pgrace list --tag skip-locked``)."""
    changes: tuple[str, ...] = ()
    """What this variant changes in the file's first one, for ``pgrace show``."""
    commands: tuple[Command, ...] = ()
    """The ``[exec]`` commands: run, explore and check run them as the sessions, instead of the steps."""

    @property
    def session_names(self) -> list[str]:
        return [s.name for s in self.sessions]

    def step(self, name: str) -> Step:
        return self._steps_by_name[name]

    @cached_property
    def _steps_by_name(self) -> dict[str, Step]:
        """Steps by name, built once: the run asks for a step's loop at every step it sends."""
        return {step.name: step for step in reversed(self.steps)}  # the first of a name, as a scan finds

    def retry_of(self, step: Step) -> Retry | None:
        """The retry loop ``step`` belongs to (any attempt), or None."""
        return None if step.loop is None else self.step(step.loop).retry

    @property
    def isolationtester(self) -> bool:
        """Whether it runs with isolationtester's semantics (a spec): its waits and session options, no variables."""
        return self.dialect == "spec"

    @property
    def application_name_prefix(self) -> str:
        """isolationtester's harness names sessions ``isolation/<test>/<s>``; specs rely on it."""
        return "isolation" if self.dialect == "spec" else "pgrace"

    @property
    def variants(self) -> tuple[str, ...]:
        return (self.variant,) if self.other is None else (self.variant, self.other.variant)

    def variant_named(self, variant: str | None) -> Scenario:
        """``None`` is the variant the file tells first; KeyError when it has no such one."""
        if variant is None or variant == self.variant:
            return self
        if self.other is not None and self.other.variant == variant:
            return self.other
        raise KeyError(variant)
