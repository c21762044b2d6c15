"""The ``pgrace`` command: thin click commands over :mod:`pgrace.api`.

Each command parses options, calls one library function and renders. Errors reach the
user in exactly one place, :class:`PgraceGroup`, as one line and the error's exit code:
0 ran and every expectation held, 1 an expectation did not hold, 2 invalid input,
3 no server could be had.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import textwrap
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click

from pgrace import bounds
from pgrace.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERNAL,
    EXIT_INVALID,
    EXIT_SIGTERM,
    PgraceError,
    ScenarioError,
    ScenarioFailed,
    exit_code_of_interrupt,
    raise_terminated,
    report_internal_error,
)
from pgrace.render.escape import visible, without_controls

# Each command imports what it needs when it runs: psycopg, the runner and the renderers
# cost more than a short run itself (tests/test_import_cost.py checks that importing this
# module pulls in none of them).
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from pgrace.model import Scenario
    from pgrace.render.progress import Progress
    from pgrace.render.text import Style
    from pgrace.runner import RunOptions
    from pgrace.servers import ServerInfo
    from pgrace.timeline import Run

FORMATS = ("text", "json", "isolation", "html", "svg", "mermaid", "markdown")
COMPARE_FORMATS = ("text", "html", "svg", "markdown")


class PgraceGroup(click.Group):
    """Turns every way a command can end into one line on stderr and a documented exit code.

    pgrace's own errors carry their code; Ctrl-C and SIGTERM (an exception after
    cleanup ran) give 130 and 143; anything else is a bug: one line and exit 4, the
    traceback only with PGRACE_DEBUG=1.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """``pgrace --bogus``: one line too (bare ``pgrace`` still prints the help)."""
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":
                raise
            click.echo(visible(f"pgrace: {' '.join(exc.format_message().split())} (see pgrace --help)"), err=True)
            ctx.exit(exc.exit_code)

    def invoke(self, ctx: click.Context) -> Any:
        _forget_secrets()
        previous: Any = None
        with suppress(ValueError):  # only the main thread may install handlers
            previous = signal.signal(signal.SIGTERM, raise_terminated)
        try:
            return super().invoke(ctx)
        except PgraceError as exc:
            from pgrace.servers import scrub_secrets

            message = " ".join(line.strip() for line in str(exc).strip().splitlines())  # libpq's hint is a line too
            click.echo(f"pgrace: {visible(scrub_secrets(message))}", err=True)  # no password, no control char
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt as exc:
            code = exit_code_of_interrupt(exc)
            click.echo(f"pgrace: {'terminated' if code == EXIT_SIGTERM else 'interrupted'}; cleaned up", err=True)
            ctx.exit(code)
        except click.ClickException as exc:  # a bad option or argument: one line too, like any invalid input
            sub = exc.ctx if isinstance(exc, click.UsageError) and exc.ctx is not ctx else None
            where = f"{sub.info_name}: " if sub is not None and sub.info_name else ""
            hint = f" (see pgrace {where[:-2]} --help)" if where else ""
            message = " ".join(exc.format_message().split())
            click.echo(visible(f"pgrace: {where}{message}{hint}"), err=True)
            ctx.exit(exc.exit_code)
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except BrokenPipeError:  # stdout closed early (`pgrace run x | head`): nothing more to say
            ctx.exit(EXIT_BROKEN_PIPE)
        except Exception as exc:
            report_internal_error(exc)
            ctx.exit(EXIT_INTERNAL)
        finally:
            _forget_secrets()
            # Cleanup is done: a late SIGTERM (e.g. during interpreter shutdown) just ends the process.
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


def _forget_secrets() -> None:
    """A command's DSN secrets are scrubbed from that command's messages only, never from a later command's
    (in one process, e.g. under a test runner, a password like ``sql`` would blank out words forever)."""
    servers = sys.modules.get("pgrace.servers")  # not imported yet: nothing remembered, nothing to import
    if servers is not None:
        servers.forget_secrets()


class Seconds(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """A positive, finite number of seconds: click's FloatRange lets ``nan`` and ``inf`` through."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0:
            self.fail(f"{value!r} is not a positive, finite number of seconds", param, ctx)
        return seconds


def _jobs_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``-j N``: refused above what this machine can run (exit 2), before anything starts."""

    def bounded(ctx: click.Context, param: click.Parameter, value: int) -> int:
        bounds.check_jobs(value)
        return value

    return click.option(
        "--jobs",
        "-j",
        type=click.IntRange(min=1),
        default=1,
        show_default=True,
        callback=bounded,
        help=f"{help_text} (at most {bounds.max_jobs()} here: {bounds.JOBS_PER_CPU} per CPU).",
    )


def _max_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--max N``: a sample of at most bounds.MAX_SAMPLE interleavings (exit 2 above it)."""

    def bounded(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
        bounds.check_sample(value)
        return value

    return click.option(
        "--max",
        "limit",
        type=click.IntRange(min=1),
        metavar="N",
        callback=bounded,
        help=f"{help_text} (N at most {bounds.MAX_SAMPLE:,}).",
    )


def _progress() -> Progress:
    """Progress on stderr when it is a terminal (drawn by the renderer; nothing off a terminal)."""
    from pgrace.render.progress import Progress

    return Progress(sys.stderr)


def _long_exploration(progress: Progress, label: str, total: int, jobs: int) -> None:
    """A long job says how long before it starts, on a terminal or in a CI log."""
    if total > bounds.LONG_INTERLEAVINGS:
        processes = f" in {jobs} processes" if jobs > 1 else ""
        progress.note(f"pgrace: {label}: {total:,} interleavings to run{processes}")


def _writable(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Refuse an output file whose folder is missing or read-only before running anything (exit 2)."""
    if value is not None:
        folder = Path(value).parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise click.BadParameter(f"cannot write {value}: no writable folder {str(folder)!r}", ctx, param)
    return value


def refuse_overwriting_inputs(output: str | Path | None, inputs: Iterable[str | Path], what: str = "-o") -> None:
    """An output file that is one of the files the command reads (itself, or through a link) is refused, exit 2.

    ``pgrace run my.toml -o my.toml`` would otherwise replace the scenario with its own timeline.
    Any other existing file is overwritten, as a shell's ``>`` would.
    """
    if output is None:
        return
    for source in inputs:
        with suppress(OSError):  # a file that does not exist (yet) cannot be an input
            if os.path.samefile(output, source):
                raise ScenarioError(f"{what} would write over {source}, which this command reads", str(output))


OUTPUT_HELP = (
    "Write to FILE instead of stdout. An existing FILE is overwritten, as a shell's > would;"
    " a file the command reads never is."
)


def write_output(path: str | Path, text: str) -> None:
    """Write an output file; failing to (a full disk, say) is one line and exit 2, never a traceback."""
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"cannot write: {exc.strerror or exc}", str(path)) from None


