"""Retry loops attacked: a loop on a step that waits, and the file's other cases around it.

A step that waits for a lock is still running when the file comes to its loop's attempts:
whether they are needed is not known yet, and the other sessions' later steps (the one that
closes a deadlock, the COMMIT that releases the row) must still run meanwhile, as they do
without the loop.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pgrace import api
from pgrace.engine.options import RunOptions
from pgrace.errors import ScenarioError
from pgrace.frontends.scenario_toml import parse_toml_scenario, read_toml_scenario
from pgrace.model.timeline import Run, StepLaunched
from pgrace.servers import ServerInfo

# Two transfers in opposite orders: w1's second update waits for w2, w2's closes the cycle.
# Both retry on 40P01. The server checks a wait for a deadlock once, deadlock_timeout after it
# began: w2, which closes the cycle, has the short one and is the victim whatever the machine's
# speed (w1's check, had it the short one, could come before the cycle closed and find none).
TRANSFERS = """name = "transfers"
setup = "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0), (2, 0)"
sessions = [{ name = "w1", setup = "SET deadlock_timeout = '100s'" }, { name = "w2", setup = "SET deadlock_timeout = '50ms'" }]

[[step]]
name = "w1-begin"
session = "w1"
sql = "BEGIN"

[[step]]
name = "w2-begin"
session = "w2"
sql = "BEGIN"

[[step]]
name = "w1-a"
session = "w1"
sql = "UPDATE t SET v = v + 1 WHERE id = 1"

[[step]]
name = "w2-a"
session = "w2"
sql = "UPDATE t SET v = v + 1 WHERE id = 2"

[[step]]
name = "w1-b"
session = "w1"
sql = "UPDATE t SET v = v + 1 WHERE id = 2"
retry = { on = ["40P01"], from = "w1-begin", max = 1 }
expect = { error = false }

[[step]]
name = "w2-b"
session = "w2"
sql = "UPDATE t SET v = v + 1 WHERE id = 1"
retry = { on = ["40P01"], from = "w2-begin", max = 1 }
expect = { error = false }

[[step]]
name = "w1-commit"
session = "w1"
sql = "COMMIT"

[[step]]
name = "w2-commit"
session = "w2"
sql = "COMMIT"

[[check]]
description = "both transfers happened, one of them on its second attempt"
sql = "SELECT sum(v) FROM t"
rows = [[4]]
"""


def _sent(run: Run) -> list[str]:
    return [e.step for e in run.events if isinstance(e, StepLaunched)]


@pytest.mark.server
def test_a_waiting_step_with_a_loop_lets_the_other_sessions_go_on(pgrace_server: ServerInfo) -> None:
    """w1-b waits for w2; w2-b, later in the file, runs meanwhile and closes the cycle: w2 (the victim) retries."""
    run = api.run(
        parse_toml_scenario(TRANSFERS, "<transfers>"), server=pgrace_server, options=RunOptions(step_timeout=5)
    )
    assert run.ok, [c for c in run.checks if not c.ok]
    sent = _sent(run)
    assert sent.index("w1-b") < sent.index("w2-b") < sent.index("w1-commit")  # w2-b ran while w1-b waited
    assert "w2-b#2" in sent and "w1-b#2" not in sent


def test_a_fix_that_drops_where_a_loop_starts_is_told_at_its_drop(tmp_path: Path) -> None:
    """The bug is fine; the fix drops w1-begin, where w1-b's loop starts: the fix's drop is at fault."""
    scenario = tmp_path / "transfers.toml"
    scenario.write_text(TRANSFERS + '\n[fix]\ndrop = ["w1-begin"]\n')
    line = TRANSFERS.count("\n") + 3

    with pytest.raises(ScenarioError) as refused:
        read_toml_scenario(scenario)

    assert str(refused.value) == (
        f"{scenario}:{line}: fix.drop removes 'w1-begin', where the retry loop of 'w1-b' starts:"
        " drop 'w1-b' too, or give it a retry of its own in [fix.step.w1-b]"
    )
