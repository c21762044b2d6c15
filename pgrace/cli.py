"""The ``pgrace`` command: thin click commands over :mod:`pgrace.api`.

Each command parses options, calls one library function and renders. Errors reach the
user in exactly one place, :class:`PgraceGroup`, as one line and the error's exit code:
0 ran and every expectation held, 1 an expectation did not hold, 2 invalid input,
3 no server could be had.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import sys
from contextlib import nullcontext, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click
from click.shell_completion import CompletionItem

from pgrace import __version__, bounds
from pgrace.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERNAL,
    EXIT_INVALID,
    EXIT_SIGTERM,
    OptionError,
    PgraceError,
    ScenarioError,
    ScenarioFailed,
)
from pgrace.exits import exit_code_of_interrupt, raise_terminated, report_internal_error
from pgrace.files import read_input as read_input  # for commands that read a file named on the line
from pgrace.files import refuse_overwriting_inputs
from pgrace.render import formats
from pgrace.text import visible

# Each command imports what it needs when it runs: psycopg, the runner and the renderers
# cost more than a short run itself (tests/test_import_cost.py checks that importing this
# module pulls in none of them).
if TYPE_CHECKING:
    from collections.abc import Callable

    from pgrace.model import Scenario
    from pgrace.pgbench import ClientRun, LoadResult
    from pgrace.render.presenter import Presenter
    from pgrace.render.progress import Progress
    from pgrace.render.text import Style
    from pgrace.servers import ServerInfo
    from pgrace.timeline import Run

FORMATS = formats.names("run")  # the formats of one run; each command's are in pgrace.render.formats


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


class PgraceCommand(click.Command):
    """Says the library's word on an option (:class:`OptionError`) as click says it of a bad option."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OptionError as exc:
            if exc.option is None:
                raise click.UsageError(exc.message, ctx) from None
            raise click.BadParameter(exc.message, ctx, param_hint=exc.option) from None


PgraceGroup.command_class = PgraceCommand


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