def read_input(name: str) -> str:
    """A text file named on the command line (not a scenario): unreadable or not UTF-8 is invalid input."""
    try:
        data = Path(name).read_bytes()
    except OSError as exc:
        raise ScenarioError(f"cannot read: {exc.strerror or exc}", name) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ScenarioError(f"not UTF-8: byte 0x{data[exc.start : exc.start + 1].hex()}", name, line) from None


EXIT_CODES_HELP = """\b
Exit codes:
  0    ran, and every expectation held
  1    ran, and an expectation did not hold, or the scenario could not run to its end
       (its setup failed on this server, or its steps blocked each other)
  2    invalid input: a scenario file (file:line), an option, a connection string
  3    no server could be had (not started, not reachable, or gone during the run)
  4    internal error: a bug in pgrace (PGRACE_DEBUG=1 shows the traceback)
  130  interrupted by Ctrl-C (SIGINT), after cleaning up
  143  terminated by SIGTERM, after cleaning up
  141  stdout was closed before pgrace finished writing (e.g. piped into head)
"""


@click.group(cls=PgraceGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES_HELP)
@click.version_option(package_name="pgrace")
def main() -> None:
    """Reproduce PostgreSQL concurrency bugs on demand, against a real server."""


@main.command("list", epilog=EXIT_CODES_HELP)
@click.option(
    "--tag", "tags", multiple=True, metavar="TAG", help="Only scenarios with this tag (repeatable: all of them)."
)
@click.option("--topic", metavar="TOPIC", help="Only scenarios of this topic, e.g. 'job queue'.")
@click.option(
    "--format",
    "-f",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Output format.",
)
def list_command(tags: tuple[str, ...], topic: str | None, fmt: str) -> None:
    """List the shipped scenarios by topic, one line each, and the tags to filter them by."""
    from pgrace import catalog
    from pgrace.formats.scenario_toml import did_you_mean

    entries = catalog.entries()
    known_tags = {tag for entry in entries for tag in entry.tags}
    for tag in tags:
        if tag not in known_tags:
            raise click.BadParameter(
                f"no shipped scenario has tag {tag!r}{did_you_mean(tag, known_tags)}", param_hint="--tag"
            )
    known_topics = {entry.topic for entry in entries}
    if topic is not None and topic not in known_topics:
        raise click.BadParameter(
            f"no shipped scenario has topic {topic!r}{did_you_mean(topic, known_topics)}", param_hint="--topic"
        )
    chosen = [e for e in entries if set(tags) <= set(e.tags) and (topic is None or e.topic == topic)]
    if fmt == "json":
        click.echo(json.dumps([entry.to_dict() for entry in chosen], indent=2, ensure_ascii=False))
        return
    for number, (group, members) in enumerate(catalog.by_topic(chosen)):
        click.echo(visible(("\n" if number else "") + group))
        for entry in members:
            click.echo(visible(f"  {entry.name:<28} {entry.title}  [{entry.variants_label}]"))
    shown = sorted({tag for entry in chosen for tag in entry.tags})
    if shown:
        wrapped = textwrap.wrap(
            ", ".join(shown),
            width=100,
            initial_indent="  ",
            subsequent_indent="  ",
            break_on_hyphens=False,
            break_long_words=False,
        )
        click.echo(visible("\ntags (pgrace list --tag TAG):\n" + "\n".join(wrapped)))


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
    from pgrace import catalog

    return catalog.variant(scenario, "fix" if fix else "bug" if bug else None)


def _both_variants(scenario: Scenario, picked_variant: bool) -> list[Scenario]:
    """What --compare runs: the bug, then the fix."""
    if picked_variant:
        raise click.UsageError("--compare runs both variants; leave out --fix and --bug")
    if scenario.other is None:
        raise ScenarioError(
            f"scenario {scenario.name!r} has one variant only; --compare needs a bug and a fix", scenario.source
        )
    return sorted([scenario, scenario.other], key=lambda s: s.variant != "bug")


scenario_argument = click.argument("scenario", metavar="SCENARIO")
step_timeout_option = click.option(
    "--step-timeout",
    type=Seconds(),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="Cancel a step that cannot finish after this long.",
)
database_name_option = click.option(
    "--database-name",
    metavar="NAME",
    help="Name the scratch database NAME instead of pgrace_...: e.g. isolation_regression for specs that name"
    " pg_regress's database. It must not exist; it is created for the run and dropped after.",
)
superuser_option = click.option(
    "--superuser",
    is_flag=True,
    help="On a server pgrace starts, run the scenario's SQL as its superuser instead of a role made for the run,"
    " for the few specs that need it. Such SQL can then run programs and write files as the server's account.",
)
allow_schema_option = click.option(
    "--allow-scratch-schema",
    is_flag=True,
    help="Without the CREATEDB privilege, run in a throwaway schema of the DSN's database instead.",
)


