"""docs/guide/from-log.md shows real output: the shipped log, what from-log says of it, and the scenario it writes.

tests/test_readme.py checks its ``<!-- output: -->`` and ``<!-- file: -->`` blocks, as on
every page. Here: a block after ``<!-- stderr: pgrace ... -->`` is that command's stderr,
after ``<!-- log: PATH -->`` the log file PATH whole
(``PGRACE_UPDATE_GUIDE=1 pytest tests/test_guide_from_log.py`` rewrites them); and the
shipped scenario is what from-log writes from the shipped log.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from pgrace.cli import main

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide" / "from-log.md"
BLOCK = re.compile(
    r"<!-- (?P<kind>output|stderr|file|log): (?P<what>.+?) -->\n```(?P<lang>\w+)\n(?P<body>.*?)```\n", re.S
)


def shown(kind: str, what: str) -> str:
    if kind in ("file", "log"):
        return (ROOT / what).read_text(encoding="utf-8")
    result = CliRunner().invoke(main, shlex.split(what)[1:], env={"PGRACE_DSN": ""})
    assert result.exit_code == 0, result.output
    return result.stdout if kind == "output" else result.stderr


@pytest.mark.server
def test_the_guide_shows_real_output() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    blocks = list(BLOCK.finditer(text))
    blocks = [b for b in blocks if b["kind"] in ("stderr", "log")]
    assert {b["kind"] for b in blocks} == {"stderr", "log"}
    if os.environ.get("PGRACE_UPDATE_GUIDE"):
        GUIDE.write_text(
            BLOCK.sub(
                lambda m: f"<!-- {m['kind']}: {m['what']} -->\n```{m['lang']}\n{shown(m['kind'], m['what'])}```\n", text
            ),
            encoding="utf-8",
        )
        return
    for block in blocks:
        assert block["body"] == shown(block["kind"], block["what"]), f"the guide's {block['what']} is stale"


def test_the_shipped_scenario_is_what_from_log_writes() -> None:
    result = CliRunner().invoke(main, ["from-log", "examples/from-log/deadlock.log", "--no-verify"])
    assert result.exit_code == 0, result.output
    assert result.stdout == (ROOT / "examples" / "from-log" / "deadlock.toml").read_text(encoding="utf-8")


@pytest.mark.server
def test_the_shipped_scenario_reproduces_the_deadlock() -> None:
    result = CliRunner().invoke(main, ["run", "examples/from-log/deadlock.toml"], env={"PGRACE_DSN": ""})
    assert result.exit_code == 0, result.output
    assert "✗ ERROR 40P01: deadlock detected" in result.stdout
