"""How big a load can be, and how its lock waits are counted: pgrace sizes the server it starts to the clients asked for, and the setup takes its time.

A user's server is as it is (a clear refusal when it has no room); pgrace's own server is
started with ``max_connections`` for the most clients asked for, and says so. The setup
and checks of a load are cut at ``--setup-timeout`` (60 s by default), which a real schema's
seed may need more than.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import threading
from collections import Counter
from pathlib import Path
from typing import Any

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


#: One sample: when it was taken (the statement's start, on the server's clock) and every load client's
#: wait then, told apart by when it began (``waitstart``): a client's next wait on the same row is another.
WATCH = """
SELECT extract(epoch FROM statement_timestamp())::float8, w.* FROM (VALUES (1)) AS one (x) LEFT JOIN (
  SELECT l.pid, l.locktype, l.transactionid::text, l.relation, l.page, l.tuple,
         extract(epoch FROM l.waitstart)::float8, a.datname
  FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
  WHERE NOT l.granted AND l.waitstart IS NOT NULL AND a.application_name LIKE 'pgrace-load/%'
) AS w ON true
"""

_LOGGED = re.compile(
    r"^\S+ \S+ \S+ \[(\d+)\] (.*?): LOG:  process \d+ (still waiting for|acquired) .* after ([0-9.]+) ms$"
)


def test_every_wait_is_counted_from_the_servers_log_as_a_watcher_of_pg_locks_sees_them(
    pgrace_server: ServerInfo,
) -> None:
    """A queue's claim under load: the waits load counts are the server's log's, and they are real.

    An independent watcher polls pg_locks and tells each wait apart by its ``waitstart``, so a
    client's back-to-back waits on the head job stay two however far apart its samples are (a
    loaded machine spaces them by hundreds of ms). Per client: every wait it saw last 2 ms or more
    is in the log (the server logs each wait that reaches the 1 ms deadlock_timeout), and every
    logged wait it did not see was shorter, by the log's own ``acquired … after``, than twice its
    longest gap between samples (a longer wait spans a whole gap: some sample saw it).
    """
    seen: dict[tuple[Any, ...], tuple[float, float]] = {}  # (pid, lock, waitstart) -> (waitstart, last seen)
    taken: list[float] = []
    databases: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        with psycopg.connect(pgrace_server.dsn, autocommit=True) as conn:
            while not done.is_set():
                rows = conn.execute(WATCH).fetchall()
                taken.append(rows[0][0])
                for at, pid, *lock, began, database in rows:
                    if pid is not None:
                        seen[(int(pid), *lock, began)] = (began, at)
                        databases.add(database)
                done.wait(0.001)

    assert pgrace_server.log_path is not None
    offset = Path(pgrace_server.log_path).stat().st_size
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

    assert len(databases) == 1  # the load's scratch database
    logged: Counter[int] = Counter()
    lasted: dict[int, list[float]] = {}  # pid -> each ended wait's length, as the server logged it
    with open(pgrace_server.log_path, "rb") as log:
        log.seek(offset)
        for line in log.read().decode("utf-8", errors="replace").splitlines():
            found = _LOGGED.match(line)
            if found is None or found.group(2) not in databases:
                continue
            if found.group(3) == "still waiting for":
                logged[int(found.group(1))] += 1
            else:
                lasted.setdefault(int(found.group(1)), []).append(float(found.group(4)) / 1000)
    assert run.lock_waits == logged.total()

    gap = max(b - a for a, b in itertools.pairwise(taken))
    for pid in logged.keys() | {int(key[0]) for key in seen}:
        waits = [(began, last) for key, (began, last) in seen.items() if key[0] == pid]
        assert len([w for w in waits if w[1] - w[0] >= 0.002]) <= logged[pid], pid
        could_slip = len([length for length in lasted.get(pid, []) if length < 2 * gap])
        assert logged[pid] - len(waits) <= could_slip, (pid, logged[pid], len(waits), could_slip, gap)


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