def report_swept(server: ServerInfo) -> None:
    """Say what was mended to start the server; drop what killed runs left on it, and say so.

    A failure here never stops a run."""
    from pgrace.scratch import sweep_leftovers

    for note in server.notes:
        click.echo(f"pgrace: note: {visible(note)}", err=True)
    if server.fresh:  # started for this command a moment ago: nothing to sweep, no connection to spend
        return
    with suppress(PgraceError):
        swept = sweep_leftovers(server)
        for name in swept.removed:
            click.echo(f"pgrace: removed {name}, left behind by a killed pgrace run", err=True)
        for note in swept.skipped:
            click.echo(f"pgrace: {note}", err=True)


fix_option = click.option("--fix", is_flag=True, help="Run the variant with the cure applied.")
bug_option = click.option("--bug", is_flag=True, help="Run the variant that shows the bug.")
param_option = click.option(
    "--param", "-p", "params", multiple=True, metavar="NAME=VALUE", help="Set a scenario parameter, e.g. -p workers=5."
)


@main.command(epilog=EXIT_CODES_HELP)
@scenario_argument
@fix_option
@bug_option
@param_option
def show(scenario: str, fix: bool, bug: bool, params: tuple[str, ...]) -> None:
    """Show a scenario's story and steps without running it."""
    from pgrace import catalog

    loaded = catalog.load(scenario, _params(params))
    chosen = without_controls(_variant(loaded, fix, bug))
    click.echo(f"{chosen.name} ({chosen.variant}): {chosen.title}")
    click.echo(f"source: {chosen.source}")
    if chosen.topic or chosen.tags:
        click.echo(
            f"topic: {chosen.topic or catalog.OTHER_TOPIC}"
            + (f"; tags: {', '.join(chosen.tags)}" if chosen.tags else "")
        )
    if chosen.narrative:
        click.echo("")
        click.echo(chosen.narrative)
    click.echo("")
    if chosen.changes:  # only the variant built over the file's first one has any
        click.echo(f"what the {chosen.variant} changes in the {loaded.variant}:")
        for change in chosen.changes:
            click.echo(f"  {change}")
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


@main.command(epilog=EXIT_CODES_HELP)
@scenario_argument
@fix_option
@bug_option
@param_option
@click.option(
    "--format", "-f", "fmt", type=click.Choice(FORMATS), default="text", show_default=True, help="Output format."
)
@click.option("--dsn", envvar="PGRACE_DSN", help="Use this server instead of the embedded one (libpq URI or conninfo).")
@click.option(
    "--server",
    "server_target",
    metavar="SERVER",
    help="Where to run: 'embedded', a connection string, a PostgreSQL bin directory or docker:IMAGE.",
)
@click.option("--step", "step_by_step", is_flag=True, help="Presenter mode: press Enter to run each step.")
@click.option(
    "--pace",
    type=Seconds(),
    metavar="SECONDS",
    help="Presenter mode: run one step every SECONDS.",
)
@step_timeout_option
@click.option("--width", type=click.IntRange(min=40), help="Width of the text timeline (default: terminal).")
@click.option("--color/--no-color", default=None, help="Colour per session (default: on a terminal, unless NO_COLOR).")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), callback=_writable, help=OUTPUT_HELP)
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
def run(
    scenario: str,
    fix: bool,
    bug: bool,
    params: tuple[str, ...],
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
) -> None:
    """Run a scenario and print its timeline and verdict.

    SCENARIO is a shipped scenario's name (see `pgrace list`) or a path to a
    `.toml` scenario or an isolation `.spec` file. With --step or --pace the run
    is played live for an audience (a picture format then needs -o FILE).
    """
    from pgrace import catalog
    from pgrace.servers import booting_server

    # pgrace's own server boots in other processes while the scenario loads and the driver is imported.
    with booting_server(server_target or dsn, superuser) as server_ready:
        loaded = catalog.load(scenario, _params(params))
        refuse_overwriting_inputs(output, [loaded.source])
        to_terminal = output is None and sys.stdout.isatty()
        colour = color if color is not None else (to_terminal and "NO_COLOR" not in os.environ)
        style = None
        if fmt == "text":  # the text renderer is only imported when it is used
            from pgrace.render.text import Style

            style = Style(colour=colour, width=width or (shutil.get_terminal_size().columns if to_terminal else 120))
        if compare:
            from pgrace.runner import RunOptions

            _run_compare(
                loaded,
                fix or bug,
                fmt,
                server_ready,
                step_by_step or bool(pace),
                RunOptions(step_timeout=step_timeout, lock_kinds=lock_kinds),
                style,
                output,
                allow_scratch_schema,
            )
            return
        chosen = _variant(loaded, fix, bug)
        counterpart = loaded.other if chosen is loaded else loaded  # the other variant, for "the cure" or "the bug"
        live = bool(step_by_step or pace) and (fmt == "text" or output is not None)
        presenter = None
        if live:
            from pgrace.render.presenter import Presenter
            from pgrace.render.text import Style

            on_screen = sys.stdout.isatty()
            presenter = Presenter(
                chosen,
                Style(
                    colour=color if color is not None else (on_screen and "NO_COLOR" not in os.environ),
                    width=width or (shutil.get_terminal_size().columns if on_screen else 120),
                ),
                pace=pace,
                step_by_step=step_by_step,
                counterpart=counterpart,
                lock_kinds=lock_kinds,
            )
        try:
            server = server_ready()
            from pgrace import api
            from pgrace.runner import RunOptions

            options = RunOptions(
                step_timeout=step_timeout,
                lock_kinds=lock_kinds,
                before_step=presenter.before_step if presenter else None,
                on_event=presenter.on_event if presenter else None,
                on_idle=presenter.on_idle if presenter else None,
            )
            report_swept(server)
            if presenter is not None:
                with presenter:
                    result = api.run(
                        chosen,
                        server=server,
                        options=options,
                        allow_scratch_schema=allow_scratch_schema,
                        database_name=database_name,
                    )
                    presenter.finish(result)
            else:
                result = api.run(
                    chosen,
                    server=server,
                    options=options,
                    allow_scratch_schema=allow_scratch_schema,
                    database_name=database_name,
                )
        except ScenarioFailed as failed:
            # As isolationtester: what ran until then, then why it stopped (on stderr, exit 1).
            if failed.run is not None and presenter is None:
                _show_run(failed.run, fmt, style, counterpart, output, to_terminal)
            raise
        _show_run(result, fmt, style, counterpart, output, to_terminal if presenter is None else None)
        for note in _teardown_failures(result) if fmt != "isolation" else []:
            click.echo(f"pgrace: note: {note}", err=True)
        sys.exit(0 if result.ok else 1)


