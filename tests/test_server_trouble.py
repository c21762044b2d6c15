"""When the server lets a session, pgrace or itself down: recorded, diagnosed, cleaned up.

* A session whose backend is terminated is a :class:`SessionLost` event, once; its later
  steps are not sent, and the other sessions carry on (the lock inspector too).
* A deadlock names its cycle in session names, never with pids or xids.
* A step that can never finish is cancelled with a diagnosis of the session it waits for.
* The server killed under a run: one line, exit 3, nothing left behind.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import signal
import socket
import textwrap
from pathlib import Path

import psycopg
import pytest
from helpers import by_name, text_of, toml_scenario
from procs import start_blocked_run, wait_gone

from pgrace import api
from pgrace.cli.exits import lost_server
from pgrace.cli.terminal.presenter import Presenter
from pgrace.engine.libpq.runner import Runner
from pgrace.engine.options import RunOptions
from pgrace.errors import RunAborted
from pgrace.frontends.spec import parse_spec
from pgrace.model.scenario import Step
from pgrace.model.timeline import Release, Run, StepCancelled, StepRun
from pgrace.pytest_plugin import RunScenario
from pgrace.render.html import render_html
from pgrace.render.isolation import render_isolation
from pgrace.render.json import render_json, run_to_dict
from pgrace.render.markdown import render_markdown
from pgrace.render.mermaid import render_mermaid
from pgrace.render.svg import render_svg
from pgrace.render.text import Style
from pgrace.scratch import scratch_database
from pgrace.scratch.databases import aborted_if_lost
from pgrace.servers import ServerInfo, deferred_interrupts

SETUP = "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 10), (2, 20);"
scenario = functools.partial(toml_scenario, setup=SETUP, name="trouble")
# With a timeout, pg_terminate_backend returns once the backend is gone: the victim's
# loss is then seen at the same point of the timeline on every run.
KILL = "SELECT count(pg_terminate_backend(pid, 5000)) AS killed FROM pg_stat_activity WHERE application_name = {!r}"


def flat(text: str) -> str:
    """The text with its table wrapping undone, to look for a sentence."""
    return " ".join(text.split())


def error_of(step: StepRun) -> tuple[str, str, str]:
    assert step.outcome is not None and step.outcome.error is not None, step
    error = step.outcome.error
    return error.severity, error.sqlstate, error.message


IDLE_VICTIM = f"""
    [[step]]
    session = "a"
    sql = "BEGIN; UPDATE t SET v = 11 WHERE id = 1"
    [[step]]
    name = "kill"
    session = "b"
    sql = "{KILL.format("pgrace/trouble/a")}"
    [[step]]
    name = "noticed"
    session = "a"
    sql = "SELECT 1"
    [[step]]
    name = "later"
    session = "a"
    sql = "SELECT 2"
    [[step]]
    name = "b-goes-on"
    session = "b"
    sql = "UPDATE t SET v = 12 WHERE id = 1 RETURNING v"
"""


def test_a_terminated_idle_session_is_lost_once_and_the_others_go_on(pgrace_run: RunScenario) -> None:
    """a is idle when b terminates it: pgrace looks after b's step, records the loss with the server's reason,
    and a's next step still meets the FATAL; the one after is not sent."""
    run = pgrace_run(scenario(IDLE_VICTIM))
    steps = by_name(run)
    kill = steps["kill"].seq
    assert [(e.session, e.during_seq, e.sqlstate, e.idle) for e in run.sessions_lost()] == [("a", kill, "57P01", True)]
    assert error_of(steps["noticed"]) == ("FATAL", "57P01", "terminating connection due to administrator command")
    assert error_of(steps["later"]) == ("ERROR", "08003", f"not sent: session a's connection was lost at step {kill}")
    # a's transaction died with it: b updates the row at once
    assert not steps["b-goes-on"].waited and steps["b-goes-on"].status == "ok"
    text = text_of(run, 160)
    assert text.count("⚡") == 1 and "⚡ the server ended a's connection (57P01: terminating" in flat(text)
    assert "XX000" not in text and "XX000" not in render_json(run)
    assert run_to_dict(run)["sessions_lost"] == [
        {
            "session": "a",
            "at_step": kill,
            "sqlstate": "57P01",
            "message": "terminating connection due to administrator command",
            "idle": True,
        }
    ]


