"""How ``pgrace run`` shows one run: played live by the presenter, or drawn whole once it ended.

The presenter (``--step`` / ``--pace``) draws a text run on the screen as it happens; a run
to a file, or in another format, is drawn at the end, and a run that could not reach its
end shows what ran until then, as isolationtester does. Neither the presenter nor the text
renderer is imported unless the run needs it.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pgrace.errors import ScenarioFailed
from pgrace.render import formats
from pgrace.text import visible

if TYPE_CHECKING:
    from pgrace.cli.terminal.presenter import Presenter
    from pgrace.engine.options import RunOptions
    from pgrace.model.scenario import Scenario
    from pgrace.model.timeline import LockKinds, Run
    from pgrace.render.text import Style


def style_of(color: bool | None, width: int | None, on_terminal: bool) -> Style:
    """``--color`` and ``--width``, or what the terminal (or its absence, and NO_COLOR) says."""
    from pgrace.render.text import Style

    colour = color if color is not None else (on_terminal and "NO_COLOR" not in os.environ)
    return Style(colour=colour, width=width or (shutil.get_terminal_size().columns if on_terminal else 120))


@dataclass
class Playback:
    """One run's display: ``write`` takes the drawn text (the CLI's stdout or ``-o FILE``)."""

    fmt: str
    write: Callable[[str], None]
    output: str | None = None  # the -o FILE, if any: a run to a file is drawn to it even when played live
    color: bool | None = None
    width: int | None = None
    lock_kinds: LockKinds = "rows"
    pace: float | None = None
    step_by_step: bool = False
    chosen: Scenario | None = field(default=None, init=False)
    counterpart: Scenario | None = field(default=None, init=False)  # the other variant: "the cure" or "the bug"
    presenter: Presenter | None = field(default=None, init=False)

    @property
    def live(self) -> bool:
        """``--step`` or ``--pace``: a step at a time, for an audience."""
        return bool(self.step_by_step or self.pace)

    @property
    def to_terminal(self) -> bool:
        return self.output is None and sys.stdout.isatty()

    def style(self) -> Style | None:
        """The text timeline's style; no other format has one (nor imports the text renderer)."""
        return style_of(self.color, self.width, self.to_terminal) if self.fmt == "text" else None

    def start(self, chosen: Scenario, file_scenario: Scenario) -> bool:
        """Get ready to show ``chosen`` (a variant of ``file_scenario``); True when the presenter will play it live."""
        self.chosen = chosen
        self.counterpart = file_scenario.other if chosen is file_scenario else file_scenario
        if self.live and (self.fmt == "text" or self.output is not None):
            from pgrace.cli.terminal.presenter import Presenter

            self.presenter = Presenter(
                chosen,
                style_of(self.color, self.width, sys.stdout.isatty()),
                pace=self.pace,
                step_by_step=self.step_by_step,
                counterpart=self.counterpart,
                lock_kinds=self.lock_kinds,
            )
        return self.presenter is not None

    def options(self, step_timeout: float) -> RunOptions:
        """How to run: the presenter, if any, paces the steps and hears every event."""
        from pgrace.engine.options import RunOptions

        shown = self.presenter
        return RunOptions(
            step_timeout=step_timeout,
            lock_kinds=self.lock_kinds,
            before_step=shown.before_step if shown else None,
            on_event=shown.on_event if shown else None,
            on_idle=shown.on_idle if shown else None,
        )

    @contextmanager
    def playing(self) -> Iterator[None]:
        """Around the run: the presenter's screen; a run that could not reach its end shows what ran until then."""
        try:
            with self.presenter or nullcontext():
                yield
        except ScenarioFailed as failed:
            from pgrace.model.timeline import Run

            # As isolationtester: what ran until then, then why it stopped (on stderr, exit 1).
            if isinstance(failed.run, Run) and self.presenter is None:
                self.show(failed.run)
            raise

    def played(self, result: Run) -> Run:
        """The run, once the presenter (if any) has said how it ended."""
        if self.presenter is not None:
            self.presenter.finish(result)
        return result

    def show(self, result: Run) -> None:
        """Draw the run, unless the presenter has shown it on the screen already."""
        if self.presenter is not None and self.output is None:
            return
        from pgrace.render.views import View

        text = formats.render("run", self.fmt, result, View(self.style(), self.counterpart))
        if self.fmt == "isolation" and self.presenter is None and self.to_terminal:
            text = visible(text)  # isolationtester prints server text raw; a file or a pipe gets it byte for byte
        self.write(text)
