"""The SKIP LOCKED claim (tests/claiming.py) from real clients through the proxy: explore finds the double claim
without a lock, and proves with ``FOR UPDATE SKIP LOCKED`` that no order claims a job twice, each with its run
count. Commands run through ``--exec``; async clients as ``pgrace.proxy`` sessions, in process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from claiming import CLAIM_FILE, cure_proved, double_claim_found

from pgrace.api import load_scenario
from pgrace.drivers.exec import explore_exec
from pgrace.engine.proxy.processes import Command
from pgrace.servers import ServerInfo

CLIENTS = Path(__file__).parent / "clients"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("client", "found_runs", "proved_runs"),
    [("claim_psycopg.py", 7, 13)],
)
def test_exec_claim_found_and_cure_proved(
    pgrace_server: ServerInfo, client: str, found_runs: int, proved_runs: int
) -> None:
    """Each worker a process of its own, connected with the PG* variables pgrace sets."""
    bug = load_scenario(str(CLAIM_FILE))
    assert bug.other is not None
    worker = f"{sys.executable} {CLIENTS / client}"
    found = explore_exec(bug, [Command("w1", worker), Command("w2", worker)], pgrace_server)
    cured = f"{worker} --skip-locked"
    proved = explore_exec(bug.other, [Command("w1", cured), Command("w2", cured)], pgrace_server)
    assert (double_claim_found(found), cure_proved(proved)) == (found_runs, proved_runs)
