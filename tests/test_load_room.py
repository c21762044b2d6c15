"""How big a load can be, and how its lock waits are counted: pgrace sizes the server it starts to the clients asked for, and the setup takes its time.

A user's server is as it is (a clear refusal when it has no room); pgrace's own server is
started with ``max_connections`` for the most clients asked for, and says so. The setup
and checks of a load are cut at ``--setup-timeout`` (60 s by default), which a real schema's
seed may need more than.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from pgrace.cli import main
from pgrace.drivers.load import DEFAULT_CONNECTIONS, LoadOptions, connections_for, run_load
from pgrace.frontends import catalog
from pgrace.render.load import render_load_text
from pgrace.servers import ServerInfo

SLOW_SETUP = """
name = "slow-seed"
setup = "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0)"
sessions = ["a"]
[[step]]
session = "a"
sql = "UPDATE t SET v = v + 1 WHERE id = 1"
[load]
setup = "SELECT pg_sleep(2)"
transaction = ["UPDATE t SET v = v + 1 WHERE id = 1"]
"""


@pytest.mark.server  # the CLI starts the embedded server itself: no fixture says so
def test_pgraces_own_server_is_started_with_room_for_the_clients_asked_for() -> None:
    clients = DEFAULT_CONNECTIONS + 20  # more than the server has by default: refused before
    result = CliRunner().invoke(
        main, ["load", "lost-update", "-c", str(clients), "-t", "1", "--server", "embedded", "-f", "json"]
    )
    assert result.exit_code == 1, result.output  # the bug loses withdrawals: a violation, not a refusal
    assert f"max_connections = {connections_for(clients)} for {clients} clients" in result.stderr
    loaded = json.loads(result.stdout)
    assert [run["clients"] for run in loaded["runs"]] == [clients]
    assert loaded["runs"][0]["lock_waiters_max"] > 0


def test_a_users_server_without_room_is_still_refused_in_one_line(pgrace_server: ServerInfo) -> None:
    result = CliRunner().invoke(main, ["load", "lost-update", "-c", "1000", "-t", "1", "--dsn", pgrace_server.dsn])
    assert result.exit_code == 2, result.output
    assert "Invalid value for --clients: 1000: the server has room for" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_setup_is_cut_at_setup_timeout_and_the_message_names_it(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    path = tmp_path / "slow-seed.toml"
    path.write_text(SLOW_SETUP)
    cut = CliRunner().invoke(
        main, ["load", str(path), "-c", "1", "-t", "1", "--setup-timeout", "1", "--dsn", pgrace_server.dsn]
    )
    assert cut.exit_code == 1, cut.output
    assert "load setup failed: 57014" in cut.stderr and "--setup-timeout 1 s" in cut.stderr
    assert "--step-timeout" not in cut.stderr  # load has no such option
    waited = CliRunner().invoke(
        main, ["load", str(path), "-c", "1", "-t", "1", "--setup-timeout", "5", "--dsn", pgrace_server.dsn]
    )
    assert waited.exit_code == 0, waited.output


def test_setup_timeout_is_a_whole_number_of_seconds() -> None:
    result = CliRunner().invoke(main, ["load", "lost-update", "--setup-timeout", "nan"])
    assert result.exit_code == 2
    assert "Invalid value for '--setup-timeout': 'nan' is not a whole number of seconds" in result.stderr


WATCH = """
SELECT l.pid, l.locktype, l.transactionid::text, l.relation, l.page, l.tuple
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE NOT l.granted AND a.application_name LIKE 'pgrace-load/%'
"""


def test_every_wait_is_counted_from_the_servers_log_as_a_1ms_watcher_sees_them(pgrace_server: ServerInfo) -> None:
    """A queue's claim under load: the waits load counts are the ones an independent pg_locks watcher sees.

    The watcher polls pg_locks about every millisecond and counts each run of samples in which one
    client waits on one lock. It can merge a client's two waits on one row that follow each other
    within a sample, and see a wait shorter than 1 ms that the server does not log: so the counts
    may differ by a wait or two, never more; every wait the watcher saw last 2 ms or more is counted.
    """
    waits: list[tuple[float, float]] = []
    done = threading.Event()

    def watch() -> None:
        with psycopg.connect(pgrace_server.dsn, autocommit=True) as conn:
            active: dict[tuple[object, ...], list[float]] = {}
            while not done.is_set():
                now = time.monotonic()
                current = {tuple(row) for row in conn.execute(WATCH).fetchall()}
                for key in current:
                    active.setdefault(key, [now, now])[1] = now
                for key in [key for key in active if key not in current]:
                    first, last = active.pop(key)
                    waits.append((first, last))
                done.wait(0.001)
            waits.extend((first, last) for first, last in active.values())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        loaded = run_load(
            catalog.read_scenario("head-of-line-blocking"),
            pgrace_server,
            LoadOptions(clients=(4,), duration=None, transactions=8),
        )
    finally:
        done.set()
        watcher.join()
    (run,) = loaded.runs
    assert run.lock_waits is not None and run.lock_waits > 0
    assert dict(run.lock_waits_by) == {"a row of jobs": run.lock_waits}  # every claim queues on the head job
    assert run.lock_waits_rows and run.lock_waits_rows[0][0] == "jobs"
    long_ones = [w for w in waits if w[1] - w[0] >= 0.002]
    assert run.lock_waits >= len(long_ones)
    assert abs(run.lock_waits - len(waits)) <= max(2, len(waits) // 20), (run.lock_waits, len(waits))


def test_a_users_server_is_sampled_and_its_waits_are_not_counted(pgrace_server: ServerInfo) -> None:
    user_server = dataclasses.replace(pgrace_server, log_path=None, scenario_role=False)
    loaded = run_load(
        catalog.read_scenario("head-of-line-blocking"),
        user_server,
        LoadOptions(clients=(3,), duration=None, transactions=3),
    )
    (run,) = loaded.runs
    assert run.lock_waits is None and run.lock_waits_by == ()
    assert "lock_waits" in run.to_json() and run.to_json()["lock_waits"] is None
    row = render_load_text([loaded]).splitlines()[4].split()
    assert row[0] == "3" and row[-2] == "-"  # lock waits: not counted