def _writable(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Refuse an output file whose folder is missing or read-only before running anything (exit 2)."""
    if value is not None:
        folder = Path(value).parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise click.BadParameter(f"cannot write {value}: no writable folder {str(folder)!r}", ctx, param)
    return value


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


MAIN_HELP = """\b
Environment:
  PGRACE_DSN        the server to use when neither --dsn nor --server is given
                    (a libpq URI or conninfo; unset: the embedded PostgreSQL)
  PGRACE_CACHE_DIR  where the embedded server's template is kept
  PGRACE_DEBUG=1    a traceback with an internal error (exit 4)
  NO_COLOR          no colour, even on a terminal

\b
Shell completion of commands, options, shipped scenario names and files:
  bash, in ~/.bashrc:  eval "$(_PGRACE_COMPLETE=bash_source pgrace)"
  zsh, in ~/.zshrc:    eval "$(_PGRACE_COMPLETE=zsh_source pgrace)"
  fish:                _PGRACE_COMPLETE=fish_source pgrace | source

"""


@click.group(
    cls=PgraceGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=MAIN_HELP + EXIT_CODES_HELP
)
@click.version_option(version=__version__, prog_name="pgrace")
def main() -> None:
    """Reproduce PostgreSQL concurrency bugs on demand, against a real server."""


def _complete_scenario(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Shell completion of SCENARIO: the shipped names that fit, then files, as the shell lists them."""
    from pgrace.catalog import shipped_names

    names = [CompletionItem(name) for name in shipped_names() if name.startswith(incomplete)]
    return [*names, CompletionItem(incomplete, type="file")]


# -- the options every command shares, declared once ------------------------------------------

SERVER_HELP = "Where to run: 'embedded', a connection string, a PostgreSQL bin directory or docker:IMAGE."
scenario_argument = click.argument("scenario", metavar="SCENARIO", shell_complete=_complete_scenario)
fix_option = click.option("--fix", is_flag=True, help="Run the variant with the cure applied.")
bug_option = click.option("--bug", is_flag=True, help="Run the variant that shows the bug.")
param_option = click.option(
    "--param", "-p", "params", multiple=True, metavar="NAME=VALUE", help="Set a scenario parameter, e.g. -p workers=5."
)
server_option = click.option("--server", "server_target", metavar="SERVER", help=SERVER_HELP)
dsn_option = click.option(
    "--dsn",
    envvar="PGRACE_DSN",
    show_envvar=True,
    help="Use this server instead of the embedded one (libpq URI or conninfo).",
)
output_option = click.option(
    "--output", "-o", type=click.Path(dir_okay=False, writable=True), callback=_writable, help=OUTPUT_HELP
)
step_timeout_option = click.option(
    "--step-timeout",
    type=Seconds(),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="Cancel a step that cannot finish after this long.",
)
seed_option = click.option(
    "--seed", type=int, default=0, show_default=True, metavar="S", help="With --explore --max: the seed."
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


def _either(names: tuple[str, ...]) -> str:
    """``text, json, markdown or html``."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else "".join(names)


def format_option(kind: str, help_text: str = "Output format.") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--format``: the formats of ``kind`` in the registry (:mod:`pgrace.render.formats`), the first by default."""
    names = formats.names(kind)
    return click.option(
        "--format", "-f", "fmt", type=click.Choice(names), default=names[0], show_default=True, help=help_text
    )


# -- what the commands share --------------------------------------------------------------------


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


def _note(line: str) -> None:
    """What the library has to say on the way (a server mended, leftovers dropped): stderr, never stdout."""
    click.echo(f"pgrace: {line}", err=True)


def _progress() -> Progress:
    """Progress on stderr when it is a terminal (drawn by the renderer; nothing off a terminal)."""
    from pgrace.render.progress import Progress

    return Progress(sys.stderr)


def _draw(kind: str, fmt: str, result: Any, style: Style | None = None, counterpart: Scenario | None = None) -> str:
    """``result`` (what the library function for ``kind`` returned) in format ``fmt``."""
    from pgrace.render.views import View

    return formats.render(kind, fmt, result, View(style, counterpart))


def _render(result: Run, fmt: str, style: Style | None = None, counterpart: Scenario | None = None) -> str:
    """One run in format ``fmt``."""
    return _draw("run", fmt, result, style, counterpart)


def report_swept(server: ServerInfo) -> None:
    """Say what was mended to start the server; drop what killed runs left on it, and say so."""
    from pgrace import api

    api.tidy(server, _note)


def _emit(text: str, output: str | None) -> None:
    if output is not None:
        write_output(output, text)
    else:
        click.echo(text, nl=False)


def _shard(value: str | None) -> tuple[int, int]:
    if value is None:
        return (1, 1)
    k, sep, n = value.partition("/")
    if not sep or not k.isdigit() or not n.isdigit() or not 1 <= int(k) <= int(n):
        raise click.BadParameter(f"{value!r} is not K/N with 1 ≤ K ≤ N", param_hint="--shard")
    return int(k), int(n)


# -- reading scenarios: list, show ----------------------------------------------------------------


@main.command("list", epilog=EXIT_CODES_HELP)
@click.option(
    "--tag", "tags", multiple=True, metavar="TAG", help="Only scenarios with this tag (repeatable: all of them)."
)
@click.option("--topic", metavar="TOPIC", help="Only scenarios of this topic, e.g. 'job queue'.")
@format_option("list")
def list_command(tags: tuple[str, ...], topic: str | None, fmt: str) -> None:
    """List the shipped scenarios by topic, one line each, and the tags to filter them by."""
    from pgrace import catalog

    _emit(_draw("list", fmt, catalog.select(tags, topic)), None)


@main.command(epilog=EXIT_CODES_HELP)
@scenario_argument
@fix_option
@bug_option
@param_option
def show(scenario: str, fix: bool, bug: bool, params: tuple[str, ...]) -> None:
    """Show a scenario's story and steps without running it."""
    from pgrace import catalog
    from pgrace.render.listing import render_show

    loaded = catalog.load(scenario, _params(params))
    click.echo(render_show(loaded, _variant(loaded, fix, bug)), nl=False)


# -- one scenario: run ------------------------------------------------------------------------------


@main.command(epilog=EXIT_CODES_HELP)
@scenario_argument
@fix_option
@bug_option
@param_option
@format_option("run")
@dsn_option
@server_option
@click.option("--step", "step_by_step", is_flag=True, help="Presenter mode: press Enter to run each step.")
@click.option("--pace", type=Seconds(), metavar="SECONDS", help="Presenter mode: run one step every SECONDS.")
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
    from pgrace.servers import booting_server

    # pgrace's own server boots in other processes while the scenario loads and the driver is imported.
    with booting_server(server_target or dsn, superuser) as server_ready:
        from pgrace import catalog

        loaded = catalog.load(scenario, _params(params))
        from pgrace import api
        from pgrace.engine.options import RunOptions

        refuse_overwriting_inputs(output, [loaded.source])
        to_terminal = output is None and sys.stdout.isatty()
        live = bool(step_by_step or pace)
        if compare:
            _refuse_compare(fix or bug, live, fmt)
            style = _run_style(fmt, color, width, to_terminal)
            server = server_ready()
            report_swept(server)
            options = RunOptions(step_timeout=step_timeout, lock_kinds=lock_kinds)
            results = api.compare(loaded, server=server, options=options, allow_scratch_schema=allow_scratch_schema)
            _emit(_draw("compare", fmt, results, style), output)
            sys.exit(0 if all(r.ok for r in results) else 1)
        chosen = _variant(loaded, fix, bug)
        counterpart = loaded.other if chosen is loaded else loaded  # the other variant, for "the cure" or "the bug"
        presenter = None
        if live and (fmt == "text" or output is not None):
            style_live = _style(color, width, sys.stdout.isatty())
            presenter = _presenter(chosen, counterpart, style_live, pace, step_by_step, lock_kinds)
        else:
            # The engine and the renderer are imported while the run waits for its server and database.
            _import_ahead("pgrace.runner", "pgrace.render.views", f"pgrace.render.{fmt}")
        try:
            server = server_ready()
            options = RunOptions(
                step_timeout=step_timeout,
                lock_kinds=lock_kinds,
                before_step=presenter.before_step if presenter else None,
                on_event=presenter.on_event if presenter else None,
                on_idle=presenter.on_idle if presenter else None,
            )
            report_swept(server)
            with presenter or nullcontext():
                result = api.run(
                    chosen,
                    server=server,
                    options=options,
                    allow_scratch_schema=allow_scratch_schema,
                    database_name=database_name,
                )
                if presenter is not None:
                    presenter.finish(result)
        except ScenarioFailed as failed:
            # As isolationtester: what ran until then, then why it stopped (on stderr, exit 1).
            if failed.run is not None and presenter is None:
                _show_run(failed.run, fmt, _run_style(fmt, color, width, to_terminal), counterpart, output, to_terminal)
            raise
        style = _run_style(fmt, color, width, to_terminal)
        _show_run(result, fmt, style, counterpart, output, to_terminal if presenter is None else None)
        for note in api.teardown_failures(result) if fmt != "isolation" else []:
            click.echo(f"pgrace: note: {note}", err=True)
        sys.exit(0 if result.ok else 1)


def _presenter(
    chosen: Scenario,
    counterpart: Scenario | None,
    style: Style,
    pace: float | None,
    step_by_step: bool,
    lock_kinds: Literal["rows", "all"],
) -> Presenter:
    """Live playback: a step every ``pace`` seconds, or at each Enter."""
    from pgrace.render.presenter import Presenter

    return Presenter(
        chosen, style, pace=pace, step_by_step=step_by_step, counterpart=counterpart, lock_kinds=lock_kinds
    )


def _style(color: bool | None, width: int | None, on_terminal: bool) -> Style:
    """``--color`` and ``--width``, or what the terminal (or its absence, and NO_COLOR) says."""
    from pgrace.render.text import Style

    colour = color if color is not None else (on_terminal and "NO_COLOR" not in os.environ)
    return Style(colour=colour, width=width or (shutil.get_terminal_size().columns if on_terminal else 120))


def _run_style(fmt: str, color: bool | None, width: int | None, on_terminal: bool) -> Style | None:
    """The text timeline's style; no other format has one (nor imports the text renderer)."""
    return _style(color, width, on_terminal) if fmt == "text" else None


def _import_ahead(*modules: str) -> None:
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


def _refuse_compare(picked_variant: bool, live: bool, fmt: str) -> None:
    """What ``run --compare`` cannot do: one variant, live playback, a format of one run only."""
    if picked_variant:
        raise click.UsageError("--compare runs both variants; leave out --fix and --bug")
    if live:
        raise click.UsageError("--compare cannot be played live; run each variant with --step instead")
    if fmt not in formats.names("compare"):
        raise click.UsageError(f"--compare shows --format {', '.join(formats.names('compare'))}, not {fmt}")


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


# -- regression checks: check, and clean ------------------------------------------------------------


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
@dsn_option
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
@seed_option
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
    from pgrace import api
    from pgrace.regression import CaseResult
    from pgrace.render.check import render_invalid, render_matrix, render_results, render_total

    targets: list[str | None] = [*servers, *([dsn] if dsn else [])]
    with _progress() as progress:

        def shown(result: CaseResult) -> None:
            if not quiet or not result.ok:
                progress.pause()  # the line is drawn again below the result
                click.echo(render_results([result], with_server=len(targets) > 1), nl=False)

        checked = api.check(
            paths,
            servers=targets or [None],
            superuser=superuser,
            golden=golden,
            update=update,
            expected=expected,
            junit=junit,
            step_timeout=step_timeout,
            database_name=database_name,
            explore=explore_all,
            limit=limit,
            seed=seed,
            jobs=jobs,
            monitor=progress,
            on_invalid=lambda error: click.echo(render_invalid(error), nl=False),
            on_result=shown,
            on_note=_note,
        )
    if len(checked.servers) > 1:
        click.echo(render_matrix(checked.results, checked.servers), nl=False)
    click.echo(render_total(checked, update))
    if junit is not None:
        from pgrace.render.junit import render_junit

        write_output(junit, render_junit(checked.results, checked.invalid))
    sys.exit(EXIT_INVALID if checked.invalid else 1 if checked.failed else 0)


@main.command(epilog=EXIT_CODES_HELP)
@click.option(
    "--dsn", envvar="PGRACE_DSN", show_envvar=True, required=True, help="The server to clean (libpq URI or conninfo)."
)
def clean(dsn: str) -> None:
    """Remove scratch databases and schemas that killed pgrace runs left on a server."""
    from pgrace import api

    cleaned = api.clean(dsn)
    for name in cleaned.removed:
        click.echo(f"removed {name}")
    for path in cleaned.work_dirs:
        click.echo(visible(f"removed {path} (a killed pgrace load's work directory)"))
    for note in cleaned.skipped:
        _note(note)
    removed = len(cleaned.removed)
    click.echo(f"{removed} leftover{'s' if removed != 1 else ''} removed from {cleaned.server}")


@main.command("from-log", epilog=EXIT_CODES_HELP)
@click.argument("logfiles", metavar="LOGFILE...", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--dsn", "incident_dsn", help="The incident's database, read only: the tables' DDL and rows.")
@click.option("--prefix", metavar="LINE_PREFIX", help="The server's log_line_prefix (default: detected).")
@click.option("--incident", "number", type=click.IntRange(min=1), metavar="N", help="Write the Nth incident.")
@click.option("--list", "list_only", is_flag=True, help="List the incidents found, write nothing.")
@click.option("--no-verify", is_flag=True, help="Write the scenario without running it.")
@click.option(
    "--server",
    "server_target",
    metavar="SERVER",
    help="Where to verify: 'embedded' (default), a connection string, a bin directory or docker:IMAGE.",
)
@output_option
def from_log_command(
    logfiles: tuple[str, ...],
    incident_dsn: str | None,
    prefix: str | None,
    number: int | None,
    list_only: bool,
    no_verify: bool,
    server_target: str | None,
    output: str | None,
) -> None:
    """Turn a server log's deadlock or long lock wait into a scenario that reproduces it.

    Reads stderr logs (with their log_line_prefix), csvlog and jsonlog; writes the scenario
    to stdout or -o FILE and says on stderr what the log did not say and whether the
    scenario, run in a scratch database, brought the incident back (exit 1 if not).
    """
    from pgrace.fromlog import from_log
    from pgrace.fromlog.report import incident_list, report_lines

    refuse_overwriting_inputs(output, logfiles)
    result = from_log(
        list(logfiles),
        prefix=prefix,
        dsn=incident_dsn,
        incident=number,
        list_only=list_only,
        verify=not no_verify,
        server_target=server_target,
    )
    if list_only:
        click.echo("\n".join(incident_list(result)))
        return
    for line in report_lines(result):
        click.echo(line, err=True)
    assert result.written is not None
    _emit(result.written.text + "\n", output)
    sys.exit(0 if result.verified is None or result.verified.reproduced else 1)


# -- finding races: explore, sweep, matrix ----------------------------------------------------


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
@format_option("run", f"Output format: {_either(formats.names('explore'))} for the classes; any format for --show N.")
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
    from pgrace import api, catalog

    chosen = _variant(catalog.load(scenario, _params(params)), fix, bug)
    refuse_overwriting_inputs(output, [chosen.source, *merge_files])
    drawn = formats.names("explore")
    if show is None and fmt not in drawn:
        raise click.UsageError(f"explore prints --format {', '.join(drawn)}; --show N prints any format")
    examples: list[int] | Literal["all"] = [show] if show is not None and not merge_files else []
    if show is None and fmt == "html":  # the page shows every class's example
        examples = "all"
    with _progress() as progress:
        found = api.explore(
            chosen,
            dsn=server_target or dsn,
            superuser=superuser,
            limit=limit,
            seed=seed,
            shard=_shard(shard),
            jobs=jobs,
            step_timeout=step_timeout,
            examples=examples,
            merge=merge_files,
            monitor=progress,
            on_note=_note,
            reduce=not no_reduce,
        )
    if show is None or merge_files:  # a merge prints the classes (in text, for a format of runs only)
        _emit(_draw("explore", fmt if fmt in drawn else "text", found), output)
        return
    if show > len(classes := found.exploration.classes):
        raise click.BadParameter(
            f"there {'is' if len(classes) == 1 else 'are'} {len(classes)} classes", param_hint="--show"
        )
    if show in found.replayed_differently:
        click.echo(f"pgrace: class {show}'s example ended differently when replayed", err=True)
    _emit(_render(found.examples[show], fmt, _style(False, 120, False)), output)


@main.command(epilog=EXIT_CODES_HELP)
@format_option("matrix")
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
    from pgrace import api

    measured = api.matrix(dsn=server_target or dsn, superuser=superuser, step_timeout=step_timeout, on_note=_note)
    _emit(_draw("matrix", fmt, measured), output)
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
@seed_option
@_jobs_option("With --explore: processes")
@format_option("sweep")
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
    from pgrace import api

    if fix and bug:
        raise click.UsageError("--fix and --bug exclude each other")
    with _progress() as progress:
        swept = api.sweep(
            scenarios,
            _sweep_params(params),
            variant="fix" if fix else "bug" if bug else None,
            explore=explore_cells,
            limit=limit,
            seed=seed,
            jobs=jobs,
            step_timeout=step_timeout,
            examples=fmt == "html",
            output=output,
            dsn=server_target or dsn,
            superuser=superuser,
            monitor=progress,
            on_note=_note,
        )
    _emit(_draw("sweep", fmt, swept), output)


# -- under load: pgbench ----------------------------------------------------------------------------


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
@format_option("load", "Output format: svg is the plot, html the table and the plot in one page.")
@output_option
@dsn_option
@server_option
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
    from pgrace import api, catalog

    loaded = catalog.load(scenario, _params(params))
    refuse_overwriting_inputs(output, [loaded.source])
    if compare and (fix or bug):
        raise click.UsageError("--compare runs both variants; leave out --fix and --bug")
    progress = _progress()  # on a terminal: each client count's figures, and the counts done so far
    try:
        done = api.load(
            loaded if compare else _variant(loaded, fix, bug),
            compare=compare,
            clients=clients,
            duration=duration,
            transactions=transactions,
            pgbench=pgbench_path,
            emit=emit_dir,
            dsn=server_target or dsn,
            monitor=progress,
            on_measured=lambda result, run: _measured(progress, result, run),
            on_note=_note,
        )
    except KeyboardInterrupt as exc:
        partial = getattr(exc, "loaded", None)
        if partial is not None and partial.results:
            with suppress(Exception):
                _emit(_draw("load", fmt, partial.results), output)
        raise
    for path in done.emitted:
        click.echo(str(path))
    if emit_dir is None:
        _emit(_draw("load", fmt, done.results), output)
        sys.exit(0 if done.ok else 1)


def _measured(progress: Progress, result: LoadResult, run: ClientRun) -> None:
    """On a terminal, a client count's figures as soon as they are known."""
    if progress.live:
        progress.note(
            f"{result.scenario} {result.variant}: {run.clients} clients, {run.tps:.1f} tps, "
            f"p95 {run.latency_ms['p95']} ms, {run.lock_waiters_max} waiting at most, "
            f"{len(run.violations)} violations"
        )
    progress.update(progress.done + 1)
