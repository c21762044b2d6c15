"""pgjdbc through ``--exec``: a JVM's connections are its command's sessions, and its quiet is proved.

The JVM runs threads of its own beside the application's, asleep in timed waits; the rule that
excuses them (:mod:`pgrace.engine.proxy.processes`) is tested here on real JVMs, then the shipped
lost-update and a SKIP LOCKED claim are explored with Java clients compiled in the test's tmp dir.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jvm
import pytest

from pgrace.engine.proxy.peers import peer_pid
from pgrace.engine.proxy.processes import jvm_of, quiet
from pgrace.servers import ServerInfo


def test_a_dual_stack_client_is_found_in_the_ipv6_table() -> None:
    """The JVM's sockets are IPv6: its connection to the IPv4 proxy is listed in tcp6, under ::ffff:127.0.0.1."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        with socket.socket(socket.AF_INET6) as client:
            client.connect(("::ffff:127.0.0.1", port))
            accepted, _ = listener.accept()
            with accepted:
                assert peer_pid(accepted) == os.getpid()


@pytest.fixture(scope="module")
def classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Java clients of tests/clients, compiled once for this module."""
    return jvm.compile_clients(
        tmp_path_factory.mktemp("java"), "Withdraw.java", "Claim.java", "Ticker.java", "Disguise.java", "Reads.java"
    )


@contextlib.contextmanager
def reading_jvm(classes: Path, *flags: str) -> Iterator[int]:
    """A JVM asleep in a read of a socket nobody writes to, nothing of it held: its pid."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        proc = subprocess.Popen(
            ["java", *flags, "-cp", str(classes), "Reads", str(listener.getsockname()[1])], stdout=subprocess.DEVNULL
        )
        try:
            listener.settimeout(60)
            accepted, _ = listener.accept()
            with accepted:
                assert accepted.recv(1) == b"!"  # main() runs and is about to read
                yield proc.pid
        finally:
            proc.kill()
            proc.wait()


def settled(pid: int, horizon: float, seconds: float = 10.0) -> str | None:
    """What :func:`quiet` says of the JVM once no thread of it runs (None: quiet), looked at as pgrace's settle does.

    A thread that runs a moment (the VM's periodic task wakes every 50 ms) is looked at again; a wait is the answer.
    """
    deadline = time.monotonic() + seconds
    while True:
        moving = quiet(pid, set(), False, horizon)
        if moving is None or "in a timed wait" in moving or time.monotonic() > deadline:
            return moving
        time.sleep(0.01)  # a look every 10 ms, as the settle's slices: the kernel's answer, not a guess from time


def test_a_jvm_waiting_for_input_is_quiet_with_nothing_held(classes: Path) -> None:
    """HotSpot's own threads are known by name and counted, the Common-Cleaner by its 60 s deadline."""
    with reading_jvm(classes) as pid:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
        named = {t: Path(f"/proc/{pid}/task/{t}/comm").read_text().strip() for t in tids}
        found = jvm_of(pid)
        assert found.hotspot and found.why == ""
        assert {named[t] for t in found.own} >= {"VM Thread", "VM Periodic Tas", "Monitor Deflati", "G1 Service"}
        assert "Common-Cleaner" not in {named[t] for t in found.own}  # a Java thread: trusted by its clock alone
        assert settled(pid, horizon=20.0) is None
        # The Common-Cleaner's deadline is under 60 s away: past a longer horizon nothing excuses its timed wait.
        assert "'Common-Cleaner' in a timed wait" in (settled(pid, horizon=3600.0) or "")


@pytest.mark.parametrize(
    ("client", "flags", "why"),
    [
        ("Ticker", "", "'pool-1-thread-1' in a timed wait"),
        ("Disguise", "", "the JVM counts 7 Java threads, pgrace 6 besides the JVM's own and the launcher's"),
        ("Withdraw", "-XX:-UsePerfData", "no hsperfdata file to count the JVM's threads with (-XX:-UsePerfData)"),
    ],
)
def test_a_jvm_with_a_thread_pgrace_cannot_account_for_is_refused(
    pgrace_server: ServerInfo, classes: Path, client: str, flags: str, why: str
) -> None:
    """An application timer, a thread named as the JVM's own, or no count to check names with: never quiet, even
    while the process's statement is held; the run is refused in one line (exit 2), not taken for a proof."""
    alice = f"alice={jvm.command(classes, client, flags=flags)}"
    result = cli("run", "lost-update", "--exec", alice, "--step-timeout", "5", "--dsn", pgrace_server.dsn)
    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    assert why in line and "runs for more than 5 s" in line, line


def cli(*args: str) -> Any:
    from click.testing import CliRunner

    from pgrace.cli import main

    return CliRunner().invoke(main, list(args), catch_exceptions=False)
