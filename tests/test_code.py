"""Interleaving the application's own Python (pgrace.drivers.code): the issue-14 acceptance, on a real server."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest
from documentation import page

import pgrace
import pgrace.engine.threads.session
from pgrace.drivers.code import explore_code, run_code
from pgrace.engine.scheduler import Scheduler
from pgrace.errors import CodeError, PgraceError, SetupFailed
from pgrace.model.scenario import RowRef
from pgrace.model.timeline import Run
from pgrace.pytest_plugin import PgraceCode
from pgrace.render.json import render_json
from pgrace.render.text import render_text
from pgrace.servers import ServerInfo

ROOT = Path(__file__).resolve().parent.parent
SETUP = "CREATE TABLE accounts (id int PRIMARY KEY, balance int); INSERT INTO accounts VALUES (1, 500)"
FINAL = "SELECT balance FROM accounts WHERE id = 1"


def withdraw(conn: Any) -> None:
    (balance,) = conn.execute("SELECT balance FROM accounts WHERE id = 1").fetchone()
    conn.execute("UPDATE accounts SET balance = %s WHERE id = 1", (balance - 100,))
    conn.commit()


def withdraw_locked(conn: Any) -> None:
    (balance,) = conn.execute("SELECT balance FROM accounts WHERE id = 1 FOR UPDATE").fetchone()  # line 38
    conn.execute("UPDATE accounts SET balance = %s WHERE id = 1", (balance - 100,))
    conn.commit()


def _example(name: str) -> ModuleType:
    path = ROOT / "examples" / "code" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"pgrace_example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # SQLAlchemy resolves Mapped[...] annotations through it
    spec.loader.exec_module(module)
    return module


def _finals(found: pgrace.Exploration) -> dict[Any, int]:
    return {c.final[0]: c.count for c in found.classes}


def test_the_lost_update_is_found_with_its_simplest_example(pgrace_server: ServerInfo) -> None:
    found = explore_code({"alice": withdraw, "bob": withdraw}, setup=SETUP, final=FINAL, server=pgrace_server)
    assert set(_finals(found)) == {((400,),), ((300,),)}
    assert found.complete and found.explored == sum(c.count for c in found.classes)
    lost = next(c for c in found.classes if c.final[0] == ((400,),))
    kinds = [sql.split()[0] for _, sql in lost.statements if sql != "COMMIT"]
    assert kinds == ["SELECT", "SELECT", "UPDATE", "UPDATE"]  # reads, reads, writes, writes
    assert {s for s, _ in lost.statements[:2]} == {"alice", "bob"}
    assert "UPDATE accounts SET balance = 400 WHERE id = 1" in [sql for _, sql in lost.statements]


def test_select_for_update_makes_every_interleaving_end_at_300(pgrace_server: ServerInfo) -> None:
    found = explore_code(
        {"alice": withdraw_locked, "bob": withdraw_locked}, setup=SETUP, final=FINAL, server=pgrace_server
    )
    assert _finals(found) == {((300,),): found.explored}
    assert found.classes[0].waits > 0  # the cure works by making the second one wait


def test_the_same_classes_as_pgrace_explore_of_the_scenario_file(pgrace_server: ServerInfo) -> None:
    """explore_code's outcome keys are pgrace explore's (the shipped lost-update scenario, same SQL)."""
    from pgrace.drivers.explore import explore
    from pgrace.frontends import catalog

    scenario = catalog.read_scenario("lost-update")
    from_file = {tuple(tuple(r) for r in c.final[0]) for c in explore(scenario, pgrace_server).classes}
    setup = "CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, balance int NOT NULL);"
    setup += " INSERT INTO accounts VALUES (1, 'shared', 500)"
    found = explore_code(
        {"alice": withdraw, "bob": withdraw}, setup=setup, final=scenario.checks[0].sql, server=pgrace_server
    )
    assert {c.final[0] for c in found.classes} == from_file


def test_the_sqlalchemy_orm_race_is_found_the_same_way(pgrace_server: ServerInfo) -> None:
    example = _example("withdraw_sqlalchemy")
    sessions = {"alice": example.withdraw, "bob": example.withdraw}
    found = explore_code(sessions, setup=example.SETUP, final=example.FINAL, server=pgrace_server)
    assert set(_finals(found)) == {((400,),), ((300,),)}
    lost = next(c for c in found.classes if c.final[0] == ((400,),))
    kinds = [sql.split()[0] for _, sql in lost.statements if sql != "COMMIT"]
    assert kinds == ["SELECT", "SELECT", "UPDATE", "UPDATE"]
    cured = {"alice": example.withdraw_locked, "bob": example.withdraw_locked}
    found = explore_code(cured, setup=example.SETUP, final=example.FINAL, server=pgrace_server)
    assert _finals(found) == {((300,),): found.explored}


def test_the_psycopg_example_race_and_cure(pgrace_server: ServerInfo) -> None:
    example = _example("withdraw_psycopg")
    found = explore_code(
        {"alice": example.withdraw, "bob": example.withdraw},
        setup=example.SETUP,
        final=example.FINAL,
        server=pgrace_server,
    )
    assert set(_finals(found)) == {((400,),), ((300,),)}
    cured = {"alice": example.withdraw_locked, "bob": example.withdraw_locked}
    found = explore_code(cured, setup=example.SETUP, final=example.FINAL, server=pgrace_server)
    assert set(_finals(found)) == {((300,),)}


def _bob_waits_for_alice(server: ServerInfo) -> Run:
    """alice locks the row and commits while bob waits for it."""
    return run_code(
        {"alice": withdraw_locked, "bob": withdraw_locked},
        setup=SETUP,
        final=FINAL,
        order=["alice", "bob", "alice", "alice", "bob", "bob"],
        server=server,
    )


def test_a_code_run_names_the_row_its_holder_and_the_callers_line(pgrace_server: ServerInfo) -> None:
    run = _bob_waits_for_alice(pgrace_server)
    steps = run.step_runs()
    waiting = [s for s in steps if s.waited]
    assert [s.session for s in waiting] == ["bob"]
    wait = waiting[0].waits[0]
    assert wait.row == RowRef("accounts", (("id", 1),)) and wait.holder == "alice"
    assert waiting[0].release is not None and waiting[0].release.session == "alice"  # alice's COMMIT freed it
    line = withdraw_locked.__code__.co_firstlineno + 1
    assert run.scenario.step(waiting[0].step).note.endswith(f"test_code.py:{line}")
    text = render_text(run)
    assert "waits for alice on row accounts id=1" in text
    assert f"test_code.py:{line}" in text
    assert "balance=300" in text
    render_json(run)  # every renderer works on it


def test_a_code_run_is_waited_for_by_the_scenario_scheduler(
    pgrace_server: ServerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One scheduler: a code run's statements are launched, seen blocked and completed by the scheduler
    scenario steps run on; only its way to wait differs (the session threads' gates, not sockets)."""
    seen: list[tuple[str, str]] = []
    try_complete = Scheduler.try_complete

    def spy(self: Scheduler, active: Any, blocking: bool, retry: bool = False) -> bool:
        seen.append((type(self.transport.waiting).__name__, active.step.session))
        return try_complete(self, active, blocking, retry)

    monkeypatch.setattr(Scheduler, "try_complete", spy)
    _bob_waits_for_alice(pgrace_server)
    assert {strategy for strategy, _ in seen} == {"GateWaiting"}
    assert {session for _, session in seen} == {"alice", "bob"}


