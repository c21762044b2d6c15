"""The JSON's words for a run's facts, as read-only properties of the Python objects.

``pgrace run -f json`` says ``name``, ``waited_on``, ``key``, ``rows``; a script reading a
:class:`~pgrace.model.timeline.Run` reaches for the same words. These mixins give the
timeline's classes those names beside their own (docs/python.md, "What a run holds"), so
that one vocabulary serves both; tests/test_python_vocabulary.py checks every word.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pgrace.errors import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from pgrace.model.scenario import RowRef
    from pgrace.model.timeline import Outcome, ServerChose, SqlError, StepRun, Wait

__all__ = ["ReleaseWords", "RowKeyWords", "RunWords", "ServerChoseWords", "StepRunWords"]


class RowKeyWords:
    """A wait's or a held lock's ``key``."""

    row: RowRef | None

    @property
    def key(self) -> dict[str, Any] | None:
        """The row's primary key, ``{column: value}``; None but for a row."""
        return self.row.key_dict() if self.row is not None else None


class ReleaseWords:
    seq: int | None

    @property
    def step(self) -> int | None:
        """``seq``: the number of the step that released the wait."""
        return self.seq


class ServerChoseWords:
    winner_seq: int
    winner: str
    released_by: int
    waits: tuple[Wait, ...]
    t: float

    @property
    def went_first(self) -> int:
        return self.winner_seq

    @property
    def session(self) -> str:
        return self.winner

    @property
    def woken_by(self) -> int:
        return self.released_by

    @property
    def waits_on(self) -> tuple[Wait, ...]:
        return self.waits

    @property
    def detected_ms(self) -> float:
        return self.t


class StepRunWords:
    """``name`` is ``step``, ``index`` is ``seq``, and so on."""

    step: str
    seq: int
    loop: str | None
    waits: list[Wait]
    outcome: Outcome | None
    overtaken: list[ServerChose]

    @property
    def name(self) -> str:
        """The step's name (``claim.worker2``; ``bob-commit#2`` for a retry's second attempt)."""
        return self.step

    @property
    def index(self) -> int:
        """Its launch number in the run, from 1: the ``#`` column of the text timeline."""
        return self.seq

    @property
    def retry_loop(self) -> str | None:
        """The retry loop it is an attempt of (the loop's last step), or None."""
        return self.loop

    @property
    def waited_on(self) -> tuple[Wait, ...]:
        """What it waited for, one ``Wait`` per lock."""
        return tuple(self.waits)

    @property
    def server_chose(self) -> tuple[ServerChose, ...]:
        """Each time a release woke it with another step and the server let the other go first."""
        return tuple(self.overtaken)

    @property
    def error(self) -> SqlError | None:
        """The server's error, with its ``sqlstate``, or None."""
        return self.outcome.error if self.outcome is not None else None

    @property
    def columns(self) -> tuple[str, ...] | None:
        """The columns of its last result, or None when it returned no rows."""
        last = self.outcome.last_rows if self.outcome is not None else None
        return last.columns if last is not None else None

    @property
    def rows(self) -> tuple[tuple[Any, ...], ...] | None:
        """The rows of its last result as Python values (the server's text where psycopg cannot load a cell)."""
        last = self.outcome.last_rows if self.outcome is not None else None
        return last.rows if last is not None else None

    @property
    def commands(self) -> tuple[str, ...]:
        """The command tags, one per statement (``UPDATE 1``)."""
        return self.outcome.commands if self.outcome is not None else ()


class RunWords:
    server_label: str

    if TYPE_CHECKING:

        @property
        def ok(self) -> bool: ...

        def step_runs(self) -> list[StepRun]: ...

    @property
    def exit_code(self) -> int:
        """What ``pgrace run`` exits with for it, as every command's result says: 0 when ``ok``, else 1."""
        return EXIT_OK if self.ok else EXIT_FAILED

    @property
    def steps(self) -> list[StepRun]:
        """Each launched step, in launch order (``step_runs()`` folds them anew)."""
        return self.step_runs()

    @property
    def server(self) -> str:
        """The server it ran on, as safe to print."""
        return self.server_label
