"""How big a load can be: pgrace sizes the server it starts to the clients asked for, and the setup takes its time.

A user's server is as it is (a clear refusal when it has no room); pgrace's own server is
started with ``max_connections`` for the most clients asked for, and says so. The setup
and checks of a load are cut at ``--setup-timeout`` (60 s by default), which a real schema's
seed may need more than.
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from pgrace.cli import main
from pgrace.drivers.load import DEFAULT_CONNECTIONS, connections_for
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
    assert "-c/--clients 1000: the server has room for" in result.stderr
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
    assert "--setup-timeout is a whole number" in result.stderr