def _show_run(
    result: Run,
    fmt: str,
    style: Style | None,
    counterpart: Scenario | None,
    output: str | None,
    to_terminal: bool | None,
) -> None:
    """Render to ``output`` or stdout; ``to_terminal`` None: a presenter has shown it already."""
    if output is None and to_terminal is None:
        return
    text = _render(result, fmt, style, counterpart)
    if fmt == "isolation" and to_terminal:
        text = visible(text)  # isolationtester prints server text raw; a file or a pipe gets it byte for byte
    _emit(text, output)


def _teardown_failures(result: Run) -> list[str]:
    """Teardown errors (a teardown cancelled at --step-timeout, say): isolationtester reports them, not fatal."""
    from pgrace.timeline import SetupRan

    notes = []
    for event in result.events:
        if isinstance(event, SetupRan) and event.phase == "teardown" and event.outcome.error is not None:
            error = event.outcome.error
            where = f"teardown of session {event.session}" if event.session else "teardown"
            detail = f" ({error.detail})" if error.detail else ""
            notes.append(visible(f"{where} failed: {error.severity}:  {error.message}{detail}"))
    return notes


def _run_compare(
    loaded: Scenario,
    picked_variant: bool,
    fmt: str,
    server_ready: Callable[[], ServerInfo],
    live: bool,
    options: RunOptions,
    style: Style | None,
    output: str | None,
    allow_scratch_schema: bool,
) -> None:
    """Run the bug and the fix on one server and render them next to each other."""
    from pgrace import api

    variants = _both_variants(loaded, picked_variant)
    if live:
        raise click.UsageError("--compare cannot be played live; run each variant with --step instead")
    if fmt not in COMPARE_FORMATS:
        raise click.UsageError(f"--compare shows --format {', '.join(COMPARE_FORMATS)}, not {fmt}")
    server = server_ready()
    report_swept(server)
    results = [api.run(v, server=server, options=options, allow_scratch_schema=allow_scratch_schema) for v in variants]
    if fmt == "html":
        from pgrace.render.html import render_html_compare

        text = render_html_compare(results)
    elif fmt == "svg":
        from pgrace.render.svg import render_svg_compare

        text = render_svg_compare(results)
    elif fmt == "markdown":
        from pgrace.render.markdown import render_markdown_compare

        text = render_markdown_compare(results)
    else:
        from pgrace.render.compare import render_text_compare
        from pgrace.render.text import Style

        text = render_text_compare(results, style or Style())
    _emit(text, output)
    sys.exit(0 if all(r.ok for r in results) else 1)