def test_a_blocked_session_terminated_meanwhile_and_the_inspector_keeps_working(pgrace_run: RunScenario) -> None:
    """b waits on a's row and is terminated; c then waits on the same row, probed with b's dead pid in the list."""
    run = pgrace_run(
        scenario(
            f"""
            [[step]]
            session = "a"
            sql = "BEGIN; UPDATE t SET v = 11 WHERE id = 1"
            [[step]]
            name = "b-waits"
            session = "b"
            sql = "UPDATE t SET v = 12 WHERE id = 1"
            [[step]]
            name = "kill-b"
            session = "c"
            sql = "{KILL.format("pgrace/trouble/b")}"
            [[step]]
            name = "c-waits"
            session = "c"
            sql = "UPDATE t SET v = 13 WHERE id = 1"
            [[step]]
            name = "b-later"
            session = "b"
            sql = "SELECT 1"
            [[step]]
            name = "commit"
            session = "a"
            sql = "COMMIT"
            """,
            sessions='["a", "b", "c"]',
        )
    )
    steps = by_name(run)
    assert steps["b-waits"].waited
    assert error_of(steps["b-waits"])[:2] == ("FATAL", "57P01")
    [lost] = run.sessions_lost()
    assert (lost.session, lost.during_seq) == ("b", steps["b-waits"].seq)
    assert steps["c-waits"].waited and steps["c-waits"].blocked_by == ["a"]
    assert steps["c-waits"].released_by == steps["commit"].seq and steps["c-waits"].status == "ok"
    assert error_of(steps["b-later"])[1] == "08003"
    first, second = text_of(run, 160), text_of(pgrace_run(run.scenario), 160)
    assert first == second, "the timeline of a lost session is deterministic"


def test_a_connection_that_breaks_without_a_word_is_08006_not_XX000(pgrace_server: ServerInfo) -> None:
    """The socket closes under session a (no FATAL from the server): libpq's words, SQLSTATE 08006."""
    lost = scenario(IDLE_VICTIM.replace(KILL.format("pgrace/trouble/a"), "SELECT 0"))
    runner: list[Runner] = []

    def cut_the_wire(step: Step) -> None:
        if step.name == "noticed":
            with socket.socket(fileno=os.dup(runner[0].sessions["a"].pgconn.socket)) as wire:
                wire.shutdown(socket.SHUT_RDWR)

    with scratch_database(pgrace_server, "trouble") as db:
        run = Run(lost, pgrace_server.version, pgrace_server.label, db.has_pgrowlocks)
        with Runner(lost, db.dsn, run, RunOptions(before_step=cut_the_wire)) as started:
            runner.append(started)
            started.run_all()
    steps = by_name(run)
    assert error_of(steps["noticed"]) == ("FATAL", "08006", "server closed the connection unexpectedly")
    assert [(e.session, e.sqlstate, e.message) for e in run.sessions_lost()] == [
        ("a", "08006", "server closed the connection unexpectedly")
    ]
    assert error_of(steps["later"])[1] == "08003" and steps["b-goes-on"].status == "ok"


def test_every_renderer_shows_a_lost_session(pgrace_run: RunScenario) -> None:
    run = pgrace_run(scenario(IDLE_VICTIM))
    assert "the server ended a&#x27;s connection" in render_svg(run) or "the server ended a's connection" in render_svg(
        run
    )
    assert "the server ended a" in render_html(run)
    assert "the server ended a's connection" in render_markdown(run)
    assert "the server ended a's connection" in render_mermaid(run)
    assert "terminating connection due to administrator command" in render_isolation(run)
    shown: list[str] = []

    class Out:
        def write(self, text: str) -> None:
            shown.append(text)

        def flush(self) -> None:
            pass

    presenter = Presenter(run.scenario, Style(), out=Out(), tty=False)  # type: ignore[arg-type]
    for event in run.events:
        presenter.on_event(event)
    presenter.finish(run)
    assert "⚡ the server ended a's connection" in "".join(shown)
    assert "the server ended a's connection while it ran nothing, found after step 2 (57P01" in " ".join(
        "".join(shown).split()
    )


def test_a_spec_session_lost_in_one_permutation_is_reconnected_for_the_next(pgrace_server: ServerInfo) -> None:
    spec = parse_spec(
        textwrap.dedent(
            """
            setup { CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 10); }
            teardown { DROP TABLE t; }
            session s1
            step s1u { UPDATE t SET v = v + 1 WHERE id = 1; }
            session s2
            step s2k { SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity WHERE application_name = 'isolation/lost/s1'; }
            step s2u { BEGIN; UPDATE t SET v = v + 1 WHERE id = 1; }
            step s2c { COMMIT; }
            permutation s2k s1u
            permutation s2u s1u s2c
            """
        ),
        "lost.spec",
    )
    run = api.run(spec, server=pgrace_server)
    second_s1u = next(s for s in run.step_runs() if s.permutation == 1 and s.step == "s1u")
    assert [e.session for e in run.sessions_lost()] == ["s1"]
    assert second_s1u.waited and second_s1u.blocked_by == ["s2"] and second_s1u.status == "ok"


