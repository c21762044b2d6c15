"""Who holds a row lock when pgrowlocks gives no pid (pid 0): a subtransaction's session, a
prepared transaction, or nobody (a finished member of a multixact). No pid reaches the text."""

from __future__ import annotations

from pgrace.drivers.check import GOLDEN_STYLE
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.model.timeline import Run
from pgrace.pytest_plugin import RunScenario
from pgrace.render.text import render_text


def held(run: Run, step: str) -> list[tuple[str, int, str]]:
    [found] = [s for s in run.step_runs() if s.step == step]
    assert found.locks_after is not None
    return [(lk.session, lk.row.key_dict()["id"] if lk.row else -1, lk.mode) for lk in found.locks_after]


def test_a_subtransaction_and_a_prepared_transaction_are_named_and_a_finished_locker_is_gone(
    pgrace_run: RunScenario,
) -> None:
    run = pgrace_run(
        parse_toml_scenario(
            """
            setup = '''
            CREATE TABLE parents (id int PRIMARY KEY, n int NOT NULL DEFAULT 0);
            CREATE TABLE children (id int PRIMARY KEY, parent_id int REFERENCES parents);
            INSERT INTO parents (id) VALUES (1), (2), (3);
            '''
            sessions = ["a", "b"]
            [[step]]
            name = "subxact"
            session = "a"
            sql = "BEGIN; SAVEPOINT s; SELECT id FROM parents WHERE id = 1 FOR UPDATE"
            [[step]]
            name = "prepared"
            session = "b"
            sql = "BEGIN; SELECT id FROM parents WHERE id = 2 FOR UPDATE; PREPARE TRANSACTION 'pgrace_owner_test'"
            [[step]]
            name = "update"
            session = "a"
            sql = "UPDATE parents SET n = n + 1 WHERE id = 3"
            [[step]]
            name = "fk-check"
            session = "b"
            sql = "INSERT INTO children VALUES (1, 3)"
            [[step]]
            session = "a"
            sql = "ROLLBACK"
            [[step]]
            name = "finish"
            session = "b"
            sql = "ROLLBACK PREPARED 'pgrace_owner_test'"
            """,
            "owners.toml",
        )
    )
    assert held(run, "subxact") == [("a", 1, "FOR UPDATE")]
    assert ("a prepared transaction", 2, "FOR UPDATE") in held(run, "prepared")
    # b's committed FK check left FOR KEY SHARE in row 3's multixact beside a's update: not held any more
    assert held(run, "fk-check") == [
        ("a", 1, "FOR UPDATE"),
        ("a", 3, "NO KEY UPDATE"),
        ("a prepared transaction", 2, "FOR UPDATE"),
    ]
    assert held(run, "finish") == []
    assert "pid " not in render_text(run, GOLDEN_STYLE)