@main.command(epilog=EXIT_CODES_HELP)
@click.argument("paths", metavar="[PATH]...", nargs=-1, type=click.Path(path_type=str))
@click.option(
    "--server",
    "servers",
    multiple=True,
    metavar="SERVER",
    help="Run on this server; repeat for a side-by-side matrix. 'embedded', a connection string, "
    "a PostgreSQL bin directory (e.g. /usr/lib/postgresql/15/bin) or docker:IMAGE.",
)
@click.option("--dsn", envvar="PGRACE_DSN", help="Short for --server with a connection string.")
@click.option(
    "--golden", is_flag=True, help="Also compare each text timeline with NAME.VARIANT.out beside the scenario."
)
@click.option("--update", is_flag=True, help="(Re)write the golden timelines instead of comparing them.")
@click.option(
    "--junit",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    callback=_writable,
    help="Write JUnit XML to FILE.",
)
@click.option(
    "--expected",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="For a single .spec: compare with FILE (and FILE_N alternatives) instead of NAME.out.",
)
@step_timeout_option
@database_name_option
@click.option("--quiet", "-q", is_flag=True, help="Print failures and the total only.")
@click.option(
    "--explore",
    "explore_all",
    is_flag=True,
    help="Judge every interleaving: a bug must occur in one, a fix must hold in all.",
)
@_max_option("With --explore: a seeded sample of N")
@click.option("--seed", type=int, default=0, show_default=True, metavar="S", help="With --explore --max: the seed.")
@_jobs_option("With --explore: processes")
@superuser_option
def check(
    paths: tuple[str, ...],
    servers: tuple[str, ...],
    dsn: str | None,
    golden: bool,
    update: bool,
    junit: Path | None,
    expected: Path | None,
    step_timeout: float,
    database_name: str | None,
    quiet: bool,
    explore_all: bool,
    limit: int | None,
    seed: int,
    jobs: int,
    superuser: bool,
) -> None:
    """Run scenario files as regression checks: every expectation must hold.

    PATHs are scenario files (.toml) and isolation specs (.spec), or directories to search
    (default: scenarios/ if there is one here, else the shipped scenarios). Each variant of
    a scenario is one case; a spec's isolationtester output must match NAME.out (or
    ../expected/NAME.out, or NAME_N.out alternatives) byte for byte. With --explore, a bug
    passes when some interleaving reproduces it and a fix (or a scenario with one variant)
    when every interleaving satisfies its final checks. Exit code 1: a case
    failed; 2: a file could not be read (it is reported, the others still run).
    """
    from pgrace import regression
    from pgrace.render.check import render_invalid, render_matrix, render_results
    from pgrace.runner import RunOptions
    from pgrace.scratch import reusable_scratch_database
    from pgrace.servers import booting_server

    if not paths:  # scenarios/ here, else the shipped ones (an installed wheel carries them)
        from pgrace.catalog import shipped_dir

        paths = ("scenarios",) if Path("scenarios").is_dir() else (str(shipped_dir()),)
    targets: list[str | None] = [*servers, *([dsn] if dsn else [])]
    options = RunOptions(step_timeout=step_timeout)
    results: list[regression.CaseResult] = []
    with ExitStack() as stack:
        # pgrace's own servers boot, side by side, while the files are read.
        booting = [stack.enter_context(booting_server(t, superuser)) for t in (targets or [None])]
        invalid: list[ScenarioError] = []
        cases = regression.prepare(list(paths), golden=golden or update, expected=expected, invalid=invalid)
        refuse_overwriting_inputs(junit, [case.path for case in cases] + ([expected] if expected else []), "--junit")
        for error in invalid:  # reported at once, each on its line; the valid files still run
            click.echo(render_invalid(error), nl=False)
        if invalid and not cases:  # nothing to run: no server is needed to say so
            raise ScenarioError(f"no valid scenario files under {', '.join(paths)}")
        opened = [ready() for ready in booting]
        progress = stack.enter_context(_progress())
        progress.start("check", len(cases) * len(opened), "cases")
        for server in opened:
            report_swept(server)
            scratch = None  # specs share one scratch database per server, reset only when a spec leaves objects
            if not explore_all and any(case.spec is not None for case in cases):
                scratch = stack.enter_context(reusable_scratch_database(server, "check", database_name))
            for case in cases:
                if explore_all:

                    def interleaved(done: int, total: int, name: str = case.name) -> None:
                        if done == 0:
                            _long_exploration(progress, name, total, jobs)
                        progress.update(len(results), f"{name}: {done:,}/{total:,} interleavings")

                    result = regression.run_explore_case(case, server, options, limit, seed, jobs, interleaved)
                else:
                    result = regression.run_case(
                        case, server, options, update=update, database_name=database_name, scratch=scratch
                    )
                results.append(result)
                if not quiet or not result.ok:
                    progress.pause()  # the line is drawn again below the result
                    click.echo(render_results([result], with_server=len(opened) > 1), nl=False)
                progress.update(len(results))
        progress.close()
    if len(opened) > 1:
        click.echo(render_matrix(results, opened), nl=False)
    failed = sum(1 for r in results if not r.ok)
    updated = sum(1 for r in results if r.updated)
    total = f"{len(results)} checks: {len(results) - failed} passed, {failed} failed"
    if invalid:
        total += f"; {len(invalid)} invalid file{'s' if len(invalid) != 1 else ''} not run"
    if update:
        total += f"; {updated} golden timeline{'s' if updated != 1 else ''} written"
    click.echo(total)
    if junit is not None:
        from pgrace.render.junit import render_junit

        write_output(junit, render_junit(results, invalid))
    sys.exit(EXIT_INVALID if invalid else 1 if failed else 0)


@main.command(epilog=EXIT_CODES_HELP)
@click.option("--dsn", envvar="PGRACE_DSN", required=True, help="The server to clean (libpq URI or conninfo).")
def clean(dsn: str) -> None:
    """Remove scratch databases and schemas that killed pgrace runs left on a server."""
    from pgrace.pgbench import sweep_work_dirs
    from pgrace.scratch import sweep_leftovers
    from pgrace.servers import open_server

    with open_server(dsn) as server:
        swept = sweep_leftovers(server)
    for name in swept.removed:
        click.echo(f"removed {name}")
    for path in sweep_work_dirs():
        click.echo(visible(f"removed {path} (a killed pgrace load's work directory)"))
    for note in swept.skipped:
        click.echo(f"pgrace: {note}", err=True)
    removed = len(swept.removed)
    click.echo(f"{removed} leftover{'s' if removed != 1 else ''} removed from {server.label}")


def _render(result: Run, fmt: str, style: Style | None, counterpart: Scenario | None = None) -> str:
    if fmt == "json":
        from pgrace.render.json import render_json

        return render_json(result)
    if fmt == "isolation":
        from pgrace.render.isolation import render_isolation

        return render_isolation(result)
    if fmt == "html":
        from pgrace.render.html import render_html

        return render_html(result, counterpart)
    if fmt == "svg":
        from pgrace.render.svg import render_svg

        return render_svg(result)
    if fmt == "mermaid":
        from pgrace.render.mermaid import render_mermaid

        return render_mermaid(result)
    if fmt == "markdown":
        from pgrace.render.markdown import render_markdown

        return render_markdown(result, counterpart=counterpart)
    from pgrace.render.text import Style, render_text

    return render_text(result, style or Style())


