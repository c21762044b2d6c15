"""The ``pgrace`` group, the options its commands share, and the one place errors reach the user.

Errors become one line on stderr and the error's exit code in :class:`PgraceGroup`:
0 ran and every expectation held, 1 an expectation did not hold, 2 invalid input,
3 no server could be had. The commands, in the modules beside this one, parse options,
call one library function and render.
"""

from __future__ import annotations

import os
import signal
import sys
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.shell_completion import CompletionItem

from pgrace import __version__, bounds
from pgrace.cli.exits import exit_code_of_interrupt, lost_server, raise_terminated, report_internal_error
from pgrace.cli.types import Duration, Setting
from pgrace.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERNAL,
    EXIT_NO_SERVER,
    EXIT_SIGTERM,
    OptionError,
    PgraceError,
    ScenarioError,
)
from pgrace.files import write_output
from pgrace.render import formats
from pgrace.text import visible

# Each command imports what it needs when it runs: psycopg, the runner and the renderers
# cost more than a short run itself (tests/test_import_cost.py checks that importing this
# module pulls in none of them).
if TYPE_CHECKING:
    from collections.abc import Callable

    from pgrace.cli.terminal.progress import Progress
    from pgrace.drivers.searches import SearchMode
    from pgrace.model.scenario import Scenario
    from pgrace.render.text import Style
    from pgrace.servers import ServerInfo

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
            if (gone := lost_server(exc)) is not None:
                click.echo(f"pgrace: {gone}", err=True)
                ctx.exit(EXIT_NO_SERVER)
            report_internal_error(exc)
            ctx.exit(EXIT_INTERNAL)
        finally:
            _forget_secrets()
            # Cleanup is done: a late SIGTERM (e.g. during interpreter shutdown) just ends the process.
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


class PgraceCommand(click.Command):
    """Says the library's word on a parameter (:class:`OptionError`) as click says it of the option that sets it."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OptionError as exc:
            if exc.parameter is None:
                raise click.UsageError(exc.message, ctx) from None
            raise click.BadParameter(exc.message, ctx, param_hint=self.option_setting(exc.parameter)) from None

    def option_setting(self, parameter: str) -> str:
        """The option that sets the library's ``parameter``: the one of that name in the command (``limit`` is
        ``--max``), else the one spelt as it (``minimize`` is ``--minimize``)."""
        options = [param for param in self.params if isinstance(param, click.Option)]
        for option in options:
            if option.name == parameter:
                return max(option.opts, key=len)
        spelt = f"--{parameter.replace('_', '-')}"
        return spelt if any(spelt in option.opts for option in options) else parameter


PgraceGroup.command_class = PgraceCommand


def _forget_secrets() -> None:
    """A command's DSN secrets are scrubbed from that command's messages only, never from a later command's
    (in one process, e.g. under a test runner, a password like ``sql`` would blank out words forever)."""
    servers = sys.modules.get("pgrace.servers")  # not imported yet: nothing remembered, nothing to import
    if servers is not None:
        servers.forget_secrets()


def jobs_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``-j N``: refused above what this machine can run (exit 2), before anything starts."""

    def bounded(ctx: click.Context, param: click.Parameter, value: int) -> int:
        try:
            bounds.check_jobs(value)
        except OptionError as exc:
            raise click.BadParameter(exc.message, ctx, param) from None
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


def max_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--max N``: a sample of at most bounds.MAX_SAMPLE interleavings (exit 2 above it)."""

    def bounded(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
        try:
            bounds.check_sample(value)
        except OptionError as exc:
            raise click.BadParameter(exc.message, ctx, param) from None
        return value

    return click.option(
        "--max",
        "limit",
        type=click.IntRange(min=1),
        metavar="N",
        callback=bounded,
        help=f"{help_text} (N at most {bounds.MAX_SAMPLE:,}).",
    )


def writable(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
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


def complete_scenario(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Shell completion of SCENARIO: the shipped names that fit, then files, as the shell lists them."""
    from pgrace.frontends.catalog import shipped_names

    names = [CompletionItem(name) for name in shipped_names() if name.startswith(incomplete)]
    return [*names, CompletionItem(incomplete, type="file")]


# -- the options every command shares, declared once ------------------------------------------

