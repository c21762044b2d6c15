"""Proving a scenario right or wrong: ``pgrace check``, ``explore``, ``sweep`` and ``matrix``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeVar

import click

from pgrace.cli.base import (
    EXIT_CODES_HELP,
    bounded_flag,
    bug_option,
    database_name_option,
    draw,
    dsn_option,
    echo,
    either,
    exec_option,
    fix_option,
    format_option,
    jobs_option,
    main,
    max_option,
    output_option,
    param_option,
    pick_variant,
    progress_line,
    say,
    scenario_argument,
    search_of,
    search_to_explore,
    seed_option,
    server_option,
    step_timeout_option,
    superuser_option,
    writable,
)
from pgrace.cli.types import CommaList, Setting, Shard
from pgrace.errors import OptionError, ScenarioError
from pgrace.files import refuse_overwriting_inputs
from pgrace.render import formats

F = TypeVar("F", bound=Callable[..., object])


def preemptions_option(what: str) -> Callable[[F], F]:
    return click.option("--max-preemptions", "max_preemptions", type=int, metavar="K", help=what)


def pct_option(what: str) -> Callable[[F], F]:
    return click.option("--pct", type=int, metavar="D", help=what)


BOUNDED_HELP = " a pass then says so, never as every interleaving"


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
    callback=writable,
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
    help="Judge every interleaving: a bug must occur in one, a fix must hold in all, and no step may"
    " raise an error it does not declare.",
)
@max_option("With --explore: a seeded sample of N (with --max-preemptions: at most N runs; with --pct: N schedules)")
@seed_option
@jobs_option("With --explore: processes")
@param_option
@preemptions_option("With --explore: every schedule with at most K preemptions;" + BOUNDED_HELP)
@pct_option("With --explore: PCT schedules of depth D;" + BOUNDED_HELP)
@superuser_option
@exec_option
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
    params: tuple[tuple[str, str], ...],
    max_preemptions: int | None,
    pct: int | None,
    superuser: bool,
    commands: tuple[str, ...],
) -> None:
    """Run scenario files as regression checks: every expectation must hold.

    PATHs are scenario files (.toml) and isolation specs (.spec), or directories to search
    (default: scenarios/ if there is one here, else the shipped scenarios). Each variant of
    a scenario is one case; a spec's isolationtester output must match NAME.out (or
    ../expected/NAME.out, or NAME_N.out alternatives) byte for byte. With --explore, the
    bug of a bug and a fix (or a scenario whose checks are all kind = "bug") passes when
    some interleaving reproduces it without an error no step declares, and anything else
    when no interleaving shows the bug or raises such an error; with --max-preemptions or
    --pct, over those schedules only, and its line says which. With --exec, the commands
    are each scenario case's sessions instead of its steps (with --explore, every order of
    their statements). Exit code 1: a case failed; 2: a file could not be read, or a
    command connected around pgrace's proxy (it is reported, the others still run).
    """
    from pgrace import api
    from pgrace.cli.terminal.stream import CheckStream
    from pgrace.render.check import render_summary

    targets: list[str | None] = [*servers, *([dsn] if dsn else [])]
    explore = search_to_explore(explore_all, limit, seed, max_preemptions, pct, jobs)
    if commands:
        refuse_with_commands(jobs, database_name)
    with progress_line() as progress:
        stream = CheckStream(lambda text: echo(text, None), progress, quiet, with_server=len(targets) > 1)
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
            explore=explore,
            jobs=jobs,
            params=dict(params),
            commands=commands,
            monitor=progress,
            on_invalid=stream.invalid,
            on_result=stream.result,
            on_note=say,
        )
    echo(render_summary(checked, update), None)
    sys.exit(checked.exit_code)


def refuse_with_commands(jobs: int, database_name: str | None) -> None:
    """What check does not do with ``--exec``: -j processes, a named database."""
    given = [
        option for option, value in (("--jobs", jobs != 1), ("--database-name", database_name is not None)) if value
    ]
    if given:
        raise click.BadParameter(
            "not with commands (--exec, a file's [exec]), whose runs go through one proxy over a scratch database of"
            " their own",
            param_hint=given[0],
        )


@main.command(epilog=EXIT_CODES_HELP)
@scenario_argument
@fix_option
@bug_option
@param_option
@max_option("Explore a seeded sample of N (with --max-preemptions: at most N runs; with --pct: N schedules)")
@click.option("--seed", type=int, metavar="S", help="Seed of the --max sample or of --pct (default 0).")
@click.option(
    "--max-preemptions",
    "max_preemptions",
    type=int,
    metavar="K",
    help="Run every schedule with at most K preemptions (switches away from a session that could go on).",
)
@click.option(
    "--pct",
    type=int,
    metavar="D",
    help="Run PCT schedules of depth D (100 unless --max says), stating the chance a depth-D bug was missed.",
)
@click.option(
    "--shard", type=Shard(), metavar="K/N", help="Run only shard K of N (merge the JSON results with --merge)."
)
@jobs_option("Processes at once")
@click.option("--show", type=click.IntRange(min=1), metavar="N", help="Print class N's example as a timeline.")
@click.option(
    "--no-reduce",
    is_flag=True,
    help="Run every interleaving, not one of each set of equivalent ones (--max always does).",
)
@click.option(
    "--minimize",
    "minimize_first",
    is_flag=True,
    help="Shrink the first failing class's example to the smallest scenario that fails the same way, and print it.",
)
@click.option(
    "--merge",
    "merge_files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    metavar="FILE",
    help="Merge the JSON results of shards (repeat) instead of running.",
)
@format_option("run", f"Output format: {either(formats.names('explore'))} for the classes; any format for --show N.")
@server_option
@dsn_option
@step_timeout_option
@output_option
@superuser_option
@exec_option
def explore(
    scenario: str,
    fix: bool,
    bug: bool,
    params: tuple[tuple[str, str], ...],
    limit: int | None,
    seed: int | None,
    max_preemptions: int | None,
    pct: int | None,
    shard: tuple[int, int] | None,
    jobs: int,
    show: int | None,
    no_reduce: bool,
    minimize_first: bool,
    merge_files: tuple[str, ...],
    fmt: str,
    server_target: str | None,
    dsn: str | None,
    step_timeout: float,
    output: str | None,
    superuser: bool,
    commands: tuple[str, ...],
) -> None:
    """Run every interleaving of a scenario's steps and print the classes of outcomes.

    Each session keeps its own order; the scenario's setup and teardown run around each
    interleaving. Interleavings are grouped by what the final checks saw and which
    SQLSTATEs the steps raised, each class with its count and its simplest example. Exit
    code 1 when the verdict fails: the bug of a bug and a fix (or a scenario of bug
    signatures) shown in no class without an undeclared error; otherwise, a class that
    shows the bug or raises an error no step declares.

    With commands (--exec, a file's [exec]) the steps are the statements they send: the
    whole search, a sample (--max) or a bounded search (--max-preemptions, --pct) runs in
    one process; shards, -j, merges and --minimize are refused.
    """
    from pgrace import api
    from pgrace.cli.terminal.playback import style_of
    from pgrace.frontends import catalog

    chosen = pick_variant(catalog.read_scenario(scenario, dict(params)), fix, bug)
    refuse_overwriting_inputs(output, [chosen.source, *merge_files])
    drawn = formats.names("explore")
    if show is None and fmt not in drawn:
        raise click.UsageError(f"explore prints --format {', '.join(drawn)}; --show N prints any format")
    if minimize_first and (show is not None or fmt not in ("text", "json")):
        raise click.UsageError("--minimize prints the classes and the minimized run as text or json, without --show")
    examples: list[int] | Literal["all"] = [show] if show is not None and not merge_files else []
    if show is None and fmt == "html":  # the page shows every class's example
        examples = "all"
    if max_preemptions is not None and pct is not None:
        raise ScenarioError("--max-preemptions and --pct are two searches: choose one")
    search = search_of(limit, seed, max_preemptions, pct, reduce=not no_reduce)
    shards = shard or (1, 1)
    if (option := bounded_flag(search)) is not None and no_reduce:
        raise ScenarioError(f"{option} runs its own schedules: --no-reduce has no meaning with it")
    if commands or chosen.commands:
        refuse_exec_explore(shard, jobs, merge_files, minimize_first)
        from pgrace import proxy

        try:
            found = proxy.explore_exec(
                chosen,
                commands,
                dsn=server_target or dsn,
                superuser=superuser,
                step_timeout=step_timeout,
                search=search,
                examples=examples,
                on_note=say,
            )
        except OptionError as exc:
            if exc.parameter != "search":
                raise
            raise ScenarioError(f"{option or '--max'} {exc.message}") from None
    else:
        if option is not None and (shards != (1, 1) or jobs != 1):
            raise ScenarioError(f"{option} runs in one process: --shard and -j cannot split it")
        with progress_line() as progress:
            try:
                found = api.explore(
                    chosen,
                    dsn=server_target or dsn,
                    superuser=superuser,
                    search=search,
                    shard=shards,
                    jobs=jobs,
                    step_timeout=step_timeout,
                    examples=examples,
                    merge=merge_files,
                    monitor=progress,
                    on_note=say,
                    minimize=minimize_first,
                )
            except OptionError as exc:
                if exc.parameter != "search" or option is None:
                    raise
                raise ScenarioError(f"{option} {exc.message}") from None
    if show is None or merge_files:  # a merge prints the classes (in text, for a format of runs only)
        echo(draw("explore", fmt if fmt in drawn else "text", found), output)
        sys.exit(found.exit_code)
    if show > len(classes := found.classes):
        raise click.BadParameter(
            f"there {'is' if len(classes) == 1 else 'are'} {len(classes)} classes", param_hint="--show"
        )
    if show in found.replayed_differently:
        click.echo(f"pgrace: class {show}'s example ended differently when replayed", err=True)
    echo(draw("run", fmt, found.examples[show], style_of(False, 120, False)), output)
    sys.exit(found.exit_code)


EXEC_SPLIT = (
    "each run of commands starts them again through one proxy, over one scratch database: the search's runs are"
    " not yet split"
)
EXEC_REFUSED = {
    "--shard": f"{EXEC_SPLIT} into shards",
    "--merge": f"{EXEC_SPLIT} into shards, so there are none to merge",
    "-j": f"{EXEC_SPLIT} across processes (each would need its own proxy and scratch database)",
    "--minimize": "minimizing removes statements, and a command's statements are its code: put the failing class's"
    " statements (--show N) in a scenario's steps and minimize that",
}
"""Why exploring commands takes none of these options."""


def refuse_exec_explore(
    shard: tuple[int, int] | None, jobs: int, merge_files: tuple[str, ...], minimize_first: bool
) -> None:
    """What exploring commands (``--exec``, a file's ``[exec]``) does not do: shards, -j processes, merges,
    minimizing; each refused in one line that says why."""
    given = [
        name
        for name, value in (
            ("--shard", shard is not None),
            ("-j", jobs != 1),
            ("--merge", bool(merge_files)),
            ("--minimize", minimize_first),
        )
        if value
    ]
    if given:
        raise click.UsageError(f"{given[0]} with commands (--exec, [exec]): {EXEC_REFUSED[given[0]]}")


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

    measured = api.matrix(dsn=server_target or dsn, superuser=superuser, step_timeout=step_timeout, on_note=say)
    echo(draw("matrix", fmt, measured), output)
    sys.exit(measured.exit_code)


SWEPT_VALUES = CommaList(click.STRING, "values", "read-committed,serializable")


@main.command(epilog=EXIT_CODES_HELP)
@click.argument("scenarios", metavar="SCENARIO...", nargs=-1, required=True)
@fix_option
@bug_option
@click.option(
    "--param",
    "-p",
    "params",
    multiple=True,
    type=Setting(SWEPT_VALUES),
    metavar="NAME=V1,V2",
    help="A parameter and the values to try, e.g. -p level=read-committed,serializable (repeat).",
)
@click.option("--explore", "explore_cells", is_flag=True, help="Explore every interleaving of each combination.")
@max_option("With --explore: a seeded sample of N (with --max-preemptions: at most N runs; with --pct: N schedules)")
@seed_option
@jobs_option("With --explore: processes")
@preemptions_option("With --explore: every schedule of each combination with at most K preemptions")
@pct_option("With --explore: PCT schedules of depth D of each combination")
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
    params: tuple[tuple[str, tuple[str, ...]], ...],
    explore_cells: bool,
    limit: int | None,
    seed: int,
    jobs: int,
    max_preemptions: int | None,
    pct: int | None,
    fmt: str,
    server_target: str | None,
    dsn: str | None,
    step_timeout: float,
    output: str | None,
    superuser: bool,
) -> None:
    """Run scenarios under every combination of parameter values; print the grid of outcomes.

    Where the checks are the anomaly's signature (kind = "bug"), a cell says whether it
    "occurs" or is "prevented" (by 40001, by blocking, or by neither); where they are
    invariants, whether they hold (an error no step declares fails the cell).
    """
    from pgrace import api

    if fix and bug:
        raise click.UsageError("--fix and --bug exclude each other")
    with progress_line() as progress:
        swept = api.sweep(
            scenarios,
            {name: list(values) for name, values in params},
            variant="fix" if fix else "bug" if bug else None,
            explore=search_to_explore(explore_cells, limit, seed, max_preemptions, pct, jobs),
            jobs=jobs,
            step_timeout=step_timeout,
            examples=fmt == "html",
            output=output,
            dsn=server_target or dsn,
            superuser=superuser,
            monitor=progress,
            on_note=say,
        )
    echo(draw("sweep", fmt, swept), output)
    sys.exit(swept.exit_code)


@main.command(epilog=EXIT_CODES_HELP)
@scenario_argument
@fix_option
@bug_option
@param_option
@click.option(
    "--class", "cls", type=click.IntRange(min=1), metavar="N", help="Start from class N of the scenario's exploration."
)
@click.option(
    "--order",
    type=CommaList(click.STRING, "step names", "a1,b1,a2"),
    metavar="STEP,STEP,...",
    help="Start from the steps in this order (default: the file's).",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, writable=True),
    callback=writable,
    help="Write the minimized scenario (TOML, the failure as its expectations) here, once it is verified.",
)
@click.option(
    "--spec",
    type=click.Path(dir_okay=False, writable=True),
    callback=writable,
    metavar="FILE",
    help="Write an isolation spec here and its expected .out beside it, once the real isolationtester agrees.",
)
@click.option(
    "--pytest",
    "pytest",
    type=click.Path(dir_okay=False, writable=True),
    callback=writable,
    metavar="FILE",
    help="Write a pytest test of the minimized scenario (-o) here, once it is seen to fail.",
)
@click.option(
    "--repeat",
    type=click.IntRange(min=1, max=100),
    metavar="N",
    help="Runs per candidate (default 1, or 5 when the failure may hang on timing or chance).",
)
@format_option("minimize", f"Output format of the report: {either(formats.names('minimize'))}.")
@server_option
@dsn_option
@step_timeout_option
@superuser_option
def minimize(
    scenario: str,
    fix: bool,
    bug: bool,
    params: tuple[tuple[str, str], ...],
    cls: int | None,
    order: tuple[str, ...] | None,
    output: str | None,
    spec: str | None,
    pytest: str | None,
    repeat: int | None,
    fmt: str,
    server_target: str | None,
    dsn: str | None,
    step_timeout: float,
    superuser: bool,
) -> None:
    """Shrink a failing run to the smallest scenario that still fails the same way.

    Starts from the file's order, class N of its exploration (--class) or an order of its
    steps (--order), and removes sessions, transactions, steps, setup statements and seed
    rows, keeping a removal only when the scenario still fails the same way on a reset
    scratch database: the same failing checks, the same SQLSTATEs on the same steps, the
    same waits. Prints each removal tried with its verdict and the minimized run; writes
    the scenario, a spec and a pytest test, each verified first. The bug variant by default.
    """
    from pgrace import api
    from pgrace.frontends import catalog

    file_scenario = catalog.read_scenario(scenario, dict(params))
    if fix and bug:
        raise click.UsageError("--fix and --bug exclude each other")
    wanted = "fix" if fix else "bug" if bug or "bug" in file_scenario.variants else None
    chosen = pick_variant(file_scenario, False, False) if wanted is None else catalog.variant(file_scenario, wanted)
    if cls is not None and order is not None:
        raise click.UsageError("--class and --order exclude each other")
    for path, parameter in ((output, "output"), (spec, "spec"), (pytest, "pytest")):
        refuse_overwriting_inputs(path, [chosen.source], parameter)
    found = api.minimize(
        chosen,
        dsn=server_target or dsn,
        superuser=superuser,
        cls=cls,
        order=order,
        output=output,
        spec=spec,
        pytest=pytest,
        step_timeout=step_timeout,
        repeats=repeat,
        on_note=say,
    )
    echo(draw("minimize", fmt, found), None)
    sys.exit(found.exit_code)
