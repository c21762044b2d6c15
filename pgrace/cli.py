"""The ``pgrace`` command: thin click commands over :mod:`pgrace.api`.

Each command parses options, calls one library function and renders. Errors reach the
user in exactly one place, :class:`PgraceGroup`, as one line and the error's exit code:
0 ran and every expectation held, 1 an expectation did not hold, 2 invalid input,
3 no server could be had.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from contextlib import suppress
from pathlib import Path
from types import FrameType
from typing import Any

import click

from pgrace import api, catalog
from pgrace.errors import PgraceError, ScenarioError
from pgrace.model import Scenario
from pgrace.render.json import render_json
from pgrace.render.live import LivePlayer
from pgrace.render.text import Style, render_text
from pgrace.runner import RunOptions
from pgrace.scratch import sweep_leftovers
from pgrace.servers import ServerInfo, open_server
from pgrace.timeline import Run

FORMATS = ("text", "json", "isolation")


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an exception so that every context manager cleans up."""

    signum = signal.SIGTERM


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


class PgraceGroup(click.Group):
    """Turns pgrace's own errors into one line on stderr and the error's exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        with suppress(ValueError):  # only the main thread may install handlers
            signal.signal(signal.SIGTERM, _raise_terminated)
        try:
            return super().invoke(ctx)
        except PgraceError as exc:
            click.echo(f"pgrace: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt as exc:
            signum = getattr(exc, "signum", signal.SIGINT)
            click.echo(f"pgrace: {'terminated' if signum == signal.SIGTERM else 'interrupted'}; cleaned up", err=True)
            ctx.exit(128 + signum)


@click.group(cls=PgraceGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pgrace")
def main() -> None:
    """Reproduce PostgreSQL concurrency bugs on demand, against a real server."""


@main.command("list")
def list_command() -> None:
    """List the shipped scenarios, one line each."""
    for name in catalog.shipped_names():
        scenario = catalog.load(name)
        variants = "bug + fix" if scenario.other else scenario.variant
        click.echo(f"{name:<24} {scenario.title}  [{variants}]")


def _params(values: tuple[str, ...]) -> dict[str, str]:
    params: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--param")
        params[name] = value
    return params


def _variant(scenario: Scenario, fix: bool, bug: bool) -> Scenario:
    if fix and bug:
        raise click.UsageError("--fix and --bug exclude each other")
    wanted = "fix" if fix else "bug" if bug else None
    try:
        return scenario.variant_named(wanted)
    except KeyError:
        raise ScenarioError(f"scenario {scenario.name!r} has no {wanted} variant", scenario.source) from None


scenario_argument = click.argument("scenario", metavar="SCENARIO")
allow_schema_option = click.option(
    "--allow-scratch-schema",
    is_flag=True,
    help="Without the CREATEDB privilege, run in a throwaway schema of the DSN's database instead.",
)


def report_swept(server: ServerInfo) -> None:
    """Drop what killed runs left on this server, and say so (a failure here never stops a run)."""
    with suppress(PgraceError):
        for name in sweep_leftovers(server):
            click.echo(f"pgrace: removed {name}, left behind by a killed pgrace run", err=True)


fix_option = click.option("--fix", is_flag=True, help="Run the variant with the cure applied.")
bug_option = click.option("--bug", is_flag=True, help="Run the variant that shows the bug.")
param_option = click.option(
    "--param", "-p", "params", multiple=True, metavar="NAME=VALUE", help="Set a scenario parameter, e.g. -p workers=5."
)


@main.command()
@scenario_argument
@fix_option
@bug_option
@param_option
def show(scenario: str, fix: bool, bug: bool, params: tuple[str, ...]) -> None:
    """Show a scenario's story and steps without running it."""
    chosen = _variant(catalog.load(scenario, _params(params)), fix, bug)
    click.echo(f"{chosen.name} ({chosen.variant}): {chosen.title}")
    click.echo(f"source: {chosen.source}")
    if chosen.narrative:
        click.echo("")
        click.echo(chosen.narrative)
    click.echo("")
    click.echo(f"sessions: {', '.join(chosen.session_names)}")
    for index, permutation in enumerate(chosen.permutations):
        if len(chosen.permutations) > 1:
            click.echo(f"\npermutation {index + 1}: {' '.join(p.step for p in permutation)}")
            continue
        for number, entry in enumerate(permutation, 1):
            step = chosen.step(entry.step)
            click.echo(f"{number:>3}. {step.session:<10} {' '.join(step.sql.split())}")
            if step.note:
                click.echo(f"     {'':<10} » {step.note}")
    for check in chosen.checks:
        click.echo(f"check: {check.description}")
    if chosen.other:
        flag = "--fix" if chosen.other.variant == "fix" else "--bug"
        click.echo(f"\nother variant: {flag}: {chosen.other.title}")


