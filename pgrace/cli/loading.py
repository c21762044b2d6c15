"""Under load: ``pgrace load`` runs a scenario's [load] transaction with pgbench."""

from __future__ import annotations

import sys
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING

import click

from pgrace import bounds
from pgrace.cli.base import (
    EXIT_CODES_HELP,
    bug_option,
    draw,
    dsn_option,
    echo,
    fix_option,
    format_option,
    main,
    output_option,
    param_option,
    pick_variant,
    progress_line,
    say,
    scenario_argument,
    server_option,
)
from pgrace.cli.types import CommaList, Duration
from pgrace.errors import Interrupted
from pgrace.files import refuse_overwriting_inputs

if TYPE_CHECKING:
    from pgrace.cli.terminal.progress import Progress
    from pgrace.model.load import ClientRun, Loaded, LoadSeries


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
    "--clients",
    "-c",
    "clients",
    type=CommaList(click.IntRange(1, bounds.MAX_CLIENTS), f"client counts from 1 to {bounds.MAX_CLIENTS}", "1,2,4,8"),
    default="1,2,4,8",
    show_default=True,
    help="Client counts, one pgbench run each.",
)
@click.option(
    "--time",
    "-T",
    "duration",
    type=Duration(whole=True, most=bounds.MAX_LOAD_SECONDS),
    default=None,
    metavar="SECONDS",
    help="Seconds per client count [default: 5].",
)
@click.option(
    "--transactions",
    "-t",
    type=click.IntRange(1, bounds.MAX_TRANSACTIONS),
    default=None,
    metavar="N",
    help="Transactions per client instead of -T.",
)
@click.option(
    "--setup-timeout",
    type=Duration(whole=True, most=bounds.MAX_LOAD_SECONDS),
    default=None,
    metavar="SECONDS",
    help="Cut each setup statement and each check after this long [default: 60].",
)
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
    params: tuple[tuple[str, str], ...],
    compare: bool,
    clients: tuple[int, ...],
    duration: float | None,
    transactions: int | None,
    setup_timeout: float | None,
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
    from pgrace import api
    from pgrace.frontends import catalog

    file_scenario = catalog.read_scenario(scenario, dict(params))
    refuse_overwriting_inputs(output, [file_scenario.source])
    if compare and (fix or bug):
        raise click.UsageError("--compare runs both variants; leave out --fix and --bug")
    if duration is not None and transactions is not None:
        raise click.UsageError("-T/--time and -t/--transactions exclude each other")
    progress = progress_line()  # on a terminal: each client count's figures, and the counts done so far
    try:
        done = api.load(
            file_scenario if compare else pick_variant(file_scenario, fix, bug),
            compare=compare,
            clients=clients,
            duration=duration,
            transactions=transactions,
            setup_timeout=setup_timeout,
            pgbench=pgbench_path,
            emit=emit_dir,
            dsn=server_target or dsn,
            monitor=progress,
            on_measured=lambda result, run: _measured(progress, result, run),
            on_note=say,
        )
    except Interrupted as exc:  # what was measured before Ctrl-C, then exit 130 as for any interrupt
        measured: Loaded = exc.partial
        if measured.series:
            with suppress(Exception):
                echo(draw("load", fmt, measured.series), output)
        raise
    for path in done.emitted:
        echo(f"{path}\n", None)
    if emit_dir is None:
        echo(draw("load", fmt, done.series), output)
        sys.exit(done.exit_code)


def _measured(progress: Progress, result: LoadSeries, run: ClientRun) -> None:
    """On a terminal, a client count's figures as soon as they are known."""
    if progress.live:
        progress.note(
            f"{result.scenario} {result.variant}: {run.clients} clients, {run.tps:.1f} tps, "
            f"p95 {run.latency_ms['p95']} ms, {run.lock_waiters_max} waiting at most, "
            f"{len(run.violations)} violations"
        )
    progress.update(progress.done + 1)
