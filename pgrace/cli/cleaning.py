"""Tidying a server: ``pgrace clean`` removes what killed runs left behind."""

from __future__ import annotations

import sys

import click

from pgrace.cli.base import EXIT_CODES_HELP, echo, main, say
from pgrace.text import visible


@main.command(epilog=EXIT_CODES_HELP)
@click.option(
    "--dsn", envvar="PGRACE_DSN", show_envvar=True, required=True, help="The server to clean (libpq URI or conninfo)."
)
def clean(dsn: str) -> None:
    """Remove scratch databases and schemas that killed pgrace runs left on a server."""
    from pgrace import api

    cleaned = api.clean(dsn)
    for name in cleaned.removed:
        echo(f"removed {name}\n", None)
    for path in cleaned.work_dirs:
        echo(visible(f"removed {path} (a killed pgrace load's work directory)") + "\n", None)
    for note in cleaned.skipped:
        say(note)
    removed = len(cleaned.removed)
    echo(f"{removed} leftover{'s' if removed != 1 else ''} removed from {cleaned.server}\n", None)
    sys.exit(cleaned.exit_code)
