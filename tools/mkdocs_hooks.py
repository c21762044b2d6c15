"""Build-time pieces of the documentation site (mkdocs hooks, named in mkdocs.yml).

A line ``<!-- help: pgrace CMD -->`` in a page becomes, when the site is built, that
command's ``--help`` as the code being documented prints it, so the reference cannot
drift from the CLI. tests/test_docs.py checks that every command has such a line.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HELP = re.compile(r"^<!-- help: pgrace(?P<args>(?: [a-z][a-z-]*)*) -->$", re.MULTILINE)
WIDTH = 80  # as a terminal would show it, the same on every machine
ROOT = str(Path(__file__).resolve().parents[1])


def help_text(args: list[str]) -> str:
    """What ``pgrace ARGS --help`` prints, or an error naming the command that does not exist."""
    from click.testing import CliRunner

    if ROOT not in sys.path:  # the checkout being documented, whichever pgrace is installed
        sys.path.insert(0, ROOT)
    from pgrace.cli import main

    result = CliRunner().invoke(main, [*args, "--help"], prog_name="pgrace", terminal_width=WIDTH)
    if result.exit_code != 0:
        raise ValueError(f"`pgrace {' '.join(args)} --help` failed: {result.output.strip()}")
    return result.stdout


def with_help(markdown: str) -> str:
    """The page with each help marker followed by that command's help as a text block."""

    def block(match: re.Match[str]) -> str:
        return f"{match[0]}\n```text\n{help_text(match['args'].split())}```"

    return HELP.sub(block, markdown)


def on_page_markdown(markdown: str, **_: object) -> str:
    """mkdocs calls this with each page's Markdown before rendering it."""
    from mkdocs.exceptions import PluginError

    try:
        return with_help(markdown)
    except ValueError as error:
        raise PluginError(str(error)) from None