SERVER_HELP = "Where to run: 'embedded', a connection string, a PostgreSQL bin directory or docker:IMAGE."
scenario_argument = click.argument("scenario", metavar="SCENARIO", shell_complete=complete_scenario)
fix_option = click.option("--fix", is_flag=True, help="Run the variant with the cure applied.")
bug_option = click.option("--bug", is_flag=True, help="Run the variant that shows the bug.")
param_option = click.option(
    "--param",
    "-p",
    "params",
    type=Setting(),
    multiple=True,
    metavar="NAME=VALUE",
    help="Set a scenario parameter, e.g. -p workers=5.",
)
server_option = click.option("--server", "server_target", metavar="SERVER", help=SERVER_HELP)
dsn_option = click.option(
    "--dsn",
    envvar="PGRACE_DSN",
    show_envvar=True,
    help="Use this server instead of the embedded one (libpq URI or conninfo).",
)
output_option = click.option(
    "--output", "-o", type=click.Path(dir_okay=False, writable=True), callback=writable, help=OUTPUT_HELP
)
step_timeout_option = click.option(
    "--step-timeout",
    type=Duration(),
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


def either(names: tuple[str, ...]) -> str:
    """``text, json, markdown or html``."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else "".join(names)


def format_option(kind: str, help_text: str = "Output format.") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--format``: the formats of ``kind`` in the registry (:mod:`pgrace.render.formats`), the first by default."""
    names = formats.names(kind)
    return click.option(
        "--format", "-f", "fmt", type=click.Choice(names), default=names[0], show_default=True, help=help_text
    )


# -- what the commands share --------------------------------------------------------------------


def search_of(
    limit: int | None, seed: int | None, max_preemptions: int | None, pct: int | None, reduce: bool = True
) -> SearchMode:
    """The one search ``--max``, ``--seed``, ``--max-preemptions``, ``--pct`` and ``--no-reduce`` ask for."""
    from pgrace.drivers.searches import Exhaustive, Pct, PreemptionBounded, Reduced, Sample

    if max_preemptions is not None and pct is not None:
        raise click.BadParameter("--max-preemptions and --pct are two searches: choose one", param_hint="--pct")
    if max_preemptions is not None:
        return PreemptionBounded(max_preemptions, limit)
    if pct is not None:
        return Pct(pct, limit, seed or 0)
    if limit is not None:
        return Sample(limit, seed or 0, reduce)
    return Reduced() if reduce else Exhaustive()


def bounded_flag(search: SearchMode) -> str | None:
    """The option that asked for a bounded search (None: not a bounded one)."""
    from pgrace.drivers.searches import Pct, PreemptionBounded

    return (
        "--max-preemptions" if isinstance(search, PreemptionBounded) else "--pct" if isinstance(search, Pct) else None
    )


def search_to_explore(
    explore: bool, limit: int | None, seed: int, max_preemptions: int | None, pct: int | None, jobs: int
) -> SearchMode | None:
    """check's and sweep's ``--explore`` and its search, refused in one line where the flags cannot mean it."""
    search = search_of(limit, seed, max_preemptions, pct)
    option = bounded_flag(search)
    if option is None:
        return search if explore else None
    if not explore:
        raise click.BadParameter(f"{option} bounds an exploration: add --explore", param_hint=option)
    if jobs != 1:
        raise click.BadParameter(f"{option} runs in one process: -j cannot split it", param_hint=option)
    if max_preemptions is not None and max_preemptions < 0:
        raise click.BadParameter(f"--max-preemptions {max_preemptions}: K is 0 or more", param_hint=option)
    if pct is not None and pct < 1:
        raise click.BadParameter(f"--pct {pct}: the depth D is 1 or more", param_hint=option)
    return search


def pick_variant(scenario: Scenario, fix: bool, bug: bool) -> Scenario:
    if fix and bug:
        raise click.UsageError("--fix and --bug exclude each other")
    from pgrace.frontends import catalog

    return catalog.variant(scenario, "fix" if fix else "bug" if bug else None)


def say(line: str) -> None:
    """What the library has to say on the way (a server mended, leftovers dropped): stderr, never stdout."""
    click.echo(f"pgrace: {line}", err=True)


def progress_line() -> Progress:
    """Progress on stderr when it is a terminal (drawn by the renderer; nothing off a terminal)."""
    from pgrace.cli.terminal.progress import Progress

    return Progress(sys.stderr)


def draw(kind: str, fmt: str, result: Any, style: Style | None = None, counterpart: Scenario | None = None) -> str:
    """``result`` (what the library function for ``kind`` returned) in format ``fmt``."""
    from pgrace.render.views import View

    return formats.render(kind, fmt, result, View(style, counterpart))


def tidied(server: ServerInfo) -> ServerInfo:
    """``server``, once what was mended to start it is said and what killed runs left on it is dropped."""
    from pgrace import api

    api.tidy(server, say)
    return server


def echo(text: str, output: str | None) -> None:
    """Write to ``output`` or stdout; a stdout that cannot take it (a full disk) is said as ``-o FILE`` says it."""
    if output is not None:
        write_output(output, text)
        return
    try:
        click.echo(text, nl=False)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise ScenarioError(f"cannot write: {exc.strerror or exc}", "stdout") from None


exec_option = click.option(
    "--exec",
    "commands",
    multiple=True,
    metavar="NAME=COMMAND",
    help="Run COMMAND (a shell command line) once per run instead of the file's steps, its connections through"
    " pgrace's proxy (DATABASE_URL and the PG* variables point there), each statement a step; repeatable. It"
    " replaces the command of that NAME in the file's [exec] table, or adds one.",
)
