"""Reading and running one scenario: ``pgrace list``, ``show`` and ``run``."""

from __future__ import annotations

import sys
from contextlib import suppress
from typing import Literal

import click

from pgrace.cli.base import (
    EXIT_CODES_HELP,
    allow_schema_option,
    bug_option,
    database_name_option,
    draw,
    dsn_option,
    echo,
    exec_option,
    fix_option,
    format_option,
    main,
    output_option,
    param_option,
    pick_variant,
    say,
    scenario_argument,
    server_option,
    step_timeout_option,
    superuser_option,
    tidied,
)
from pgrace.cli.types import Duration
from pgrace.files import refuse_overwriting_inputs
from pgrace.render import formats


@main.command("list", epilog=EXIT_CODES_HELP)
@click.option(
    "--tag", "tags", multiple=True, metavar="TAG", help="Only scenarios with this tag (repeatable: all of them)."
)
@click.option("--topic", metavar="TOPIC", help="Only scenarios of this topic, e.g. 'job queue'.")
@format_option("list")
def list_command(tags: tuple[str, ...], topic: str | None, fmt: str) -> None:
    """List the shipped scenarios by topic, one line each, and the tags to filter them by."""
    from pgrace import api

    echo(draw("list", fmt, api.list_scenarios(tags, topic)), None)


@main.command(epilog=EXIT_CODES_HELP)
@scenario_argument
@fix_option
@bug_option
@param_option
def show(scenario: str, fix: bool, bug: bool, params: tuple[tuple[str, str], ...]) -> None:
    """Show a scenario's story and steps without running it."""
    from pgrace import api
    from pgrace.render.listing import render_show

    if fix and bug:
        raise click.UsageError("--fix and --bug exclude each other")
    echo(render_show(api.show(scenario, dict(params), "fix" if fix else "bug" if bug else None)), None)


@main.command(epilog=EXIT_CODES_HELP)
@scenario_argument
@fix_option
@bug_option
@param_option
@format_option("run")
@dsn_option
@server_option
@click.option("--step", "step_by_step", is_flag=True, help="Presenter mode: press Enter to run each step.")
@click.option("--pace", type=Duration(), metavar="SECONDS", help="Presenter mode: run one step every SECONDS.")
@step_timeout_option
@click.option("--width", type=click.IntRange(min=40), help="Width of the text timeline (default: terminal).")
@click.option("--color/--no-color", default=None, help="Colour per session (default: on a terminal, unless NO_COLOR).")
@output_option
@click.option(
    "--compare",
    is_flag=True,
    help="Run both variants (bug and fix) and show them side by side (text, html, svg, markdown).",
)
@click.option(
    "--locks",
    "lock_kinds",
    type=click.Choice(["rows", "all"]),
    default="rows",
    show_default=True,
    help="The locks column: row locks only, or table, advisory and SIRead locks too (JSON always has every kind).",
)
@allow_schema_option
@database_name_option
@superuser_option
@exec_option
def run(
    scenario: str,
    fix: bool,
    bug: bool,
    params: tuple[tuple[str, str], ...],
    fmt: str,
    dsn: str | None,
    server_target: str | None,
    step_by_step: bool,
    pace: float | None,
    step_timeout: float,
    width: int | None,
    color: bool | None,
    output: str | None,
    compare: bool,
    lock_kinds: Literal["rows", "all"],
    allow_scratch_schema: bool,
    database_name: str | None,
    superuser: bool,
    commands: tuple[str, ...],
) -> None:
    """Run a scenario and print its timeline and verdict.

    SCENARIO is a shipped scenario's name (see `pgrace list`) or a path to a
    `.toml` scenario or an isolation `.spec` file. With --step or --pace the run
    is played live for an audience (a picture format then needs -o FILE).
    """
    from pgrace.servers import booting_server

    # pgrace's own server boots in other processes while the scenario is read and the driver is imported.
    with booting_server(server_target or dsn, superuser) as server_ready:
        from pgrace.frontends import catalog

        file_scenario = catalog.read_scenario(scenario, dict(params))
        from pgrace import api
        from pgrace.cli.terminal.playback import Playback

        refuse_overwriting_inputs(output, [file_scenario.source])
        shown = Playback(fmt, lambda text: echo(text, output), output, color, width, lock_kinds, pace, step_by_step)
        if commands or pick_variant(file_scenario, fix, bug).commands:
            refuse_exec(compare, shown.live, fmt)
            from pgrace import proxy

            chosen = pick_variant(file_scenario, fix, bug)
            result = proxy.run_exec(chosen, commands, server=tidied(server_ready()), step_timeout=step_timeout)
            echo(draw("run", fmt, result, shown.style()), output)
            sys.exit(result.exit_code)
        if compare:
            refuse_compare(fix or bug, shown.live, fmt)
            runs = api.compare(
                file_scenario,
                server=tidied(server_ready()),
                options=shown.options(step_timeout),
                allow_scratch_schema=allow_scratch_schema,
            )
            echo(draw("compare", fmt, runs, shown.style()), output)
            sys.exit(max(r.exit_code for r in runs))
        chosen = pick_variant(file_scenario, fix, bug)
        if not shown.start(chosen, file_scenario):
            # The engine and the renderer are imported while the run waits for its server and database.
            import_ahead("pgrace.engine.libpq.runner", "pgrace.render.views", f"pgrace.render.{fmt}")
        server = tidied(server_ready())
        with shown.playing():
            result = shown.played(
                api.run(
                    chosen,
                    server=server,
                    options=shown.options(step_timeout),
                    allow_scratch_schema=allow_scratch_schema,
                    database_name=database_name,
                )
            )
        shown.show(result)
        for note in api.teardown_failures(result) if fmt != "isolation" else []:
            say(f"note: {note}")
        sys.exit(result.exit_code)


def import_ahead(*modules: str) -> None:
    """Import ``modules`` in a thread now, for later: a short run spends most of its time waiting on the server.

    The thread only imports, so there is nothing to clean up after it. A module that fails to
    import fails again where it is used, and is reported there.
    """
    import importlib
    import threading

    def load() -> None:
        for module in modules:
            with suppress(Exception):
                importlib.import_module(module)

    threading.Thread(target=load, name="pgrace-import-ahead", daemon=True).start()


def refuse_exec(compare: bool, live: bool, fmt: str) -> None:
    """What a run of commands (``--exec``, a file's ``[exec]``) cannot do: both variants at once, live playback,
    isolationtester's output."""
    if compare:
        raise click.UsageError("a run of commands (--exec, [exec]) is one variant; leave out --compare")
    if live:
        raise click.UsageError("a run of commands (--exec, [exec]) cannot be played live (--step, --pace)")
    if fmt == "isolation":
        raise click.UsageError(
            "a run of commands (--exec, [exec]) has no isolationtester output; choose another --format"
        )


def refuse_compare(picked_variant: bool, live: bool, fmt: str) -> None:
    """What ``run --compare`` cannot do: one variant, live playback, a format of one run only."""
    if picked_variant:
        raise click.UsageError("--compare runs both variants; leave out --fix and --bug")
    if live:
        raise click.UsageError("--compare cannot be played live; run each variant with --step instead")
    if fmt not in formats.names("compare"):
        raise click.UsageError(f"--compare shows --format {', '.join(formats.names('compare'))}, not {fmt}")
