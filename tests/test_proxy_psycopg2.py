"""psycopg2 through ``--exec``: when the scheduler may choose, and the SKIP LOCKED claim explored.

psycopg2 is blocking libpq: between two statements, and while it connects, its process sleeps in
``poll`` with no timeout, which is a settled process as soon as it gets there. Whether it is
settled *with its bytes seen* depends on the order of pgrace's two readings (the processes, the
proxy) and on nothing waking it between them: these tests make the gap between the two wide
(a client that connects late, pgrace's thread held up between its readings) and check that the
scheduler still waits for the late statement.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgrace.api import read_scenario
from pgrace.drivers.exec import explore_exec, run_exec
from pgrace.engine.proxy.processes import Started
from pgrace.frontends import catalog
from pgrace.model.scenario import Command
from pgrace.servers import ServerInfo

CLIENTS = Path(__file__).parent / "clients"
WITHDRAW = f"{sys.executable} {CLIENTS / 'withdraw_psycopg2.py'}"
CLAIM = f"{sys.executable} {CLIENTS / 'claim_psycopg2.py'}"
CLAIM_FILE = CLIENTS / "claim.toml"


def _firsts(server: ServerInfo, alice: str, runs: int) -> list[str]:
    """Whose statement goes first in ``runs`` runs that ask for alice's first, with bob's ready before hers."""
    scenario = catalog.read_scenario("lost-update", {})
    commands = [Command("alice", alice), Command("bob", WITHDRAW)]
    return [run_exec(scenario, commands, server, order=["alice#1"]).scenario.steps[0].session for _ in range(runs)]


def test_a_client_that_connects_late_is_waited_for(pgrace_server: ServerInfo) -> None:
    """Alice connects 0.3 s after bob has his first statement held: the scheduler waits for hers.

    Her connect and first send happen while pgrace looks; read proxy-first, a look that saw no
    start-up at the proxy and then alice asleep in ``poll`` took her as settled without a
    statement, and bob went first in 8 of 10 runs.
    """
    assert _firsts(pgrace_server, f"{WITHDRAW} --late 0.3", 5) == ["alice#1"] * 5


def test_a_client_the_proxy_answers_between_the_two_readings_is_not_settled(
    pgrace_server: ServerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pgrace's thread is held up after it read the processes (as a busy machine preempts it): alice's start-up
    ends meanwhile and she works 50 ms before her first statement. Her process was asleep when read and the proxy
    is quiet when read; only the proxy's count of its answers says she was woken in between (without it, bob
    went first in 6 of 12 runs)."""
    read = Started.moving

    def held_up(self: Started, proxied: set[int], held: bool, horizon: float) -> str | None:
        moving = read(self, proxied, held, horizon)
        time.sleep(0.02)  # the preemption between the two readings; nothing is waited for here
        return moving

    monkeypatch.setattr(Started, "moving", held_up)
    assert _firsts(pgrace_server, f"{WITHDRAW} --late 0.3 --pause 0.05", 6) == ["alice#1"] * 6


@pytest.fixture
def busy_cores() -> Iterator[None]:
    """Every core kept busy by a process of its own for the test's length."""
    import os

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@pytest.mark.slow
@pytest.mark.thorough  # whole explorations of the late client above, with the cores kept busy
def test_explorations_with_a_late_client_under_busy_cores_are_complete(
    pgrace_server: ServerInfo, busy_cores: None
) -> None:
    """Two reduced searches of the cure, alice connecting late, every core busy: each complete and proved.

    Before the readings were ordered, most runs that asked for alice first let bob go.
    """
    scenario = catalog.read_scenario("lost-update", {}).other
    assert scenario is not None
    cured = f"{WITHDRAW} --for-update"
    commands = [Command("alice", f"{cured} --late 0.2"), Command("bob", cured)]
    for _ in range(2):
        proved = explore_exec(scenario, commands, pgrace_server)
        assert (proved.complete, proved.runs, proved.ok) == (True, 7, True), proved.incomplete


def _finals(explored: object) -> set[tuple[tuple[object, ...], ...]]:
    return {c.final[0] for c in getattr(explored, "classes", ())}


@pytest.mark.slow
def test_skip_locked_claim_double_claim_found_and_cure_proved(pgrace_server: ServerInfo) -> None:
    """Two psycopg2 workers, two pending jobs. Read-then-update claims job 1 twice in some order (job 2 left);
    with ``FOR UPDATE SKIP LOCKED`` every order claims each job once. Both searches complete, with their runs."""
    bug = read_scenario(str(CLAIM_FILE))
    assert bug.other is not None
    found = explore_exec(bug, [Command("w1", CLAIM), Command("w2", CLAIM)], pgrace_server)
    assert found.complete, found.incomplete
    assert _finals(found) == {((1, 2), (2, 0)), ((1, 1), (2, 1))}, [c.summary for c in found.classes]
    assert not any(c.errors or c.unexpected for c in found.classes)
    cured = f"{CLAIM} --skip-locked"
    proved = explore_exec(bug.other, [Command("w1", cured), Command("w2", cured)], pgrace_server)
    assert proved.complete, proved.incomplete
    assert _finals(proved) == {((1, 1), (2, 1))}, [c.summary for c in proved.classes]
    assert proved.ok and not any(c.errors or c.unexpected for c in proved.classes)
    print(f"double claim found in {found.runs} runs, cure proved in {proved.runs}")
    assert (found.runs, proved.runs) == (7, 7)