# -- finding races: explore, sweep, matrix ----------------------------------------------------

EXPLORE_FORMATS = ("text", "json", "markdown", "html")


def _shard(value: str | None) -> tuple[int, int]:
    if value is None:
        return (1, 1)
    k, sep, n = value.partition("/")
    if not sep or not k.isdigit() or not n.isdigit() or not 1 <= int(k) <= int(n):
        raise click.BadParameter(f"{value!r} is not K/N with 1 ≤ K ≤ N", param_hint="--shard")
    return int(k), int(n)


def _emit(text: str, output: str | None) -> None:
    if output is not None:
        write_output(output, text)
    else:
        click.echo(text, nl=False)


server_option = click.option(
    "--server",
    "server_target",
    metavar="SERVER",
    help="Where to run: 'embedded', a connection string, a PostgreSQL bin directory or docker:IMAGE.",
)
dsn_option = click.option("--dsn", envvar="PGRACE_DSN", help="Use this server (libpq URI or conninfo).")
output_option = click.option(
    "--output", "-o", type=click.Path(dir_okay=False, writable=True), callback=_writable, help=OUTPUT_HELP
)


@main.command(epilog=EXIT_CODES_HELP)
@scenario_argument
@fix_option
@bug_option
@param_option
@_max_option("Explore a seeded sample of N")
@click.option("--seed", type=int, metavar="S", help="Seed of the --max sample (default 0).")
@click.option("--shard", metavar="K/N", help="Run only shard K of N (merge the JSON results with --merge).")
@_jobs_option("Processes at once")
@click.option("--show", type=click.IntRange(min=1), metavar="N", help="Print class N's example as a timeline.")
@click.option(
    "--no-reduce",
    is_flag=True,
    help="Run every interleaving, not one of each set of equivalent ones (-j, --shard and --max always do).",
)
@click.option(
    "--merge",
    "merge_files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    metavar="FILE",
    help="Merge the JSON results of shards (repeat) instead of running.",
)
@click.option("--format", "-f", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
@server_option
@dsn_option
@step_timeout_option
@output_option
@superuser_option
def explore(
    scenario: str,
    fix: bool,
    bug: bool,
    params: tuple[str, ...],
    limit: int | None,
    seed: int | None,
    shard: str | None,
    jobs: int,
    show: int | None,
    no_reduce: bool,
    merge_files: tuple[str, ...],
    fmt: str,
    server_target: str | None,
    dsn: str | None,
    step_timeout: float,
    output: str | None,
    superuser: bool,
) -> None:
    """Run every interleaving of a scenario's steps and print the classes of outcomes.

    Each session keeps its own order; the scenario's setup and teardown run around each
    interleaving. Interleavings are grouped by what the final checks saw and which
    SQLSTATEs the steps raised, each class with its count and its simplest example.
    """
    from pgrace import catalog
    from pgrace import explore as explorer
    from pgrace.render.text import Style, render_text
    from pgrace.servers import open_server

    chosen = _variant(catalog.load(scenario, _params(params)), fix, bug)
    refuse_overwriting_inputs(output, [chosen.source, *merge_files])
    if show is None and fmt not in EXPLORE_FORMATS:
        raise click.UsageError(f"explore prints --format {', '.join(EXPLORE_FORMATS)}; --show N prints any format")
    space = explorer.Space(chosen)
    if merge_files:
        texts = [(name, read_input(name)) for name in merge_files]
        result = explorer.merge_explorations(explorer.load_explorations(texts, space))
        if (result.scenario, result.variant) != (chosen.name, chosen.variant):
            raise ScenarioError(f"the files explored {result.scenario} ({result.variant}), not this scenario")
        _emit(_render_exploration(result, chosen, fmt, {}), output)
        return
    label = f"{chosen.name} ({chosen.variant})"
    with open_server(server_target or dsn, superuser) as server:
        report_swept(server)
        with _progress() as progress:
            reduced = not no_reduce and limit is None and shard is None and jobs == 1

            def explored(done: int, total: int) -> None:
                if done == 0:
                    if not reduced:
                        _long_exploration(progress, label, total, jobs)
                    progress.start(label, total, "runs" if reduced else "interleavings")
                progress.total = total  # a reduced search learns of the runs left as it goes
                progress.update(done)

            result = explorer.explore(
                chosen,
                server,
                limit=limit,
                seed=(seed if seed is not None else 0) if limit is not None else None,
                shard=_shard(shard),
                jobs=jobs,
                step_timeout=step_timeout,
                on_progress=explored,
                reduce=not no_reduce,
            )
        wanted = [show] if show is not None else list(range(1, len(result.classes) + 1)) if fmt == "html" else []
        examples = {
            n: explorer.replay(chosen, server, result.classes[n - 1], step_timeout)
            for n in wanted
            if n <= len(result.classes)
        }
    if show is not None:
        if show > len(result.classes):
            raise click.BadParameter(
                f"there {'is' if len(result.classes) == 1 else 'are'} {len(result.classes)} classes",
                param_hint="--show",
            )
        replayed = examples[show]
        if not explorer.same_class(replayed, result.classes[show - 1]):
            click.echo(f"pgrace: class {show}'s example ended differently when replayed", err=True)
        _emit(_render(replayed, fmt, Style(colour=False, width=120)), output)
        return
    timelines = {n: render_text(run, Style(colour=False, width=120)) for n, run in examples.items()}
    _emit(_render_exploration(result, chosen, fmt, timelines), output)


def _render_exploration(result: Any, scenario: Scenario, fmt: str, timelines: dict[int, str]) -> str:
    from pgrace.render import outcomes as render

    if fmt == "json":
        return render.render_exploration_json(result)
    if fmt == "markdown":
        return render.render_exploration_markdown(result, scenario)
    if fmt == "html":
        return render.render_exploration_html(result, scenario, timelines)
    return render.render_exploration_text(result, scenario)


@main.command(epilog=EXIT_CODES_HELP)
@click.option("--format", "-f", "fmt", type=click.Choice(EXPLORE_FORMATS), default="text", show_default=True)
@server_option
@dsn_option
@step_timeout_option
@output_option
@superuser_option
def matrix(
    fmt: str, server_target: str | None, dsn: str | None, step_timeout: float, output: str | None, superuser: bool
) -> None:
    """Measure the row-lock and table-lock conflict tables on the server, against the manual's.

    Each cell is two real sessions: one holds a lock, the other requests one; the server
    says whether it blocks. Exit status 1 when a cell differs from PostgreSQL's documented
    tables (Explicit Locking, tables 13.2 and 13.3).
    """
    from pgrace import matrix as lock_matrix
    from pgrace.render import outcomes as render
    from pgrace.servers import open_server

    with open_server(server_target or dsn, superuser) as server:
        report_swept(server)
        measured = lock_matrix.measure(server, step_timeout=step_timeout)
    if fmt == "json":
        text = render.render_matrix_json(measured)
    elif fmt == "markdown":
        text = render.render_matrix_markdown(measured)
    elif fmt == "html":
        text = render.render_matrix_html(measured)
    else:
        text = render.render_matrix_text(measured)
    _emit(text, output)
    sys.exit(1 if measured.row.disagreements or measured.table.disagreements else 0)


def _sweep_params(values: tuple[str, ...]) -> dict[str, list[str]]:
    params: dict[str, list[str]] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name or not all(v.strip() for v in value.split(",")):
            raise click.BadParameter(f"{item!r} is not NAME=VALUE[,VALUE...]", param_hint="--param")
        params[name] = [v.strip() for v in value.split(",")]
    return params


@main.command(epilog=EXIT_CODES_HELP)
@click.argument("scenarios", metavar="SCENARIO...", nargs=-1, required=True)
@fix_option
@bug_option
@click.option(
    "--param",
    "-p",
    "params",
    multiple=True,
    metavar="NAME=V1,V2",
    help="A parameter and the values to try, e.g. -p level=read-committed,serializable (repeat).",
)
@click.option("--explore", "explore_cells", is_flag=True, help="Explore every interleaving of each combination.")
@_max_option("With --explore: a seeded sample of N")
@click.option("--seed", type=int, default=0, show_default=True, metavar="S", help="With --explore --max: the seed.")
@_jobs_option("With --explore: processes")
@click.option("--format", "-f", "fmt", type=click.Choice(EXPLORE_FORMATS), default="text", show_default=True)
@server_option
@dsn_option
@step_timeout_option
@output_option
@superuser_option
def sweep(
    scenarios: tuple[str, ...],
    fix: bool,
    bug: bool,
    params: tuple[str, ...],
    explore_cells: bool,
    limit: int | None,
    seed: int,
    jobs: int,
    fmt: str,
    server_target: str | None,
    dsn: str | None,
    step_timeout: float,
    output: str | None,
    superuser: bool,
) -> None:
    """Run scenarios under every combination of parameter values; print the grid of outcomes.

    A bug variant's cell says whether the anomaly its final checks describe "occurs" or is
    "prevented" (by 40001, by blocking, or by neither); a fix's, whether its checks hold.
    """
    from pgrace import sweep as sweeper
    from pgrace.explore import replay
    from pgrace.render import outcomes as render
    from pgrace.render.text import Style, render_text
    from pgrace.servers import open_server

    if fix and bug:
        raise click.UsageError("--fix and --bug exclude each other")
    grid = _sweep_params(params)
    combinations = math.prod(len(values) for values in grid.values()) * len(scenarios)
    bounds.check_combinations(combinations)
    progress = _progress()
    if combinations > bounds.LONG_COMBINATIONS:
        progress.note(f"pgrace: {combinations:,} combinations to run")
    # Every combination is loaded once, up front: invalid input fails before a server starts.
    loaded = [sweeper.variants(ref, grid, "fix" if fix else "bug" if bug else None) for ref in scenarios]
    refuse_overwriting_inputs(output, [scenario.source for chosen in loaded for _, scenario in chosen])
    if explore_cells:
        _long_exploration(progress, "sweep", sum(sweeper.interleavings(c, limit) for c in loaded), jobs)
    timelines: dict[tuple[int, int, int], str] = {}
    with open_server(server_target or dsn, superuser) as server, progress:
        report_swept(server)
        progress.start("sweep", combinations, "combinations")
        results: list[sweeper.Sweep] = []
        for chosen in loaded:
            before = sum(len(c) for c in loaded[: len(results)])

            def combination_done(done: int, total: int, before: int = before) -> None:
                progress.update(before + done)

            def interleaved(done: int, total: int) -> None:
                progress.update(progress.done, f"{done:,}/{total:,} interleavings")

            results.append(
                sweeper.sweep(
                    chosen,
                    grid,
                    server,
                    explore=explore_cells,
                    limit=limit,
                    seed=seed if limit is not None else None,
                    jobs=jobs,
                    step_timeout=step_timeout,
                    on_cell=combination_done,
                    on_interleavings=interleaved,
                )
            )
        progress.close()
        if fmt == "html":
            for i, (chosen, result) in enumerate(zip(loaded, results, strict=True)):
                for j, ((_, scenario), cell) in enumerate(zip(chosen, result.cells, strict=True)):
                    for k, cls in enumerate(cell.classes):
                        run = replay(scenario, server, cls, step_timeout)
                        timelines[(i, j, k)] = render_text(run, Style(colour=False, width=120))
    if fmt == "json":
        text = render.render_sweep_json(results)
    elif fmt == "markdown":
        text = render.render_sweep_markdown(results)
    elif fmt == "html":
        text = render.render_sweep_html(results, timelines)
    else:
        text = render.render_sweep_text(results)
    _emit(text, output)


LOAD_FORMATS = ("text", "json", "svg", "html")


def _client_counts(raw: str) -> tuple[int, ...]:
    """``-c 1,2,4,8``: whole numbers from 1 to 1000, refused as one line (exit 2) otherwise."""
    counts: list[int] = []
    for part in raw.split(","):
        part = part.strip()
        if not (part.isascii() and part.isdigit()) or not 1 <= int(part) <= 1000:
            raise ScenarioError(f"-c/--clients is a list of client counts from 1 to 1000, like 1,2,4,8; not {raw!r}")
        counts.append(int(part))
    return tuple(counts)


def _whole(raw: str | None, option: str) -> int | None:
    if raw is None:
        return None
    if not (raw.strip().isascii() and raw.strip().isdigit()) or not 1 <= int(raw) <= 86400:
        raise ScenarioError(f"{option} is a whole number from 1 to 86400, not {raw!r}")
    return int(raw)


@main.command(
    epilog=EXIT_CODES_HELP.replace(
        "  2    invalid input",
        "  1    (load) an invariant was violated, or pgbench could not run the transaction\n  2    invalid input",
    ).replace(
        "  3    no server could be had",
        "  3    no server (or no pgbench) could be had",
    )
)
@scenario_argument
@fix_option
@bug_option
@param_option
@click.option("--compare", is_flag=True, help="Run the bug and the fix; one table and one plot.")
@click.option(
    "--clients", "-c", "clients", default="1,2,4,8", show_default=True, help="Client counts, one pgbench run each."
)
@click.option(
    "--time", "-T", "duration", default=None, metavar="SECONDS", help="Seconds per client count [default: 5]."
)
@click.option("--transactions", "-t", default=None, metavar="N", help="Transactions per client instead of -T.")
@click.option("--format", "-f", "fmt", type=click.Choice(LOAD_FORMATS), default="text", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), callback=_writable, help=OUTPUT_HELP)
@click.option("--dsn", envvar="PGRACE_DSN", help="Use this server instead of the embedded one.")
@click.option("--server", "server_target", metavar="SERVER", help="'embedded', a connection string or a bin directory.")
@click.option(
    "--pgbench", "pgbench_path", metavar="PATH", help="The pgbench to run (default: the server's own, or PATH)."
)
@click.option(
    "--emit",
    "emit_dir",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Write the pgbench script and the setup and check SQL to DIR, and run nothing.",
)
def load(
    scenario: str,
    fix: bool,
    bug: bool,
    params: tuple[str, ...],
    compare: bool,
    clients: str,
    duration: str | None,
    transactions: str | None,
    fmt: str,
    output: str | None,
    dsn: str | None,
    server_target: str | None,
    pgbench_path: str | None,
    emit_dir: Path | None,
) -> None:
    """Run the scenario's [load] transaction with pgbench at each client count; count what went wrong.

    Per client count: transactions per second, latency p50/p95/p99, failures and retries,
    the most clients waiting on a lock at once (and on what), and every invariant of the
    [load] section that did not hold. Each count starts from a fresh scratch database.
    """
    from pgrace import catalog
    from pgrace import pgbench as engine
    from pgrace.render.load import render_load
    from pgrace.servers import open_server

    loaded = catalog.load(scenario, _params(params))
    refuse_overwriting_inputs(output, [loaded.source])
    counts = _client_counts(clients)
    seconds = _whole(duration, "-T/--time")
    per_client = _whole(transactions, "-t/--transactions")
    if seconds is not None and per_client is not None:
        raise ScenarioError("-T/--time and -t/--transactions exclude each other")
    variants = _both_variants(loaded, fix or bug) if compare else [_variant(loaded, fix, bug)]
    for variant in variants:
        engine.pgbench_script(variant)  # invalid input (no [load], a stray :name) fails before a server starts
    if emit_dir is not None:
        for variant in variants:
            for path in engine.emit(variant, emit_dir):
                click.echo(str(path))
        return
    progress = _progress()  # on a terminal: each client count's figures, and the counts done so far

    def measured(result: engine.LoadResult, run: engine.ClientRun) -> None:
        if progress.live:
            progress.note(
                f"{result.scenario} {result.variant}: {run.clients} clients, {run.tps:.1f} tps, "
                f"p95 {run.latency_ms['p95']} ms, {run.lock_waiters_max} waiting at most, "
                f"{len(run.violations)} violations"
            )
        progress.update(progress.done + 1)

    options = engine.LoadOptions(
        clients=counts,
        duration=None if per_client is not None else float(seconds or 5),
        transactions=per_client,
        pgbench=pgbench_path,
        on_progress=measured,
    )
    results: list[engine.LoadResult] = []
    try:
        with open_server(server_target or dsn) as server, progress:
            report_swept(server)
            progress.start(f"load {loaded.name}", len(variants) * len(counts), "client counts")
            for variant in variants:
                results.append(engine.run_load(variant, server, options))
    except KeyboardInterrupt as exc:
        partial = getattr(exc, "partial", None)
        if partial is not None:
            results.append(partial)
        if results:
            with suppress(Exception):
                _emit(render_load(results, fmt), output)
        raise
    _emit(render_load(results, fmt), output)
    sys.exit(1 if any(run.violations for result in results for run in result.runs) else 0)
