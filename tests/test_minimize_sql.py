"""``pgrace minimize`` after the structure: SQL text made smaller, retry loops whole, hangs cut short."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from pgrace.cli import main
from pgrace.drivers.minimize import failure_of, minimize
from pgrace.frontends import catalog
from pgrace.servers import ServerInfo
from tools.padded import padded

LOST_UPDATE_WORDY = """
name = "wordy-lost-update"
title = "A lost update whose statements say more than the bug needs"
setup = '''
CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, balance int NOT NULL);
INSERT INTO accounts VALUES (1, 'shared', 500);
'''
sessions = ["alice", "bob"]

[[step]]
name = "alice-read"
session = "alice"
sql = "SELECT balance, owner FROM accounts WHERE id = 1 AND owner = 'shared'"
capture = { balance = "balance" }

[[step]]
name = "bob-read"
session = "bob"
sql = "SELECT balance FROM accounts WHERE id = 1"
capture = { balance = "balance" }

[[step]]
name = "alice-write"
session = "alice"
sql = "UPDATE accounts SET balance = :balance - 100, owner = 'alice' WHERE id = 1"

[[step]]
name = "bob-write"
session = "bob"
sql = "UPDATE accounts SET balance = :balance - 100 WHERE id = 1"

[[check]]
description = "the balance is 400, not 300: Alice's withdrawal was lost"
kind = "bug"
sql = "SELECT balance FROM accounts WHERE id = 1"
rows = [[400]]
"""


def test_simpler_proposes_columns_then_terms_then_literals_and_keeps_variables() -> None:
    from pgrace.drivers.minimize.simplify import simpler

    sql = "UPDATE t SET a = :v - 100, b = 'x' WHERE id = 1 AND c = 2 RETURNING a, b"
    edits = simpler(sql, frozenset({"b"}))
    assert [e.what for e in edits] == [
        "drop the SET item a",
        "drop the SET item b",
        "drop the RETURNING item a",  # b is captured: never dropped
        "drop the AND term id = 1",
        "drop the AND term c = 2",
        "the literal 100 as 0",
        "the literal 100 as 1",
        "the literal 'x' as ''",  # not the WHERE's literals: they pick the rows
    ]
    assert edits[0].sql == "UPDATE t SET b = 'x' WHERE id = 1 AND c = 2 RETURNING a, b"
    assert edits[5].sql == "UPDATE t SET a = :v - 0, b = 'x' WHERE id = 1 AND c = 2 RETURNING a, b"
    assert simpler("BEGIN ISOLATION LEVEL SERIALIZABLE") == []  # only SELECT, INSERT, UPDATE, DELETE change
    assert simpler('SELECT :"col" FROM t WHERE a = 1 AND b = 2') == []  # a variable standing for a name
    assert simpler("SELECT FROM WHERE (") == []  # what the parser cannot read stays as written


def test_sql_is_simplified_where_a_smaller_statement_fails_the_same_way(
    pgrace_server: ServerInfo, tmp_path: Path
) -> None:
    path = tmp_path / "wordy.toml"
    path.write_text(LOST_UPDATE_WORDY)
    scenario = catalog.read_scenario(str(path))
    found = minimize(scenario, pgrace_server, tuple(p.step for p in scenario.permutations[0]))
    sql = {s.name: s.sql for s in found.scenario.steps}
    assert sql["alice-read"] == "SELECT balance FROM accounts WHERE owner = 'shared'"  # a column and a term gone
    # Alice's amount does not matter, Bob's write is what the check sees: 1 will do; 0 is no withdrawal at
    # all, and then the sessions one after another end at 400 too: no race left, not kept.
    assert sql["alice-write"] == "UPDATE accounts SET balance = :balance - 1 WHERE id = 1"
    assert sql["bob-write"] == "UPDATE accounts SET balance = :balance - 100 WHERE id = 1"
    trials = {t.what: t for t in found.trials if t.kind == "sql"}
    assert trials["alice-read: drop the column owner"].removed
    assert trials["alice-write: drop the SET item owner"].removed
    assert "no race left" in trials["alice-write: the literal 100 as 0"].reason
    for what in ("bob-write: the literal 100 as 0", "bob-write: the literal 100 as 1"):
        assert not trials[what].removed  # the bug's check no longer sees it: never kept, and the report says why
        assert trials[what].reason == "it passes"
    assert found.timeline is not None and found.failure.kept_by(failure_of(found.timeline))
    assert found.to_dict()["trials"][-1]["kind"] == "sql"


RETRYING = """
name = "double-audit"
title = "A retry runs the request's audit insert again"
setup = '''
CREATE TABLE doctors (name text PRIMARY KEY, on_call bool NOT NULL);
INSERT INTO doctors VALUES ('alice', true), ('bob', true);
CREATE TABLE audit (who text NOT NULL);
CREATE TABLE pad (id int PRIMARY KEY, note text);
INSERT INTO pad VALUES (1, 'a');
'''
sessions = ["alice", "bob"]

[[step]]
name = "pad-begin"
session = "alice"
sql = "BEGIN"

[[step]]
name = "pad-write"
session = "alice"
sql = "UPDATE pad SET note = 'b' WHERE id = 1"

[[step]]
name = "pad-commit"
session = "alice"
sql = "COMMIT"
retry = { on = ["40001"], from = "pad-begin", max = 2 }

