"""What many test files need, written once: scenarios from a few lines, and a run's facts by name.

A test states its scenario where it is read (its ``[[step]]`` tables, or its steps as
tuples) and asks the run about steps by their names; these helpers hold the boilerplate.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.model.scenario import PermutationStep, Scenario, Session, Step
from pgrace.model.timeline import Run, StepFinished, StepLaunched, StepRun
from pgrace.render.text import Style, render_text

if TYPE_CHECKING:
    from click.testing import Result


def toml_scenario(
    body: str,
    *,
    sessions: str = '["a", "b"]',
    setup: str | None = None,
    name: str | None = None,
    params: dict[str, str] | None = None,
) -> Scenario:
    """A TOML scenario whose ``[[step]]`` tables are ``body`` (dedented), under a header of the rest.

    The header is ``name``, ``setup`` and ``sessions``, in that order, each on one line, so
    an error's line number is the body's plus the header's lines. The file is called
    ``NAME.toml``, or ``inline.toml`` without a name.
    """
    header = f"name = {name!r}\n" if name is not None else ""
    header += f"setup = {setup!r}\n" if setup is not None else ""
    header += f"sessions = {sessions}\n"
    return parse_toml_scenario(header + textwrap.dedent(body), f"{name or 'inline'}.toml", params)


def steps_scenario(steps: list[tuple[str, str, str]], captures: dict[str, str] | None = None) -> Scenario:
    """A scenario of ``(name, session, sql)`` steps in one permutation, in that order.

    ``captures`` maps a step name to the variable it captures (from a column ``x``). Sessions
    are in order of their first step. Nothing is parsed: this is the model the parsers build.
    """
    captures = captures or {}
    built = tuple(
        Step(name, session, sql, capture=((captures[name], "x"),) if name in captures else ())
        for name, session, sql in steps
    )
    return Scenario(
        name="t",
        title="t",
        source="t.toml",
        sessions=tuple(Session(s) for s in dict.fromkeys(s for _, s, _ in steps)),
        steps=built,
        permutations=(tuple(PermutationStep(s.name) for s in built),),
    )


def by_name(run: Run) -> dict[str, StepRun]:
    """The run's steps by their names (a scenario names each step once)."""
    return {s.step: s for s in run.step_runs()}


def launched_at(run: Run, seq: int) -> float:
    """When step ``seq`` was sent, in ms since the run began."""
    return next(e.t for e in run.events if isinstance(e, StepLaunched) and e.seq == seq)


def finished_at(run: Run, seq: int) -> float:
    """When step ``seq``'s result came back, in ms since the run began."""
    return next(e.t for e in run.events if isinstance(e, StepFinished) and e.seq == seq)


def text_of(run: Run, width: int = 400) -> str:
    """The text timeline without the server line, wide enough by default that no cell wraps."""
    return render_text(run, Style(width=width, show_server=False))


def cli(*args: str) -> Result:
    """``pgrace ARGS`` in process, its exceptions raised: a traceback fails the test rather than being its output."""
    from click.testing import CliRunner

    from pgrace.cli import main

    return CliRunner().invoke(main, list(args), catch_exceptions=False)
