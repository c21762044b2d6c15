"""From an incident to a scenario: ``pgrace from-log`` reads a server log's deadlock or lock wait."""

from __future__ import annotations

import sys

import click

from pgrace.cli.base import EXIT_CODES_HELP, echo, main, output_option, step_timeout_option
from pgrace.files import refuse_overwriting_inputs


@main.command("from-log", epilog=EXIT_CODES_HELP)
@click.argument("logfiles", metavar="LOGFILE...", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--dsn", "dsn", help="The incident's database, read only: the tables' DDL and rows.")
@click.option("--prefix", metavar="LINE_PREFIX", help="The server's log_line_prefix (default: detected).")
@click.option("--incident", "incident", type=click.IntRange(min=1), metavar="N", help="Write the Nth incident.")
@click.option("--list", "list_only", is_flag=True, help="List the incidents found, write nothing.")
@click.option("--no-verify", is_flag=True, help="Write the scenario without running it.")
@click.option(
    "--server",
    "server_target",
    metavar="SERVER",
    help="Where to verify: 'embedded' (default; PGRACE_DSN is not used), a connection string, a bin directory "
    "or docker:IMAGE. Never the incident's server; never as a superuser (a role is made for each run).",
)
@click.option(
    "--minimize",
    is_flag=True,
    help="Once it reproduced, shrink the scenario to the statements and rows the incident needs, and write that.",
)
@step_timeout_option
@output_option
def from_log_command(
    logfiles: tuple[str, ...],
    dsn: str | None,
    prefix: str | None,
    incident: int | None,
    list_only: bool,
    no_verify: bool,
    server_target: str | None,
    minimize: bool,
    step_timeout: float,
    output: str | None,
) -> None:
    """Turn a server log's deadlock or long lock wait into a scenario that reproduces it.

    Reads stderr logs (with their log_line_prefix), csvlog and jsonlog; writes the scenario
    to stdout or -o FILE and says on stderr what the log did not say and whether the
    scenario, run in a scratch database, brought the incident back (exit 1 if not). With
    --minimize, the scenario written is the smallest one that still reproduces it, and the
    removals tried are told on stderr.
    """
    from pgrace import api
    from pgrace.render.from_log import incident_list, report_lines

    refuse_overwriting_inputs(output, logfiles)
    result = api.from_log(
        list(logfiles),
        prefix=prefix,
        dsn=dsn,
        incident=incident,
        list_only=list_only,
        verify=not no_verify,
        server_target=server_target,
        step_timeout=step_timeout,
        minimize=minimize,
    )
    if list_only:
        echo("\n".join(incident_list(result)) + "\n", None)
        return
    for line in report_lines(result):
        click.echo(line, err=True)
    assert result.written is not None
    if result.minimized_text is not None:
        echo(result.minimized_text, output)
    else:
        echo(result.written.text + "\n", output)
    sys.exit(result.exit_code)
