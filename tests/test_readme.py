"""The documentation's examples are real output of the current code: the README's and every docs/ page's.

Every fenced block right after a `<!-- output: pgrace ... -->` marker must equal what
that command prints now. `PGRACE_UPDATE_README=1 pytest tests/test_readme.py` rewrites
the blocks, on every page, from the current output. A `<!-- file: PATH -->` block shows
PATH (relative to the repository's root, on any page) whole.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from documentation import README, ROOT, pages

from pgrace.cli import main

BLOCK = re.compile(r"<!-- output: pgrace (?P<args>.+?) -->\n```text\n(?P<body>.*?)```\n", re.DOTALL)
FILE = re.compile(r"<!-- file: (?P<path>\S+) -->\n```toml\n(?P<body>.*?)```\n", re.DOTALL)
PAGES = pages()
#: Commands whose output the pages show without a server.
OFFLINE = frozenset({"list", "show"})


def page_param(path: Path) -> object:
    """A page, marked ``server`` when one of its examples runs on one."""
    commands = {block["args"].split()[0] for block in BLOCK.finditer(path.read_text(encoding="utf-8"))}
    return pytest.param(path, marks=pytest.mark.server) if commands - OFFLINE else path


def output_of(args: str) -> str:
    env = {"PGRACE_DSN": ""}  # the documentation shows the embedded server
    result = CliRunner().invoke(main, shlex.split(args), env=env)
    assert result.exit_code in (0, 1), result.output
    return result.stdout


def shown(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("path", [page_param(path) for path in PAGES], ids=shown)
def test_examples_are_real_output(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    blocks = list(BLOCK.finditer(text))
    if os.environ.get("PGRACE_UPDATE_README"):
        updated = BLOCK.sub(
            lambda m: f"<!-- output: pgrace {m['args']} -->\n```text\n{output_of(m['args'])}```\n", text
        )
        path.write_text(updated, encoding="utf-8")
        return
    for block in blocks:
        assert block["body"] == output_of(block["args"]), f"{shown(path)}: block for `pgrace {block['args']}` is stale"


@pytest.mark.parametrize("path", PAGES, ids=shown)
def test_example_files_are_the_files_they_run(path: Path) -> None:
    """A ``<!-- file: PATH -->`` block shows PATH whole: the output block after it ran that very file."""
    for block in FILE.finditer(path.read_text(encoding="utf-8")):
        assert block["body"] == (ROOT / block["path"]).read_text(encoding="utf-8"), (
            f"{shown(path)} shows a stale {block['path']}"
        )


def test_the_readme_shows_real_output() -> None:
    assert BLOCK.search(README.read_text(encoding="utf-8")), "the README should show real output"


def test_the_docs_show_real_output_and_the_files_they_ran() -> None:
    """A marker misspelt (``<!-- output:pgrace``) or a fence that is not ``text`` would go unchecked."""
    text = "\n".join(path.read_text(encoding="utf-8") for path in PAGES)
    assert len(BLOCK.findall(text)) == len(re.findall("^<!-- output: pgrace ", text, re.MULTILINE)), (
        "an output marker is not followed by a text block"
    )
    assert len(FILE.findall(text)) == len(re.findall("^<!-- file: ", text, re.MULTILINE)), (
        "a file marker is not followed by a toml block"
    )
    assert len(BLOCK.findall(text)) >= 9 and len(FILE.findall(text)) >= 3