def test_a_deadlock_victim_gets_40P01_and_names_its_cycle_in_sessions(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        scenario(
            """
            [[step]]
            session = "a"
            sql = "BEGIN; UPDATE t SET v = 0 WHERE id = 1"
            [[step]]
            session = "b"
            sql = "SET deadlock_timeout = '10ms'; BEGIN; UPDATE t SET v = 0 WHERE id = 2"
            [[step]]
            name = "a2"
            session = "a"
            sql = "UPDATE t SET v = 0 WHERE id = 2"
            [[step]]
            name = "b1"
            session = "b"
            sql = "UPDATE t SET v = 0 WHERE id = 1"
            """
        )
    )
    steps = by_name(run)
    b1, a2 = steps["b1"], steps["a2"]
    assert a2.waited and a2.status == "ok"  # the other session completes
    assert a2.release == Release("deadlock", seq=b1.seq)  # freed by the detector aborting the victim
    assert b1.released_by is None  # the victim ended on its own; no step released it
    assert b1.outcome is not None and b1.outcome.error is not None
    cycle = ("b waits for ShareLock on a's transaction", "a waits for ShareLock on b's transaction")
    assert b1.outcome.error.sqlstate == "40P01" and b1.outcome.error.cycle == cycle
    assert b1.outcome.error.detail and "Process" in b1.outcome.error.detail  # the raw DETAIL stays in JSON
    text = text_of(run, 160)
    assert "↻ deadlock: " + "; ".join(cycle) in flat(text)
    assert "Process" not in text and not re.search(r"transaction \d", text)
    [step] = [s for s in json.loads(render_json(run))["steps"] if s["name"] == "b1"]
    assert step["error"]["cycle"] == list(cycle)


def test_table_and_advisory_deadlocks_name_the_table_and_the_key(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        scenario(
            """
            [[step]]
            session = "a"
            sql = "BEGIN; LOCK TABLE t IN SHARE MODE; SELECT pg_advisory_xact_lock(7)"
            [[step]]
            session = "b"
            sql = "SET deadlock_timeout = '10ms'; BEGIN; SELECT pg_advisory_xact_lock(8)"
            [[step]]
            name = "a-wants-8"
            session = "a"
            sql = "SELECT pg_advisory_xact_lock(8)"
            [[step]]
            name = "b-wants-t"
            session = "b"
            sql = "LOCK TABLE t IN EXCLUSIVE MODE"
            """
        )
    )
    error = by_name(run)["b-wants-t"].outcome.error  # type: ignore[union-attr]
    assert error is not None and error.sqlstate == "40P01"
    assert error.cycle == (
        "b waits for ExclusiveLock on table t",
        "a waits for ExclusiveLock on advisory lock 8",
    )


def cancelled(run: Run) -> StepCancelled:
    [event] = [e for e in run.events if isinstance(e, StepCancelled)]
    return event


def test_a_hang_names_the_holder_idle_in_transaction_until_a_later_step(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        scenario(
            """
            [[step]]
            session = "a"
            sql = "BEGIN; UPDATE t SET v = 11 WHERE id = 1"
            [[step]]
            name = "stuck"
            session = "b"
            sql = "UPDATE t SET v = 12 WHERE id = 1"
            [[step]]
            name = "next"
            session = "b"
            sql = "SELECT 1"
            [[step]]
            name = "a-commit"
            session = "a"
            sql = "COMMIT"
            """
        ),
        step_timeout=0.3,
    )
    event = cancelled(run)
    [holder] = event.holders
    assert (holder.session, holder.state, holder.next_step) == ("a", "idle in transaction", "a-commit")
    assert holder.running is None
    line = flat(text_of(run, 160))
    assert (
        "⌛ stuck cancelled after 0.3 s (b waits for a; a is idle in transaction,"
        " its next step (a-commit: COMMIT) comes later)" in line
    )


def test_a_hang_says_when_the_holder_has_no_step_left(pgrace_run: RunScenario) -> None:
    run = pgrace_run(
        scenario(
            """
            [[step]]
            session = "a"
            sql = "BEGIN; UPDATE t SET v = 11 WHERE id = 1"
            [[step]]
            name = "stuck"
            session = "b"
            sql = "UPDATE t SET v = 12 WHERE id = 1"
            """
        ),
        step_timeout=0.3,
    )
    assert "a is idle in transaction and has no step left to end it" in flat(text_of(run, 160))


def test_losing_pgraces_observer_aborts_the_run_and_says_so(pgrace_server: ServerInfo) -> None:
    """What the run saw cannot be told without its observer (a lost control connection is opened again:
    test_hostile_scenarios)."""
    killer = scenario(
        f"""
        [[step]]
        session = "a"
        sql = "{KILL.format("pgrace/trouble/observer")}"
        [[step]]
        session = "a"
        sql = "SELECT 1"
        [[check]]
        description = "reaches the control connection"
        sql = "SELECT 1"
        rows = [[1]]
        """
    )
    # The observer is the superuser's: a run's own role cannot end it (test_hostile_scenarios), a --superuser run can.
    server = dataclasses.replace(pgrace_server, scenario_role=False)
    with pytest.raises(RunAborted, match=r"^pgrace's observer connection was lost during the run"):
        api.run(killer, server=server)
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        assert admin.execute("SELECT count(*) FROM pg_database WHERE datname LIKE 'pgrace_trouble%'").fetchone() == (0,)


