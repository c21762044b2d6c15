"""What `pgrace check` prints as it goes: each case as soon as it is known, above the progress line."""

from __future__ import annotations

from collections.abc import Callable

from pgrace.cli.terminal.progress import Progress
from pgrace.errors import ScenarioError
from pgrace.model.cases import CaseVerdict
from pgrace.render.check import render_invalid, render_results


class CheckStream:
    """Prints each case as soon as it is known, above the progress line, and each file that could not be read.

    ``write`` takes the text (the CLI's stdout); with ``quiet`` only the failures are printed.
    """

    def __init__(self, write: Callable[[str], None], progress: Progress, quiet: bool, with_server: bool) -> None:
        self.write, self.progress, self.quiet, self.with_server = write, progress, quiet, with_server

    def invalid(self, error: ScenarioError) -> None:
        self.write(render_invalid(error))

    def result(self, result: CaseVerdict) -> None:
        if not self.quiet or not result.ok:
            self.progress.pause()  # the line is drawn again below the result
            self.write(render_results([result], with_server=self.with_server))