def test_a_holder_slow_to_hear_its_commit_still_gets_the_release(
    pgrace_server: ServerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server frees bob the moment alice commits; alice's thread may hear "COMMIT" later than bob
    hears his row. The release is still alice's COMMIT: her answer is on the wire, so pgrace waits for it."""
    finish = pgrace.engine.threads.session._finish

    def late_for_alice(gate: Any, outcome: Any, conn: Any) -> None:
        if gate.name == "alice" and outcome.commands == ("COMMIT",):
            time.sleep(0.05)  # an injected delay: alice's thread is slow, the server is not
        finish(gate, outcome, conn)

    monkeypatch.setattr(pgrace.engine.threads.session, "_finish", late_for_alice)
    run = _bob_waits_for_alice(pgrace_server)
    (waiting,) = [s for s in run.step_runs() if s.waited]
    assert waiting.release is not None
    assert (waiting.release.cause, waiting.release.session) == ("step", "alice")
    assert run.scenario.step("alice.3").sql == "COMMIT"
    assert waiting.release.seq == next(s.seq for s in run.step_runs() if s.step == "alice.3")


def test_order_is_followed_and_the_timeline_is_the_same_every_time(pgrace_server: ServerInfo) -> None:
    order = ["alice", "bob", "bob", "bob", "alice", "alice"]
    texts = {
        render_text(
            run_code({"alice": withdraw, "bob": withdraw}, setup=SETUP, final=FINAL, order=order, server=pgrace_server)
        )
        for _ in range(2)
    }
    assert len(texts) == 1
    assert "balance=400" in texts.pop()


def test_an_exception_of_the_application_is_an_outcome(pgrace_server: ServerInfo) -> None:
    def withdraw_checked(conn: Any) -> None:
        (balance,) = conn.execute("SELECT balance FROM accounts WHERE id = 1 FOR UPDATE").fetchone()
        if balance < 450:
            raise ValueError("insufficient funds")
        conn.execute("UPDATE accounts SET balance = %s WHERE id = 1", (balance - 100,))
        conn.commit()

    found = explore_code(
        {"alice": withdraw_checked, "bob": withdraw_checked}, setup=SETUP, final=FINAL, server=pgrace_server
    )
    assert {(c.final[0], c.errors) for c in found.classes} == {(((400,),), ("ValueError",))}
    run = found.replay(found.classes[0])
    text = render_text(run)
    assert "raise ValueError('insufficient funds')" in text
    assert "(end of " in text  # the transaction it left open is rolled back, as a step
    raiser = [s.sql for s in run.step_runs() if s.session == run.step_runs()[-1].session]
    assert raiser[-2:] == ["raise ValueError('insufficient funds')", "ROLLBACK"]  # the raise, then its rollback
    assert run.checks == []  # no expectation given: outcomes are reported, not judged


def test_transactions_blocks_executemany_copy_and_server_cursors_are_steps(pgrace_server: ServerInfo) -> None:
    def writer(conn: Any) -> None:
        with conn.transaction():
            conn.cursor().executemany("INSERT INTO t VALUES (%s)", [(1,), (2,)])
        with conn.cursor().copy("COPY t FROM STDIN") as copy:
            for i in (3, 4):
                copy.write_row((i,))  # the COPY's data is not a step of its own
        conn.commit()
        with conn.cursor(name="reader") as named:
            named.execute("SELECT i FROM t WHERE i > %s", (1,))
            assert len(named.fetchall()) == 3
        conn.rollback()

    run = run_code({"w": writer}, setup="CREATE TABLE t (i int)", final="SELECT count(*) FROM t", server=pgrace_server)
    shown = [s.sql for s in run.step_runs()]
    assert shown == [
        "BEGIN (conn.transaction())",
        "INSERT INTO t VALUES (%s) -- ×2",
        "COMMIT (end of conn.transaction())",
        "COPY t FROM STDIN",
        "COMMIT",
        "DECLARE reader CURSOR FOR SELECT i FROM t WHERE i > 1",
        "FETCH (server-side cursor)",
        "CLOSE (server-side cursor)",
        "ROLLBACK",
    ]
    rows = run.check_outcomes()[0].last_rows
    assert rows is not None and rows.text_rows == (("4",),)


def test_a_deadlock_between_two_functions_is_the_servers_verdict(pgrace_server: ServerInfo) -> None:
    def transfer(first: int, second: int) -> Any:
        def move(conn: Any) -> None:
            conn.execute("UPDATE accounts SET balance = balance - 1 WHERE id = %s", (first,))
            conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = %s", (second,))
            conn.commit()

        return move

    run = run_code(
        {"a": transfer(1, 2), "b": transfer(2, 1)},
        setup="CREATE TABLE accounts (id int PRIMARY KEY, balance int); INSERT INTO accounts VALUES (1, 5), (2, 5)",
        order=["a", "b", "a", "b"],
        server=pgrace_server,
    )
    errors = [s.outcome.error.sqlstate for s in run.step_runs() if s.outcome and s.outcome.error]
    assert "40P01" in errors


# -- bad input: one message each, nothing left behind ---------------------------------------------


def _leftovers(server: ServerInfo, name: str) -> list[Any]:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        backends = conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE %s", (f"pgrace/{name}/%",)
        ).fetchall()
        scratch = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (f"%code_{name}%",)).fetchall()
    threads = [t.name for t in threading.enumerate() if t.name.startswith("pgrace session")]
    return [*backends, *scratch, *threads]


