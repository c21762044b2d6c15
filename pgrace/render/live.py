"""Live playback for demos: events printed as they happen, in per-session lanes.

The runner calls :meth:`LivePlayer.before_step` before each launch (the pause or the
keypress happens there) and :meth:`LivePlayer.on_event` for every event it records.
Output goes through ``echo`` so tests can capture it; nothing here talks to the server.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable

import click

from pgrace.model import Scenario, Step
from pgrace.render.text import SESSION_COLOURS, Style, _describe_wait, _outcome_lines
from pgrace.timeline import (
    Event,
    NoticeReceived,
    StepCancelled,
    StepFinished,
    StepLaunched,
    StepWaiting,
)


class LivePlayer:
    """Prints each step in its session's lane; paces with a delay or the Enter key."""

    def __init__(
        self,
        scenario: Scenario,
        style: Style,
        pace: float | None = None,
        step_by_step: bool = False,
        echo: Callable[[str], None] = click.echo,
        wait_key: Callable[[], object] = input,
    ) -> None:
        self.scenario = scenario
        self.style = style
        self.pace = pace
        self.step_by_step = step_by_step
        self.echo = echo
        self.wait_key = wait_key
        self.sessions = scenario.session_names
        self.lane = max(24, (style.width - 6) // max(1, len(self.sessions)))
        self.launched: dict[int, StepLaunched] = {}
        self.first = True

    def header(self) -> None:
        self.echo(
            click.style(f"{self.scenario.name} ({self.scenario.variant}): {self.scenario.title}", bold=True)
            if self.style.colour
            else f"{self.scenario.name} ({self.scenario.variant}): {self.scenario.title}"
        )
        if self.scenario.narrative:
            self.echo(textwrap.fill(" ".join(self.scenario.narrative.split()), min(self.style.width, 100)))
        lanes = "".join(self._paint(name.ljust(self.lane), name) for name in self.sessions)
        self.echo("")
        self.echo("      " + lanes)

    def before_step(self, step: Step) -> None:
        if self.first:
            self.header()
            self.first = False
        if self.step_by_step:
            self.echo(
                click.style(f"      ▶ next: {step.session}: {' '.join(step.sql.split())}  [Enter]", dim=True)
                if self.style.colour
                else f"      ▶ next: {step.session}: {' '.join(step.sql.split())}  [Enter]"
            )
            self.wait_key()
        elif self.pace:
            time.sleep(self.pace)  # presentation pacing only; detection never sleeps

    def on_event(self, event: Event) -> None:
        if isinstance(event, StepLaunched):
            self.launched[event.seq] = event
        elif isinstance(event, StepWaiting):
            step = self.launched[event.seq]
            lines = [" ".join(step.sql.split())] + [_describe_wait(w) for w in event.waits]
            self._print(str(event.seq), step.session, lines)
        elif isinstance(event, StepFinished):
            step = self.launched[event.seq]
            head = f"↳ step {event.seq} resumes" if event.after_wait else " ".join(step.sql.split())
            self._print(
                "" if event.after_wait else str(event.seq), step.session, [head, *_outcome_lines(event.outcome)]
            )
        elif isinstance(event, StepCancelled):
            step = self.launched[event.seq]
            self._print("", step.session, [f"⌛ cancelled after {event.after_s:g} s"])
        elif isinstance(event, NoticeReceived):
            self._print("", event.session, [f"{event.severity}: {event.message}"])

    def _print(self, number: str, session: str, lines: list[str]) -> None:
        index = self.sessions.index(session) if session in self.sessions else 0
        indent = " " * (self.lane * index)
        width = max(20, self.lane - 2)
        wrapped = [w for line in lines for w in textwrap.wrap(line, width, subsequent_indent="  ") or [""]]
        for i, line in enumerate(wrapped):
            prefix = f"{number:>4}  " if i == 0 else "      "
            self.echo(prefix + indent + self._paint(line, session))

    def _paint(self, text: str, session: str) -> str:
        if not self.style.colour or session not in self.sessions:
            return text
        colour = SESSION_COLOURS[self.sessions.index(session) % len(SESSION_COLOURS)]
        return click.style(text, fg=colour)