[[step]]
name = "alice-begin"
session = "alice"
sql = "BEGIN ISOLATION LEVEL SERIALIZABLE"

[[step]]
name = "bob-log"
session = "bob"
sql = "INSERT INTO audit VALUES ('bob')"

[[step]]
name = "bob-begin"
session = "bob"
sql = "BEGIN ISOLATION LEVEL SERIALIZABLE"

[[step]]
name = "alice-off"
session = "alice"
sql = "UPDATE doctors SET on_call = false WHERE name = 'alice' AND (SELECT count(*) FROM doctors WHERE on_call) >= 2"

[[step]]
name = "bob-off"
session = "bob"
sql = "UPDATE doctors SET on_call = false WHERE name = 'bob' AND (SELECT count(*) FROM doctors WHERE on_call) >= 2"

[[step]]
name = "alice-commit"
session = "alice"
sql = "COMMIT"

[[step]]
name = "bob-commit"
session = "bob"
sql = "COMMIT"
retry = { on = ["40001"], from = "bob-log", max = 1 }

[[check]]
description = "Bob's request is in the audit twice"
kind = "bug"
sql = "SELECT count(*) FROM audit WHERE who = 'bob'"
rows = [[2]]
"""


def test_a_retry_loop_goes_as_one_unit_and_a_spec_refuses_it_naming_the_step(
    pgrace_server: ServerInfo, tmp_path: Path
) -> None:
    """Alice's loop over an unrelated table goes whole; Bob's, which makes the failure, stays whole."""
    path = tmp_path / "double-audit.toml"
    path.write_text(RETRYING)
    scenario = catalog.read_scenario(str(path))
    found = minimize(scenario, pgrace_server, tuple(p.step for p in scenario.permutations[0]))

    loops = [t for t in found.trials if t.kind == "retry loop"]
    assert any(t.removed and t.what.startswith("pad-begin … pad-commit (retry on 40001") for t in loops), loops
    assert not any(t.kind in ("step", "transaction") and "pad-" in t.what for t in found.trials)
    assert not any(n.startswith("pad-") for n in found.order)  # attempts #2 and #3 and their ROLLBACKs too
    bob_loop = [n for n in found.order if found.scenario.step(n).loop == "bob-commit"]
    assert bob_loop[:4] == ["bob-log", "bob-begin", "bob-off", "bob-commit"]
    assert "bob-commit#2" in bob_loop and "bob-log#2" in bob_loop
    assert any(not t.removed and t.what.startswith("bob-log … bob-commit") for t in loops)

    spec = tmp_path / "audit.spec"
    result = CliRunner().invoke(main, ["minimize", str(path), "--spec", str(spec), "--dsn", pgrace_server.dsn])
    assert result.exit_code == 2, result.output
    assert result.stderr == "pgrace: step bob-log is in a retry loop: a spec cannot retry\n"
    assert not spec.exists() and not spec.with_suffix(".out").exists()


def test_a_candidate_that_hangs_waits_a_few_times_the_original_not_the_step_timeout(
    pgrace_server: ServerInfo,
) -> None:
    """deadlock-transfer's candidates without a COMMIT leave a step waiting for a session with nothing left to send."""
    shipped = catalog.read_scenario("deadlock-transfer").variant_named("bug")
    scenario = padded(shipped)
    found = minimize(scenario, pgrace_server, tuple(p.step for p in scenario.permutations[0]), step_timeout=10.0)
    assert found.candidate_timeout < 3.0  # not the 10 s step timeout, which each such candidate waited out
    assert found.after["steps"] <= len(shipped.steps) and found.locally_minimal
    assert found.to_dict()["candidate_timeout"] == round(found.candidate_timeout, 3)


@pytest.mark.timing
def test_a_deadlock_minimizes_in_seconds(pgrace_server: ServerInfo) -> None:
    """Four of its candidates hang until cancelled: 42 s at the 10 s step timeout, about 6 s now."""
    shipped = catalog.read_scenario("deadlock-transfer").variant_named("bug")
    found = minimize(shipped, pgrace_server, tuple(p.step for p in shipped.permutations[0]), step_timeout=10.0)
    assert found.seconds < 25.0


def test_nothing_is_run_twice_for_the_result(pgrace_server: ServerInfo) -> None:
    """Beyond its trials, a shrink runs the original, a serial order (which tells a race) and the order's trace:
    the result's own count of failing runs is the one made when it was kept."""
    scenario = catalog.read_scenario("lost-update").variant_named("bug")
    found = minimize(scenario, pgrace_server, tuple(p.step for p in scenario.permutations[0]))
    assert found.race and found.failed_after == found.repeats == 1
    assert found.runs == sum(t.runs for t in found.trials) + 3


def test_without_checks_or_errors_a_wait_is_the_failure() -> None:
    """What from-log writes for a long lock wait: no final check, no error, one step that waits."""
    import dataclasses

    from pgrace.model.minimized import Failure

    waits = dataclasses.replace(catalog.read_scenario("head-of-line-blocking").variant_named("bug"), checks=())
    assert Failure(False, (), (), ("claim2",)).fails(waits)
    assert not Failure(False, (), (), ()).fails(waits)  # nothing happened: nothing to minimize
