"""pgjdbc through ``--exec``: a JVM's connections are its command's sessions, and its quiet is proved.

The JVM runs threads of its own beside the application's, asleep in timed waits; the rule that
excuses them (:mod:`pgrace.engine.proxy.processes`) is tested here on real JVMs, then the shipped
lost-update and a SKIP LOCKED claim are explored with Java clients compiled in the test's tmp dir.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import jvm
import pytest
from claiming import CLAIM_FILE, cure_proved, double_claim_found
from helpers import cli
from proxying import cured_wait_as_pg_locks_shows

from pgrace.api import read_scenario
from pgrace.drivers.exec import explore_exec
from pgrace.engine.proxy.peers import peer_pid
from pgrace.engine.proxy.processes import jvm_of, quiet
from pgrace.model.scenario import Command
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


SPAWNER = "import threading\nwhile True:\n    t = threading.Thread(target=int)\n    t.start()\n    t.join()\n"


def test_a_process_that_keeps_starting_threads_is_never_read_quiet() -> None:
    """The JVM's launcher starts the main thread and joins it: a look that listed the threads before the start
    reads the launcher asleep in its join, and the new thread, running, is not in the list. Such a look is void."""
    proc = subprocess.Popen([sys.executable, "-c", SPAWNER])
    try:
        looks = [quiet(proc.pid, set(), False, 20.0) for _ in range(3000)]
    finally:
        proc.kill()
        proc.wait()
    assert looks.count(None) == 0


@pytest.fixture(scope="module")
def classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Java clients of tests/clients, compiled once for this module."""
    return jvm.compile_clients(
        tmp_path_factory.mktemp("java"),
        "PgEnv.java",
        "Withdraw.java",
        "Claim.java",
        "Ticker.java",
        "Disguise.java",
        "Reads.java",
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
        ("Ticker", "", r"'pool-1-thread-1' in a timed wait"),
        ("Disguise", "", r"the JVM counts (\d+) Java threads, pgrace (\d+) besides the JVM's own and the launcher's"),
        ("Withdraw", "-XX:-UsePerfData", r"no hsperfdata file to count the JVM's threads with \(-XX:-UsePerfData\)"),
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
    assert "runs for more than 5 s" in line, line
    said = re.search(why, line)
    assert said is not None, line
    if said.groups():  # the disguised thread is the one Java thread too many
        assert int(said[1]) == int(said[2]) + 1, line


@pytest.mark.slow
def test_lost_update_found_and_its_cure_proved(pgrace_server: ServerInfo, classes: Path) -> None:
    """pgjdbc sends BEGIN with the first statement, in one cycle: three steps a withdrawal, of which the reduced
    search runs 14 orders (of psycopg's four steps, 6)."""
    withdraw = jvm.command(classes, "Withdraw")
    dsn = ("--dsn", pgrace_server.dsn)
    found = cli("explore", "lost-update", "--exec", f"alice={withdraw}", "--exec", f"bob={withdraw}", *dsn)
    assert found.exit_code == 0, found.output
    assert "all 14 interleavings, 15 runs: 2 outcome classes" in found.output, found.output
    assert "verdict: ✔ class 1 shows the bug" in found.output
    cured = f"{withdraw} --for-update"
    proved = cli("explore", "lost-update", "--fix", "--exec", f"alice={cured}", "--exec", f"bob={cured}", *dsn)
    assert proved.exit_code == 0, proved.output
    assert "all 6 interleavings, 7 runs: 1 outcome class" in proved.output, proved.output
    assert "verdict: ✔ no class shows the bug" in proved.output


def test_the_wait_is_what_pg_locks_shows(
    pgrace_server: ServerInfo, classes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bob's FOR UPDATE waits for Alice's: the timeline names the row, holder and modes pg_locks shows then."""
    cured = jvm.command(classes, "Withdraw", "--for-update")
    run = cured_wait_as_pg_locks_shows(pgrace_server, monkeypatch, cured, ["alice#1", "bob#1"])
    assert [(s.session, s.sql) for s in run.scenario.steps][:2] == [
        ("alice#1", "BEGIN; SELECT balance FROM accounts WHERE id = 1 FOR UPDATE"),
        ("bob#1", "BEGIN; SELECT balance FROM accounts WHERE id = 1 FOR UPDATE"),
    ]


@pytest.mark.slow
@pytest.mark.thorough  # the lost update above is pgjdbc's everyday exploration
def test_skip_locked_claim_double_claim_found_and_cure_proved(pgrace_server: ServerInfo, classes: Path) -> None:
    """Two Java workers: reading the first pending job claims job 1 twice in some order; FOR UPDATE SKIP LOCKED
    claims each job once in every order, the search complete."""
    bug = read_scenario(str(CLAIM_FILE))
    assert bug.other is not None
    worker = jvm.command(classes, "Claim")
    found = explore_exec(bug, [Command("w1", worker), Command("w2", worker)], pgrace_server)
    cured = f"{worker} --skip-locked"
    proved = explore_exec(bug.other, [Command("w1", cured), Command("w2", cured)], pgrace_server)
    assert (double_claim_found(found), cure_proved(proved)) == (15, 15)