# -- the server itself dies ---------------------------------------------------------------

RUN_ROOT = Path("/dev/shm")


def processes_in(run_dir: Path) -> list[int]:
    """Processes working in the run directory (postgres chdirs into its data directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if cwd.startswith(str(run_dir)):
                found.append(int(entry.name))
    return found


@pytest.mark.server
@pytest.mark.skipif(not RUN_ROOT.is_dir(), reason="no /dev/shm on this machine")
def test_the_server_killed_mid_run_is_one_line_exit_3_and_nothing_left(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGRACE_DSN", raising=False)
    child, _ = start_blocked_run([])
    [run_dir] = sorted(RUN_ROOT.glob(f"pgrace-{child.pid}-*"))
    postmaster = int((run_dir / "data" / "postmaster.pid").read_text().split("\n", 1)[0])
    os.kill(postmaster, signal.SIGKILL)
    assert child.stdin is not None
    child.stdin.write("\n")  # alice's next step meets a dead server
    child.stdin.flush()
    stdout, stderr = child.communicate(timeout=60)
    assert child.returncode == 3, stderr
    assert stderr.count("\n") == 1 and stderr.startswith("pgrace: the server went away during the run ("), stderr
    assert "Traceback" not in stdout + stderr
    assert "XX000" not in stdout  # whichever connection noticed first, a lost one is never "internal error"
    assert wait_gone(postmaster)
    assert not run_dir.exists()
    assert processes_in(run_dir) == []


def terminated_connection(dsn: str) -> None:
    """Use a connection the server ended (module level: a -j worker process imports it too)."""
    with psycopg.connect(dsn, autocommit=True) as victim:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s, 5000)", (victim.info.backend_pid,))
        victim.execute("SELECT 1")


@pytest.mark.server
def test_pgraces_own_sql_on_a_connection_the_server_ended_aborts_the_run(pgrace_server: ServerInfo) -> None:
    """Its housekeeping around a run (making the scratch database ready, reading what a run left): exit 3, said."""
    gone = r"the server went away during the run \(terminating connection due to administrator command\)"
    with pytest.raises(RunAborted, match=gone), aborted_if_lost(pgrace_server):
        terminated_connection(pgrace_server.dsn)


@pytest.mark.server
def test_a_connection_the_server_ended_is_exit_3_wherever_pgrace_met_it(pgrace_server: ServerInfo) -> None:
    """A lost server that no driver said is still the server's doing; a statement's own error, or a connection
    pgrace closed itself, is a bug's to report (exit 4)."""
    with pytest.raises(psycopg.errors.AdminShutdown) as ended:
        terminated_connection(pgrace_server.dsn)
    assert lost_server(ended.value) == "the server went away (terminating connection due to administrator command)"
    with (
        psycopg.connect(pgrace_server.dsn, autocommit=True) as conn,
        pytest.raises(psycopg.errors.QueryCanceled) as cancelled,
    ):
        conn.execute("SET statement_timeout = '1ms'; SELECT pg_sleep(1)")
    with pytest.raises(psycopg.OperationalError) as closed:
        conn.execute("SELECT 1")
    assert lost_server(cancelled.value) is None
    assert lost_server(closed.value) is None
    assert lost_server(ValueError("the server went away")) is None


@pytest.mark.server
def test_a_worker_that_meets_a_connection_the_server_ended_says_so(pgrace_server: ServerInfo) -> None:
    """Said in the worker, where the error still knows its connection: exit 3, not a bug."""
    from pgrace.drivers.workers import run_in_processes

    gone = r"^the server went away during the run \(terminating connection due to administrator command\)$"
    with pytest.raises(RunAborted, match=gone):
        run_in_processes([(terminated_connection, (pgrace_server.dsn,))])


class Terminated(Exception):
    """What the CLI's SIGTERM handler raises, here without the CLI."""


def test_cleanup_holds_back_sigterm_as_well_as_ctrl_c() -> None:
    """A SIGTERM during cleanup waits for it: the embedded run directory is never left behind."""

    def raise_terminated(signum: int, frame: object) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        finished = []
        with pytest.raises(Terminated), deferred_interrupts():
            os.kill(os.getpid(), signal.SIGTERM)
            finished.append("cleanup")  # not interrupted: the signal comes after the block
        assert finished == ["cleanup"]
        assert signal.getsignal(signal.SIGTERM) is raise_terminated
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, previous)