def never_touches(conn: Any) -> None:
    return None


def raises_first(conn: Any) -> None:
    raise RuntimeError("config missing")


def opens_its_own(conn: Any) -> None:
    conn.execute("SELECT 1")
    with psycopg.connect(conn.info.dsn) as other:
        other.execute("SELECT 1")


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (never_touches, "session bad sent no statement: none on the connection pgrace passed it"),
        (raises_first, "session bad raised RuntimeError before its first statement: config missing"),
        (opens_its_own, "session bad opened a connection of its own at tests/test_code.py:"),
    ],
)
def test_bad_session_code_is_one_message_naming_the_function(
    pgrace_server: ServerInfo, fn: Any, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    with pytest.raises(CodeError) as caught:
        explore_code({"good": withdraw, "bad": fn}, setup=SETUP, final=FINAL, server=pgrace_server, name="badinput")
    text = str(caught.value)
    assert message in text
    assert text.startswith(f"tests/test_code.py:{fn.__code__.co_firstlineno}: ")
    assert caught.value.exit_code == 2
    assert _leftovers(pgrace_server, "badinput") == []


def test_python_that_never_sends_anything_is_bounded_by_the_step_timeout(pgrace_server: ServerInfo) -> None:
    def dawdles(conn: Any) -> None:
        conn.execute("SELECT 1")
        deadline = time.monotonic() + 0.8  # the application computing, not a wait for the database
        while time.monotonic() < deadline:
            pass
        conn.execute("SELECT 2")

    with pytest.raises(CodeError, match=r"session slow ran Python for more than 0\.3 s without sending a statement"):
        run_code({"slow": dawdles}, step_timeout=0.3, server=pgrace_server, name="dawdle")
    assert _leftovers(pgrace_server, "dawdle") == []


def test_an_engine_of_its_own_is_a_connection_of_its_own(pgrace_server: ServerInfo) -> None:
    def own_engine(conn: Any) -> None:
        from sqlalchemy import create_engine, text

        conn.execute("SELECT 1")
        url = f"postgresql+psycopg:///?{conn.info.dsn.replace(' ', '&')}"
        with create_engine(url).connect() as other:
            other.execute(text("SELECT 1"))

    with pytest.raises(CodeError, match="session own opened a connection of its own at "):
        run_code({"own": own_engine}, server=pgrace_server, name="ownengine")
    assert _leftovers(pgrace_server, "ownengine") == []


def test_a_statement_that_never_returns_is_cancelled_at_the_step_timeout(pgrace_server: ServerInfo) -> None:
    seen: list[tuple[str, str]] = []

    def sleeper(conn: Any) -> None:
        seen.append(conn.execute("SELECT current_database(), current_setting('application_name')").fetchone())
        conn.execute("SELECT pg_sleep(60)")

    run = run_code({"s": sleeper}, step_timeout=0.5, server=pgrace_server, name="sleeper")
    assert "code_sleeper" in seen[0][0] and seen[0][1] == "pgrace/sleeper/s"  # what _leftovers looks for
    step = run.step_runs()[1]
    assert step.cancelled and step.outcome is not None and step.outcome.error is not None
    assert step.outcome.error.sqlstate == "57014"
    assert "pgrace cancelled it after the step timeout 0.5 s" in (step.outcome.error.detail or "")
    assert _leftovers(pgrace_server, "sleeper") == []


@pytest.mark.timing
def test_a_setup_that_hangs_is_cut_by_the_step_timeout(pgrace_server: ServerInfo) -> None:
    """A code run's setup is control SQL as a scenario's: bounded by the step timeout, then cancelled."""
    started = time.perf_counter()
    with pytest.raises(SetupFailed) as caught:
        run_code({"alice": withdraw}, setup="SELECT pg_sleep(60)", step_timeout=0.5, server=pgrace_server, name="hangs")
    assert time.perf_counter() - started < 10
    assert "setup failed: ERROR:  canceling statement due to user request" in str(caught.value)
    assert "pgrace cancelled it after the step timeout 0.5 s" in str(caught.value)
    assert _leftovers(pgrace_server, "hangs") == []


def test_a_failed_setup_exits_1_as_a_scenarios_does(pgrace_server: ServerInfo, monkeypatch: pytest.MonkeyPatch) -> None:
    """A setup the server refuses is the run's failure (exit 1), not bad input (exit 2), as for a scenario file."""
    monkeypatch.chdir(ROOT)
    with pytest.raises(SetupFailed) as caught:
        run_code({"alice": withdraw}, setup="CREATE TABLE accounts (", server=pgrace_server, name="badsetup")
    assert caught.value.exit_code == 1
    assert str(caught.value).startswith(
        f"tests/test_code.py:{withdraw.__code__.co_firstlineno}: setup failed: ERROR:  "
    )
    assert isinstance(caught.value.run, Run) and caught.value.run.failed_setup() is not None
    assert _leftovers(pgrace_server, "badsetup") == []


def test_unknown_sessions_in_order_are_refused(pgrace_server: ServerInfo) -> None:
    with pytest.raises(PgraceError, match="order names 'carol', which is not a session"):
        run_code({"alice": withdraw}, setup=SETUP, order=["carol"], server=pgrace_server)


# -- the pytest fixture ---------------------------------------------------------------------------


def test_the_fixture_explores_and_a_failure_shows_the_failing_timeline(
    pgrace_code: PgraceCode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    found = pgrace_code.explore({"alice": withdraw, "bob": withdraw}, setup=SETUP, final=FINAL)
    with pytest.raises(pytest.fail.Exception) as failed:
        pgrace_code.assert_every(found, lambda c: c.final[0] == ((300,),), "both withdrawals land")
    text = str(failed.value)
    lost = next(c for c in found.classes if c.final[0] == ((400,),))
    assert f"{lost.count} of {found.runs} runs fail (both withdrawals land): final (400)\n" in text
    assert f"» tests/test_code.py:{withdraw.__code__.co_firstlineno + 2}" in text  # the UPDATE's line
    assert "final state:\n  SELECT balance FROM accounts WHERE id = 1  → balance=400" in text
    cured = pgrace_code.explore({"alice": withdraw_locked, "bob": withdraw_locked}, setup=SETUP, final=FINAL)
    pgrace_code.assert_every(cured, lambda c: c.final[0] == ((300,),))
    run: Run = pgrace_code.run({"alice": withdraw}, setup=SETUP, final=FINAL)
    assert run.check_outcomes()[0].last_rows is not None


def test_import_pgrace_stays_cheap() -> None:
    """The code API is in pgrace.__all__, but importing pgrace loads neither it nor psycopg."""
    assert {"run_code", "explore_code", "CodeError"} <= set(pgrace.__all__)
    probe = "import sys, pgrace; print(sorted(m for m in ('psycopg', 'pgrace.drivers.code', 'sqlalchemy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_docs_show_the_examples_real_output(
    pgrace_server: ServerInfo, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import re

    monkeypatch.chdir(ROOT)
    text = page("guide/your-own-code.md")
    block = re.search(r"<!-- output: python examples/code/withdraw_psycopg.py -->\n```text\n(.*?)```\n", text, re.S)
    assert block is not None
    _example("withdraw_psycopg").main(server=pgrace_server)
    shown = capsys.readouterr().out

    def server_free(text: str) -> str:  # the server line names the server the tests run on
        return "\n".join(line for line in text.splitlines() if not line.startswith("server: "))

    assert server_free(shown) == server_free(block[1])