@main.command()
@scenario_argument
@fix_option
@bug_option
@param_option
@click.option(
    "--format", "-f", "fmt", type=click.Choice(FORMATS), default="text", show_default=True, help="Output format."
)
@click.option("--dsn", envvar="PGRACE_DSN", help="Use this server instead of the embedded one (libpq URI or conninfo).")
@click.option("--step", "step_by_step", is_flag=True, help="Presenter mode: press Enter to run each step.")
@click.option(
    "--pace",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Presenter mode: run one step every SECONDS.",
)
@click.option(
    "--step-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="Cancel a step that cannot finish after this long.",
)
@click.option("--width", type=click.IntRange(min=40), help="Width of the text timeline (default: terminal).")
@click.option("--color/--no-color", default=None, help="Colour per session (default: on a terminal, unless NO_COLOR).")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), help="Write to FILE.")
@allow_schema_option
def run(
    scenario: str,
    fix: bool,
    bug: bool,
    params: tuple[str, ...],
    fmt: str,
    dsn: str | None,
    step_by_step: bool,
    pace: float | None,
    step_timeout: float,
    width: int | None,
    color: bool | None,
    output: str | None,
    allow_scratch_schema: bool,
) -> None:
    """Run a scenario and print its timeline and verdict.

    SCENARIO is a shipped scenario's name (see `pgrace list`) or a path to a
    `.toml` scenario or an isolation `.spec` file.
    """
    chosen = _variant(catalog.load(scenario, _params(params)), fix, bug)
    to_terminal = output is None and sys.stdout.isatty()
    colour = color if color is not None else (to_terminal and "NO_COLOR" not in os.environ)
    style = Style(
        colour=colour and fmt == "text", width=width or (shutil.get_terminal_size().columns if to_terminal else 120)
    )
    live = (step_by_step or pace) and fmt == "text"
    player = LivePlayer(chosen, style, pace=pace, step_by_step=step_by_step) if live else None
    options = RunOptions(
        step_timeout=step_timeout,
        before_step=player.before_step if player else None,
        on_event=player.on_event if player else None,
    )
    with open_server(dsn) as server:
        report_swept(server)
        result = api.run(chosen, server=server, options=options, allow_scratch_schema=allow_scratch_schema)
    text = _render(result, fmt, style)
    if output is not None:
        Path(output).write_text(text, encoding="utf-8")
    elif player is not None:
        from pgrace.render.text import render_verdict

        click.echo("\n".join(render_verdict(result.checks, style)))
    else:
        click.echo(text, nl=False)
    sys.exit(0 if result.ok else 1)


@main.command()
@click.option("--dsn", envvar="PGRACE_DSN", required=True, help="The server to clean (libpq URI or conninfo).")
def clean(dsn: str) -> None:
    """Remove scratch databases and schemas that killed pgrace runs left on a server."""
    with open_server(dsn) as server:
        removed = sweep_leftovers(server)
    for name in removed:
        click.echo(f"removed {name}")
    click.echo(f"{len(removed)} leftover{'s' if len(removed) != 1 else ''} removed from {server.label}")


def _render(result: Run, fmt: str, style: Style) -> str:
    if fmt == "json":
        return render_json(result)
    if fmt == "isolation":
        from pgrace.render.isolation import render_isolation

        return render_isolation(result)
    return render_text(result, style)
