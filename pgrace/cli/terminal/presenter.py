"""Presenter mode: play a run live in front of an audience (``--step`` / ``--pace``).

Made for a projector: lanes per session in bold colours, SQL broken at its clauses, the
scenario's story first and each step's note as it comes, a blocked step shown at once
in reverse video, and a status line at the bottom that keeps counting how long it has
waited (it redraws on the runner's ``on_idle`` tick and while the presenter pauses).
It ends with what went wrong and how the other variant cures it.

Plain ANSI, no curses: it works over ssh and inside tmux. With ``--step`` the keyboard
is put in cbreak mode (no echo, no line editing; restored on exit): Enter or space runs
the next step, ``q`` stops presenting: the rest of the run plays without a pause, and
pgrace ends as the run does (Ctrl-C is the way to stop it). When stdout is not a terminal the
output is plain text: no colours, no status line, keys read line by line.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

import click

from pgrace.cli.terminal.screen import TICK, Keyboard, Screen
from pgrace.model.scenario import Scenario, Step
from pgrace.model.timeline import (
    CheckQueried,
    Event,
    HeldLock,
    LockKinds,
    LocksObserved,
    NoticeReceived,
    NotifyReceived,
    Run,
    ServerChose,
    SessionLost,
    StepCancelled,
    StepFinished,
    StepLaunched,
    StepWaiting,
    Wait,
)
from pgrace.model.variables import FACTS, find
from pgrace.render.common import SESSION_COLOURS, one_line, sql_lines
from pgrace.render.story import story_facts, variant_flag, verdict_line
from pgrace.render.text import Style
from pgrace.render.wording import (
    cancel_text,
    chosen_text,
    describe_wait,
    lock_label,
    lost_text,
    outcome_lines,
    release_phrase,
    serialization_text,
    wait_phrase,
)
from pgrace.text import without_controls

GUTTER = 6


class Presenter:
    """Receives the runner's callbacks (``before_step``, ``on_event``, ``on_idle``) and draws.

    Use it as a context manager around the run so the terminal is restored, then call
    :meth:`finish` with the run for the summary.
    """

    def __init__(
        self,
        scenario: Scenario,
        style: Style,
        *,
        pace: float | None = None,
        step_by_step: bool = False,
        out: TextIO | None = None,
        keys: TextIO | None = None,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        counterpart: Scenario | None = None,
        lock_kinds: LockKinds = "rows",
    ) -> None:
        scenario, counterpart = without_controls((scenario, counterpart))  # the terminal gets our escapes only
        self.scenario = scenario
        self.lock_kinds = lock_kinds
        self.counterpart = counterpart or scenario.other  # a fix variant does not link back to its bug
        self.out = out if out is not None else sys.stdout
        self.keys = keys if keys is not None else sys.stdin
        self.tty = _isatty(self.out) and os.environ.get("TERM") != "dumb" if tty is None else tty
        self.colour = style.colour and self.tty
        self.width = max(40, style.width)
        self.pace = pace
        self.step_by_step = step_by_step
        self.clock = clock
        self.sessions = scenario.session_names
        self.lane = max(20, (self.width - GUTTER) // max(1, len(self.sessions)))
        self.launched: dict[int, StepLaunched] = {}
        self.announced: dict[int, Step] = {}
        self.waiting: dict[int, tuple[str, tuple[Wait, ...], float]] = {}  # seq -> session, waits, since
        self.waited_s: dict[int, float] = {}
        self.prompt = ""
        self.started = False
        self.last_locks: object = ()
        self.predicate: tuple[HeldLock, ...] = ()  # SIRead locks last seen, shown with a 40001
        self.screen = Screen(self.out, tty=self.tty, colour=self.colour, width=self.width, status=self.status_text)
        self.keyboard = Keyboard(self.keys, cbreak=step_by_step)

    # -- terminal ----------------------------------------------------------------------

    def __enter__(self) -> Presenter:
        self.keyboard.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.screen.clear_status()
        self.keyboard.__exit__(kind, value, traceback)
        self.out.flush()

    # -- the runner's callbacks --------------------------------------------------------

    def before_step(self, step: Step) -> None:
        """Announce the step about to run, then wait for Enter or the pace."""
        step = without_controls(step)
        if not self.started:
            self._header()
            self.started = True
        seq = max(self.launched, default=0) + 1
        self.announced[seq] = step
        lines = sql_lines(step.sql, self.lane - 4, max_lines=8)
        if step.note:
            lines += textwrap.wrap(f"» {step.note}", self.lane - 4, subsequent_indent="  ")
        self._lane_print(f"▶ {seq}", step.session, lines, bold=True)
        if self.step_by_step:
            self._wait_for_key(f"▶ next: step {seq} ({step.session}): Enter runs it, q quits")
        elif self.pace:
            self._pause(self.pace)

    def on_event(self, event: Event) -> None:
        event = without_controls(event)
        if isinstance(event, StepLaunched):
            self.launched[event.seq] = event
            step = self.announced.get(event.seq)
            if step is not None and step.sql != event.sql:
                self._lane_print("", event.session, [bound_values(step.sql, event.sql)], dim=True)
        elif isinstance(event, StepWaiting):
            launched = self.launched[event.seq]
            if event.by_marker:
                self._lane_print("", launched.session, ["… reported later (completion marker)"], dim=True)
                return
            self.waiting[event.seq] = (launched.session, event.waits, self.clock())
            blocked = [describe_wait(w) for w in event.waits]  # the text timeline's words
            self._lane_print("", launched.session, blocked or ["⏳ blocked"], alarm=True)
        elif isinstance(event, StepFinished):
            launched = self.launched[event.seq]
            lines: list[str] = []
            if event.after_wait:
                since = self.waiting.pop(event.seq, (None, (), self.clock()))[2]
                self.waited_s[event.seq] = self.clock() - since
                phrase = release_phrase(event.seq, event.release, self.launched)  # the text timeline's words
                lines.append(f"↳ step {event.seq} {phrase}; waited {self.waited_s[event.seq]:.1f} s")
            lines += outcome_lines(event.outcome)
            if event.outcome.error is not None and event.outcome.error.sqlstate == "40001":
                lines.append(serialization_text(self.predicate))
            if lines:
                error = event.outcome.error is not None
                self._lane_print("", launched.session, lines, error=error, resumed=event.after_wait)
        elif isinstance(event, StepCancelled):
            launched = self.launched[event.seq]
            self.waiting.pop(event.seq, None)
            text = f"⌛ cancelled after {event.after_s:g} s ({cancel_text(event)})"
            self._lane_print("", launched.session, [text], error=True)
        elif isinstance(event, ServerChose):  # the text timeline's words
            self._lane_print("", self.launched[event.seq].session, [chosen_text(event, self.launched)], alarm=True)
        elif isinstance(event, SessionLost):
            self._lane_print("", event.session, [lost_text(event)], error=True)
        elif isinstance(event, NoticeReceived):
            self._lane_print("", event.session, [f"{event.severity}: {event.message}"], dim=True)
        elif isinstance(event, NotifyReceived):
            self._lane_print("", event.session, [f'NOTIFY "{event.channel}" "{event.payload}"'], dim=True)
        elif isinstance(event, LocksObserved):
            self.predicate = tuple(lock for lock in event.other_locks if lock.kind == "predicate")
            shown = event.locks if self.lock_kinds == "rows" else (event.locks or ()) + event.other_locks
            if shown != self.last_locks:
                self.last_locks = shown
                held = "unknown" if shown is None else "; ".join(lock_label(lock) for lock in shown) or "none"
                self._full_print(f"{'row locks' if self.lock_kinds == 'rows' else 'locks'}: {held}", dim=True)

    def on_idle(self) -> None:
        """The runner is waiting on the server: keep the wait counter moving."""
        self.screen.draw_status()

    # -- the end -----------------------------------------------------------------------

    def finish(self, run: Run) -> None:
        """The verdict, what went wrong (or what the cure did), and the other variant."""
        run = without_controls(run)
        self.screen.clear_status()
        scenario = run.scenario
        self.screen.rule("What went wrong" if scenario.variant == "bug" else "What the cure did")
        verdict = f"verdict: {verdict_line(run)}"  # the text timeline's words
        self.screen.write(self.screen.style(f"  {verdict}", fg="green" if run.ok else "red", bold=True))
        for check in (c for c in run.checks if not c.ok):
            self.screen.write(
                self.screen.style(f"    ✘ {check.description}: expected {check.expected}, got {check.actual}", fg="red")
            )
        for fact in story_facts(run):
            self.screen.wrap_write(f"• {fact}", indent="  ")
        for seq, seconds in self.waited_s.items():
            launched = self.launched[seq]
            self.screen.wrap_write(f"• {launched.session} sat blocked for {seconds:.1f} s of this talk", indent="  ")
        for event in (e for e in run.events if isinstance(e, CheckQueried)):
            got = "; ".join(outcome_lines(event.outcome)) or "→ nothing"
            self.screen.wrap_write(f"• final state: {one_line(event.sql)}  {got}", indent="  ")
        if scenario.narrative:
            self.screen.write("")
            self.screen.wrap_write(" ".join(scenario.narrative.split()), indent="  ")
        other = self.counterpart
        if other is not None:
            command = f"pgrace run {scenario.name} {variant_flag(other.variant)}"
            heading = "How the cure fixes it" if other.variant == "fix" else "Without the cure"
            self.screen.rule(f"{heading}: {command}")
            self.screen.wrap_write(other.title, indent="  ", bold=True)
            if other.narrative:
                self.screen.wrap_write(" ".join(other.narrative.split()), indent="  ")
        self.screen.write("")
        self.out.flush()

    # -- drawing -----------------------------------------------------------------------

    def _header(self) -> None:
        scenario = self.scenario
        bar = "━" * (self.width - 1)
        self.screen.write(self.screen.style(bar, bold=True))
        self.screen.write(self.screen.style(f"  {scenario.name.upper()}  ·  {scenario.variant}", bold=True))
        self.screen.wrap_write(scenario.title, indent="  ", bold=True)
        self.screen.write(self.screen.style(bar, bold=True))
        if scenario.narrative:
            for paragraph in scenario.narrative.split("\n\n"):
                if paragraph.strip():
                    self.screen.wrap_write(" ".join(paragraph.split()), indent="  ")
        self.screen.write("")
        heads = "".join(self._paint(name.ljust(self.lane), name, bold=True) for name in self.sessions)
        rules = "".join(
            self._paint(("━" * min(len(name) + 4, self.lane - 2)).ljust(self.lane), name) for name in self.sessions
        )
        self.screen.write(" " * GUTTER + heads)
        self.screen.write(" " * GUTTER + rules)

    def _lane_print(
        self,
        number: str,
        session: str,
        lines: list[str],
        *,
        bold: bool = False,
        dim: bool = False,
        alarm: bool = False,
        error: bool = False,
        resumed: bool = False,
    ) -> None:
        index = self.sessions.index(session) if session in self.sessions else 0
        indent = " " * (self.lane * index)
        width = max(16, self.lane - 2)
        wrapped = [w for line in lines for w in textwrap.wrap(line, width, subsequent_indent="  ") or [""]]
        self.screen.clear_status()
        for i, line in enumerate(wrapped):
            prefix = f"{number:>4}  " if i == 0 and number else " " * GUTTER
            if alarm and self.colour:
                text = self.screen.style(f" {line} ", fg="yellow", bold=True, reverse=True)
            elif error and (line.startswith(("✗", "⌛")) or not line.startswith("→")):
                text = self.screen.style(line, fg="red", bold=True)
            elif resumed and i == 0:
                text = self.screen.style(line, fg="yellow", bold=True)
            elif dim:
                text = self.screen.style(line, dim=True)
            elif line.startswith("→"):
                text = self.screen.style(line, bold=True)
            else:
                text = self._paint(line, session, bold=bold or not line.startswith("»"))
            self.screen.write(prefix + indent + text, status=False)
        self.screen.draw_status()

    def _full_print(self, text: str, dim: bool = False) -> None:
        self.screen.clear_status()
        for line in textwrap.wrap(text, self.width - GUTTER - 1, subsequent_indent="  ") or [""]:
            self.screen.write(" " * GUTTER + (self.screen.style(line, dim=True) if dim else line), status=False)
        self.screen.draw_status()

    def _paint(self, text: str, session: str, bold: bool = False) -> str:
        if not self.colour or session not in self.sessions:
            return text
        colour = SESSION_COLOURS[self.sessions.index(session) % len(SESSION_COLOURS)]
        return click.style(text, fg=colour, bold=bold)

    # -- the status line ---------------------------------------------------------------

    def status_text(self) -> str:
        """What the bottom line says now: who waits, for how long, and the key prompt."""
        parts = []
        now = self.clock()
        for session, waits, since in self.waiting.values():
            what = wait_phrase(waits[0]) if waits else "waits"
            parts.append(f"⏳ {session} waiting {now - since:4.1f} s: {what}")
        if self.prompt:
            parts.append(self.prompt)
        return "   │   ".join(parts)

    # -- pauses ------------------------------------------------------------------------

    def _pause(self, seconds: float) -> None:
        """Presentation pacing only (detection never sleeps); the wait counter keeps moving."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(TICK, left))
            self.screen.draw_status()

    def _wait_for_key(self, prompt: str) -> None:
        self.prompt = prompt
        try:
            if not self.tty:
                self.screen.write(f"      [{prompt}]")
            if self.keyboard.wait(self.screen.draw_status):
                self._stop_presenting()
        finally:
            self.prompt = ""
            self.screen.draw_status()

    def _stop_presenting(self) -> None:
        """``q``: the audience has seen enough; the run goes on to its end (its verdict, its exit code)."""
        self.step_by_step = False
        self.pace = None
        self.screen.write("      (q: the rest of the run plays without stopping)")


def bound_values(written: str, sent: str) -> str:
    """``with :job = 1``: the values the runner put in for a step's ``:variables``.

    The written text between variables must match the sent text exactly; each variable
    (the same one always stands for the same value) matches what is in between.
    """
    uses = [u for u in find(written) if u.session is None or u.name not in FACTS]  # pids stay as written
    names = list(dict.fromkeys(u.written for u in uses))
    pattern, position, seen = "", 0, set()
    for use in uses:
        index = names.index(use.written)
        pattern += re.escape(written[position : use.start])
        pattern += f"(?P=v{index})" if index in seen else f"(?P<v{index}>.+?)"
        seen.add(index)
        position = use.end
    pattern += re.escape(written[position:])
    match = re.fullmatch(pattern, sent, re.DOTALL)
    if not uses or match is None:
        return f"sent: {one_line(sent)}"
    return "with " + ", ".join(f"{name} = {match[f'v{i}']}" for i, name in enumerate(names))


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
