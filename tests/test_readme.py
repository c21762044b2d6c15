"""The README's examples are real output of the current code.

Every fenced block right after a `<!-- output: pgrace ... -->` marker must equal what
that command prints now. `PGRACE_UPDATE_README=1 pytest tests/test_readme.py` rewrites
the blocks from the current output.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from click.testing import CliRunner

from pgrace.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"<!-- output: pgrace (?P<args>.+?) -->\n```text\n(?P<body>.*?)```\n", re.DOTALL)


def output_of(args: str) -> str:
    env = {"PGRACE_DSN": ""}  # the README shows the embedded server
    result = CliRunner().invoke(main, shlex.split(args), env=env)
    assert result.exit_code in (0, 1), result.output
    return result.stdout


def test_readme_examples_are_real_output() -> None:
    text = README.read_text(encoding="utf-8")
    blocks = list(BLOCK.finditer(text))
    assert blocks, "the README should show real output"
    if os.environ.get("PGRACE_UPDATE_README"):
        updated = BLOCK.sub(
            lambda m: f"<!-- output: pgrace {m['args']} -->\n```text\n{output_of(m['args'])}```\n", text
        )
        README.write_text(updated, encoding="utf-8")
        return
    for block in blocks:
        assert block["body"] == output_of(block["args"]), f"README block for `pgrace {block['args']}` is stale"


FILE = re.compile(r"<!-- file: (?P<path>\S+) -->\n```toml\n(?P<body>.*?)```\n", re.DOTALL)


def test_readme_example_files_are_the_files_it_runs() -> None:
    """A ``<!-- file: PATH -->`` block shows PATH whole: the output block after it ran that very file."""
    blocks = list(FILE.finditer(README.read_text(encoding="utf-8")))
    assert blocks, "the README should show its example files"
    for block in blocks:
        path = README.parent / block["path"]
        assert block["body"] == path.read_text(encoding="utf-8"), f"README shows a stale {block['path']}"
