"""Drive `pgrace` in a child process, for tests that signal or kill it mid-run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of someone else counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, deadline_s: float = 10.0) -> bool:
    end = time.monotonic() + deadline_s
    while alive(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.01)  # polling for a process exit; not a stand-in for lock detection
    return True


def start_blocked_run(extra: list[str]) -> tuple[subprocess.Popen[str], list[str]]:
    """Start a paced run and drive it until a step is blocked and pgrace waits for Enter."""
    child = subprocess.Popen(
        [sys.executable, "-m", "pgrace", "run", "lost-update", "--fix", "--step", *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"},
    )
    assert child.stdin is not None and child.stdout is not None
    seen: list[str] = []
    blocked = False
    for line in child.stdout:
        seen.append(line)
        if "⏳ waits for alice" in line:
            blocked = True
        if "▶ next:" in line:
            if blocked:
                return child, seen
            child.stdin.write("\n")
            child.stdin.flush()
    raise AssertionError("pgrace ended before a step blocked:\n" + "".join(seen))
