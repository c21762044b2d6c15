"""What ``pgrace from-log`` found: the incidents a server log holds, the scenario written for one, its check.

Reading the logs, writing the scenario and running it are :mod:`pgrace.drivers.fromlog`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pgrace.errors import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from pgrace.model.minimized import Minimized
    from pgrace.model.timeline import Run

__all__ = ["FromLog", "Incident", "Listed", "LoggedStatement", "LoggedWait", "Planned", "Verified", "Written"]


@dataclass
class LoggedStatement:
    """One statement of the reproduction: logged (``line``) or inferred from the report (``why``)."""

    pid: int
    sql: str
    line: int | None = None
    why: str = ""
    xid: str | None = None  # %x on its line: the transaction's xid before it ran ("0": none yet)
    logged_as: str = ""  # its text as the log wrote it: with $1 where the extended protocol bound a value


@dataclass
class LoggedWait:
    """One process waiting for others: what it wanted, where (table, tuple), in which statement."""

    waiter: int
    holders: list[int]
    lock: str
    sql: str = ""
    table: str | None = None
    ctid: str | None = None
    after_ms: float | None = None
    line: int | None = None
    index: str | None = None  # the unique index the wait went through (an INSERT's conflict), when the log says


@dataclass
class Incident:
    """A deadlock or a long lock wait, with everything the log said about its processes."""

    kind: str
    file: str
    line: int
    time: str | None
    database: str | None
    pids: list[int]
    names: dict[int, str]
    waits: list[LoggedWait]
    victim: int | None = None
    steps: list[LoggedStatement] = field(default_factory=list)
    logged: bool = False
    unsaid: list[str] = field(default_factory=list)
    open_before: set[int] = field(default_factory=set)  # in a transaction that had written before the log began

    @property
    def summary(self) -> str:
        who = ", ".join(self.names[p] for p in self.pids)
        tables = sorted({w.table for w in self.waits if w.table})
        on = f" on {', '.join(tables)}" if tables else ""
        when = f" at {self.time}" if self.time else ""
        victim = f" (victim: {self.names[self.victim]})" if self.victim is not None else ""
        return f"{self.file}:{self.line}: {self.kind} of {who}{on}{when}{victim}"


@dataclass(frozen=True, slots=True)
class Listed:
    """An incident as a list of them shows it: a few hundred bytes, where a whole :class:`Incident` is kilobytes.

    A log of 20,000 incidents is listed in bounded memory; ``pgrace.drivers.fromlog.incidents.reread`` gives
    the one written whole.
    """

    kind: str
    file: str
    line: int
    offset: int  # where its report's line starts in the file
    summary: str


@dataclass
class Planned:
    """One step of the written scenario."""

    session: str
    sql: str
    name: str = ""
    note: str = ""
    inferred: bool = False
    expect: dict[str, Any] = field(default_factory=dict)
    pid: int = 0


@dataclass
class Written:
    """The scenario's text, its steps, and the report of what the log did not say."""

    text: str
    name: str
    steps: list[Planned]
    unsaid: list[str]
    victim_step: str | None = None
    wait_steps: dict[str, list[str]] = field(default_factory=dict)
    copied: list[str] = field(default_factory=list)
    """Rows the setup holds from the database ``--dsn`` names, one line per table: to review before sharing."""


@dataclass
class Verified:
    """Whether the incident came back, what did not, and the order that made it when the file's did not."""

    reproduced: bool
    failures: list[str] = field(default_factory=list)
    explored: int = 0
    order: list[str] | None = None
    run: Run | None = None
    out_of_time: float | None = None
    """The limit, in seconds, verification stopped at before it was done; None: it was done in time."""


@dataclass
class FromLog:
    """What ``pgrace from-log`` found: what the logs held, the scenario written for the chosen incident, and whether
    it reproduced."""

    incidents: list[Listed]
    lines: int
    skipped: int = 0
    unreadable: list[str] = field(default_factory=list)
    chosen: int | None = None
    incident: Incident | None = None
    """The chosen incident, read whole: its processes, waits and statements."""
    written: Written | None = None
    verified: Verified | None = None
    not_checked: str | None = None
    """Why the scenario, written, could not be run to check it (its exit code is ``not_checked_exit``)."""
    not_checked_exit: int = 1
    minimized: Minimized | None = None
    """With ``minimize``: the reproduced incident shrunk to the smallest scenario that fails the same way."""
    minimized_text: str | None = None
    """Its TOML (the written file's header first), read back and run: it fails the same way."""
    not_minimized: str | None = None
    """With ``minimize``: why it was not (the incident did not come back, or was not checked)."""

    @property
    def ok(self) -> bool:
        """The incident came back, or nothing was to be checked (a list, ``verify`` off)."""
        return self.exit_code == EXIT_OK

    @property
    def exit_code(self) -> int:
        """``pgrace from-log``'s: ``not_checked_exit`` when the check could not run, 1 when the incident did not
        come back."""
        if self.not_checked is not None:
            return self.not_checked_exit
        return EXIT_FAILED if self.verified is not None and not self.verified.reproduced else EXIT_OK
