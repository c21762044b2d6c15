"""What pgrace starts dies with it, however pgrace dies: SIGKILL too, and what its children started.

The kernel's parent-death signal reaches a child alone. A command's line runs under ``/bin/sh -c``,
and a shell forks for it (dash does not exec into the last command of a line), as npm does for a
script: those grandchildren are the command's process group, which pgrace's guard kills when the
pipe from pgrace ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from contextlib import suppress
from pathlib import Path

from procs import alive, wait_gone

PARENT = textwrap.dedent(
    """
    import subprocess, sys
    from pgrace.servers import processes

    child = subprocess.Popen(
        ["/bin/sh", "-c", "sleep 60 & echo $!; wait"],
        stdout=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=processes.dies_with_parent(group=sys.argv[1] == "group"),
    )
    guard = processes._guard_process
    print(child.stdout.readline().decode().strip(), guard.pid if guard else 0, flush=True)
    sys.stdin.read()
    """
)


def start_parent(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], int, int]:
    """A stand-in for pgrace that starts a shell whose line forks a ``sleep``: the sleep's pid and the guard's."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen(
        [sys.executable, str(script), mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    grandchild, guard = (int(pid) for pid in parent.stdout.readline().split())
    assert alive(grandchild)
    return parent, grandchild, guard


def test_a_commands_whole_group_dies_with_a_killed_pgrace_and_so_does_the_guard(tmp_path: Path) -> None:
    parent, grandchild, guard = start_parent(tmp_path, "group")
    assert alive(guard)
    parent.kill()
    parent.communicate()
    assert wait_gone(grandchild), "the shell's child outlived pgrace"
    assert wait_gone(guard), "the guard outlived what it guards"


def test_without_the_guard_the_signal_reaches_the_shell_alone(tmp_path: Path) -> None:
    """Why the guard exists: the parent-death signal kills the shell, and what it forked lives on."""
    parent, grandchild, guard = start_parent(tmp_path, "alone")
    assert guard == 0
    try:
        parent.kill()
        parent.communicate()
        assert not wait_gone(grandchild, 1.0)
    finally:
        with suppress(ProcessLookupError):
            os.kill(grandchild, signal.SIGKILL)
