"""Expectations for every wait kind: a table, an advisory key, a transaction, a unique key; error patterns; deadlocks."""

from __future__ import annotations

import functools

import pytest
from helpers import toml_scenario

from pgrace.errors import ScenarioError
from pgrace.model.checks import evaluate
from pgrace.model.timeline import CheckResult
from pgrace.pytest_plugin import RunScenario

SETUP = "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 10), (2, 20);"

scenario = functools.partial(toml_scenario, sessions="['a', 'b']", setup=SETUP, name="waits")


def results(pgrace_run: RunScenario, body: str) -> dict[str, CheckResult]:
    return {r.description: r for r in evaluate(pgrace_run(scenario(body)))}


def blocked(first: str, second: str, expect: str) -> str:
    return f"""
    [[step]]
    session = "a"
    sql = "{first}"
    [[step]]
    name = "second"
    session = "b"
    sql = "{second}"
    expect = {expect}
    [[step]]
    session = "a"
    sql = "COMMIT"
    """


TABLE = ("BEGIN; LOCK TABLE t IN ACCESS EXCLUSIVE MODE", "SELECT count(*) FROM t")


def test_a_wait_on_a_table_and_its_mode(pgrace_run: RunScenario) -> None:
    got = results(pgrace_run, blocked(*TABLE, '{ waits_on = { table = "t", mode = "ACCESS SHARE" } }'))
    assert got["second: waits on table t (AccessShareLock)"].ok
    wrong = results(pgrace_run, blocked(*TABLE, '{ waits_on = { table = "t", mode = "RowExclusiveLock" } }'))
    assert not wrong["second: waits on table t (RowExclusiveLock)"].ok


def test_a_wait_for_a_transaction_and_a_unique_key(pgrace_run: RunScenario) -> None:
    first, second = "BEGIN; INSERT INTO t VALUES (3, 30)", "INSERT INTO t VALUES (3, 31)"
    got = results(pgrace_run, blocked(first, second, '{ waits_on = { transaction_of = "a" }, error = "23505" }'))
    assert got["second: waits on a's transaction"].ok and got["second: fails with 23505"].ok
    unique = results(pgrace_run, blocked(first, second, '{ waits_on = { unique_index = "t_pkey" } }'))
    assert unique["second: waits on a unique key of t_pkey"].ok
    other = results(pgrace_run, blocked(first, second, '{ waits_on = { unique_index = "t_v_key" } }'))
    assert not other["second: waits on a unique key of t_v_key"].ok


def test_a_wait_on_an_advisory_key(pgrace_run: RunScenario) -> None:
    body = blocked("SELECT pg_advisory_lock(42)", "SELECT pg_advisory_lock(42)", "{ waits_on = { advisory = 42 } }")
    body += '[[step]]\nsession = "a"\nsql = "SELECT pg_advisory_unlock(42)"\n'
    body += '[[step]]\nsession = "b"\nsql = "SELECT pg_advisory_unlock(42)"\n'
    assert results(pgrace_run, body)["second: waits on advisory lock 42"].ok


def test_an_error_message_pattern(pgrace_run: RunScenario) -> None:
    second = "SET lock_timeout = '100ms'; SELECT count(*) FROM t"
    commit = '[[step]]\n    session = "a"\n    sql = "COMMIT"'
    pause = '[[step]]\n    session = "a"\n    sleep = "300ms"\n    '  # a holds the table until b's lock_timeout ran out
    got = results(
        pgrace_run,
        blocked(TABLE[0], second, '{ error = "55P03", message = "*lock timeout*" }').replace(commit, pause + commit),
    )
    assert got["second: fails with a message like '*lock timeout*'"].ok
    wrong = results(pgrace_run, blocked(TABLE[0], second, '{ message = "*deadlock*" }').replace(commit, pause + commit))
    assert not wrong["second: fails with a message like '*deadlock*'"].ok


def test_the_deadlock_victim_and_its_cycle(pgrace_run: RunScenario) -> None:
    """a closes the cycle and has the shorter deadlock_timeout: its one check, run after the cycle closed, makes it
    the victim whatever the machine's speed (as PostgreSQL's own isolation specs pin it).

    The server checks a wait once, deadlock_timeout after it began: had b waited with the shorter one, its check
    could run before a closed the cycle, find none, and leave a's check to end it.
    """
    body = """
    [[step]]
    session = "a"
    sql = "BEGIN; UPDATE t SET v = 11 WHERE id = 1"
    [[step]]
    session = "b"
    sql = "BEGIN; UPDATE t SET v = 21 WHERE id = 2"
    [[step]]
    name = "b-waits"
    session = "b"
    sql = "UPDATE t SET v = 22 WHERE id = 1"
    expect = { deadlock = true }
    [[step]]
    name = "a-closes"
    session = "a"
    sql = "UPDATE t SET v = 12 WHERE id = 2"
    expect = { deadlock = ["b", "a"] }
    [[step]]
    session = "a"
    sql = "ROLLBACK"
    [[step]]
    session = "b"
    sql = "COMMIT"
    """
    pinned = "[{ name = 'a', setup = \"SET deadlock_timeout = '100ms'\" }, { name = 'b', setup = \"SET deadlock_timeout = '100s'\" }]"
    got = {r.description: r for r in evaluate(pgrace_run(scenario(body, sessions=pinned)))}
    assert got["a-closes: is the victim of a deadlock of b, a"].ok
    assert not got["b-waits: is the victim of a deadlock"].ok


@pytest.mark.parametrize(
    ("expect", "message"),
    [
        ('{ waits_on = { advisory = "42" } }', "waits_on.advisory is a key"),
        ("{ waits_on = { advisory = [1, 2, 3] } }", "waits_on.advisory is a key"),
        ('{ waits_on = { transaction_of = "zed" } }', "unknown session 'zed'"),
        ('{ waits_on = { table = "t", mode = "BIG" } }', "table lock mode is one of AccessShareLock"),
        ("{ waits_on = { unique_index = 3 } }", "waits_on.unique_index is the unique index's name"),
        ('{ waits_on = { advisory = 1, transaction_of = "a" } }', "waits_on is a row"),
        ('{ waits_on = { tabel = "t" } }', "did you mean 'table'?"),
        ('{ deadlock = ["a"] }', "expect.deadlock is true, or the sessions of the cycle"),
        ('{ deadlock = ["a", "zed"] }', "expect.deadlock names unknown session 'zed'"),
        ("{ message = 3 }", "expect.message is a pattern"),
    ],
)
def test_bad_wait_expectations_name_their_line(expect: str, message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        scenario(blocked(*TABLE, expect))
    assert str(info.value).startswith("waits.toml:12: "), str(info.value)
    assert message in info.value.message
