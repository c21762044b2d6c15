"""The Python and pytest examples of docs/python.md run as written, through the installed pytest plugin.

Each ``python`` block of "Using pgrace from Python and pytest" is written to a test module of
its own and run by pytest in a child process (the plugin's fixtures, the suite's server):
an example naming a file that does not exist, or an API that changed, fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from documentation import page

from pgrace.servers import ServerInfo


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", page("python.md"), re.DOTALL)


def test_the_python_examples_pass(tmp_path: Path, pgrace_server: ServerInfo) -> None:
    blocks = python_blocks()
    assert len(blocks) == 4
    (tmp_path / "test_script.py").write_text(
        "def test_script():\n" + "".join(f"    {line}\n" for line in blocks[0].splitlines())
    )
    for number, block in enumerate(blocks[1:], 1):
        (tmp_path / f"test_example_{number}.py").write_text(block)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--pgrace-dsn",
            pgrace_server.dsn,
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PGRACE_DSN": ""},
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 passed" in result.stdout, result.stdout
