"""`pgrace load` is safe to run on a scenario from a stranger: no shell, the right exit codes, bounded threads.

* Reading a scenario never runs anything on the machine: pgbench (and psql, which runs the
  emitted setup and check files) take a backslash outside quotes for a meta-command such as
  ``\\shell``. Every SQL text that reaches them is refused with one if it holds one
  (PostgreSQL itself accepts no backslash there); inside a string literal or a dollar quote
  a backslash is SQL and works.
* A server that goes away while pgbench runs is exit 3, as in ``pgrace run``.
* pgbench gets as many threads as the machine has cores, not one per client.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from procs import wait_gone

from pgrace.cli import main
from pgrace.drivers.load import LoadOptions, emit, pgbench_script, run_load
from pgrace.errors import ScenarioError
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.servers import ServerInfo, open_server

SCENARIO = """\
name = "shell"
setup = "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'x')"
sessions = ["a"]

[[step]]
name = "read"
session = "a"
sql = {read}

[load]
transaction = [
  "BEGIN",
  {transaction},
  "COMMIT",
]
{fix}
"""


def scenario_file(
    tmp_path: Path, read: str = '"SELECT v FROM t"', transaction: str = '{ step = "read" }', fix: str = ""
) -> Path:
    path = tmp_path / "shell.toml"
    path.write_text(SCENARIO.format(read=read, transaction=transaction, fix=fix), encoding="utf-8")
    return path


def line_of(path: Path, needle: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


# TOML basic strings: "\\" is one backslash in the SQL.
def placements(target: Path) -> list[tuple[str, dict[str, str], str, list[str]]]:
    """(id, the file's pieces, the text on the offending line, extra CLI arguments)."""
    return [
        ("step", {"read": f'"SELECT 1 \\\\shell touch {target}"'}, 'sql = "SELECT 1', []),
        ("transaction", {"transaction": f'"SELECT 1 \\\\shell touch {target}"'}, "transaction = [", []),
        ("sql-command", {"transaction": f'{{ sql = "SELECT 2 \\\\! touch {target}" }}'}, "transaction = [", []),
        (
            "fix-load",
            {"fix": f'[fix]\n[fix.load]\ntransaction = ["SELECT 1", "\\\\setshell x touch {target}"]\n'},
            'transaction = ["SELECT 1", ',
            ["--fix"],
        ),
    ]


@pytest.mark.parametrize("where", ["step", "transaction", "sql-command", "fix-load"])
def test_a_meta_command_in_load_sql_is_refused_before_anything_runs(
    where: str, tmp_path: Path, pgrace_server: ServerInfo
) -> None:
    target = tmp_path / "pwned"
    (_, pieces, on_line, extra) = next(p for p in placements(target) if p[0] == where)
    path = scenario_file(tmp_path, **pieces)
    for args in (["-c", "1", "-t", "1", "--dsn", pgrace_server.dsn], ["--emit", str(tmp_path / "emitted")]):
        result = CliRunner().invoke(main, ["load", str(path), *extra, *args])
        assert not target.exists(), "the scenario ran a shell command"
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith(f"pgrace: {path}:{line_of(path, on_line)}: "), result.stderr
        assert "meta-command" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "emitted").exists()


BACKSLASHES = """\
name = "backslashes"
setup = "CREATE TABLE t (v text)"
sessions = ["a"]

[[step]]
session = "a"
sql = "SELECT 1"

[load]
transaction = [
  "INSERT INTO t VALUES (E'a\\\\\\\\b'), ($$\\\\shell$$), ('c:\\\\'), (U&'\\\\0064') /* \\\\! */ -- \\\\!",
]

[[load.check]]
description = "each backslash is data"
sql = "SELECT '\\\\shell|a\\\\b|c:\\\\|d', string_agg(v, '|' ORDER BY v COLLATE \\"C\\") FROM t"
"""


def test_a_backslash_inside_quotes_or_comments_is_sql_and_runs_under_pgbench(pgrace_server: ServerInfo) -> None:
    scenario = parse_toml_scenario(BACKSLASHES, "backslashes.toml")
    assert "E'a\\\\b'), ($$\\shell$$), ('c:\\'), (U&'\\0064')" in pgbench_script(scenario)
    (run,) = run_load(scenario, pgrace_server, LoadOptions(clients=(1,), duration=None, transactions=1)).runs
    assert (run.transactions, run.failures, run.violations) == (1, 0, [])


EMITTED = """\
name = "emitted"
setup = {setup}
sessions = ["a"]

[[step]]
session = "a"
sql = "SELECT 1"

[load]
setup = {load_setup}
transaction = ["SELECT 1"]

[[load.check]]
description = "checked"
sql = {check}
{fix}
"""


@pytest.mark.parametrize("where", ["setup", "fix-setup", "load-setup", "check"])
def test_what_psql_reads_from_the_emitted_files_holds_no_meta_command(where: str, tmp_path: Path) -> None:
    """The setup and check files are for psql, where \\! runs a shell."""
    target = tmp_path / "pwned"
    bad = f'"SELECT 1; \\\\! touch {target}"'
    pieces = {"setup": '"CREATE TABLE t (v text)"', "load_setup": '"SELECT 1"', "check": '"SELECT 1, 1"', "fix": ""}
    key = {"setup": "setup", "load-setup": "load_setup", "check": "check"}.get(where)
    if key is None:
        pieces["fix"] = f"[fix]\nsetup = {bad}\n"
    else:
        pieces[key] = bad
    path = tmp_path / "emitted.toml"
    path.write_text(EMITTED.format(**pieces), encoding="utf-8")
    result = CliRunner().invoke(main, ["load", str(path), "--compare", "--emit", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"pgrace: {path}:{line_of(path, bad)}: ") and "meta-command" in result.stderr
    assert not (tmp_path / "out").exists()


def test_load_sql_the_scanner_cannot_read_is_refused_when_the_file_is_read() -> None:
    """An unterminated quote: no reading of it can say where pgbench's meta-commands would be."""
    text = BACKSLASHES.split("[load]")[0] + "[load]\ntransaction = [\"SELECT 'it''s \\\\shell x\"]\n"
    with pytest.raises(ScenarioError, match=r"^backslashes.toml:10: load SQL .* cannot be split into statements"):
        parse_toml_scenario(text, "backslashes.toml")


def test_file_text_in_pgraces_own_comment_lines_cannot_start_a_line(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    """A check's description lands in a `--` comment of the check file; psql runs that file."""
    target = tmp_path / "pwned"
    description = f"ok\\r\\\\! touch {target}\\n\\\\! touch {target}\\u2028\\u001b[2J"
    text = EMITTED.format(setup='"CREATE TABLE t (v text)"', load_setup='"SELECT 1"', check='"SELECT 1, 1"', fix="")
    text = text.replace('description = "checked"', f'description = "{description}"')
    script, setup, check = emit(parse_toml_scenario(text, "emitted.toml"), tmp_path)
    for path in (script, setup, check):
        written = path.read_text(encoding="utf-8")
        assert not any(line.lstrip().startswith("\\") for line in written.split("\n")), written
        assert not any(char < " " and char != "\n" for char in written) and "\u2028" not in written
    from pgrace.scratch import scratch_database

    with scratch_database(pgrace_server, "emitted") as db:
        for path in (setup, check):
            subprocess.run(
                ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(path), db.dsn], check=True, capture_output=True
            )
    assert not target.exists()


# -- pgbench's threads and the server's connections -------------------------------------------------


def test_pgbench_gets_a_thread_per_core_not_per_client() -> None:
    from pgrace.drivers.load import pgbench_argv, threads_for

    cores = len(os.sched_getaffinity(0))
    argv = pgbench_argv("pgbench", 18, "load.sql", 1000, LoadOptions(), "/w", "dbname=x")
    assert argv[argv.index("-c") + 1] == "1000" and argv[argv.index("-j") + 1] == str(min(1000, cores))
    assert threads_for(1) == 1  # never more threads than clients


def _pgbench_children() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and (entry / "comm").read_text().strip() == "pgbench"
                and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid()
            ):
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))


def test_a_high_client_count_runs_on_as_many_threads_as_cores(pgrace_server: ServerInfo) -> None:
    """40 clients, each holding a row lock for 20 ms: pgbench runs them on the machine's cores."""
    from pgrace.frontends import catalog

    scenario = catalog.read_scenario("head-of-line-blocking")
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not seen and not done.wait(0.01):  # until pgbench has started its threads
            seen.extend(_threads(pid) for pid in _pgbench_children())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = run_load(scenario, pgrace_server, LoadOptions(clients=(40,), duration=None, transactions=2))
    finally:
        done.set()
        watcher.join()
    (run,) = result.runs
    assert run.transactions == 80 and run.lock_waiters_max >= 2
    assert seen and seen[0] <= len(os.sched_getaffinity(0)), seen


def test_more_clients_than_the_server_has_connections_for_is_one_line_exit_2(pgrace_server: ServerInfo) -> None:
    with psycopg.connect(pgrace_server.dsn) as conn:
        (most,) = conn.execute("SELECT current_setting('max_connections')::int").fetchone() or (0,)
    assert most < 1000  # the embedded server's max_connections
    result = CliRunner().invoke(main, ["load", "lost-update", "-c", "1,1000", "-t", "1", "--dsn", pgrace_server.dsn])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("pgrace: load: Invalid value for --clients: 1000: the server has room for ")
    assert f"max_connections = {most}" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""  # refused before the first count ran


# -- the server goes away while pgbench runs ---------------------------------------------------------


def _load_backends(dsn: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, application_name FROM pg_stat_activity WHERE application_name LIKE 'pgrace-load%'"
        ).fetchall()
    return [(pid, name) for pid, name in rows]


def _start_load(dsn: str) -> subprocess.Popen[str]:
    """`pgrace load` in a child process, returned once pgbench's two clients are connected."""
    child = subprocess.Popen(
        [sys.executable, "-m", "pgrace", "load", "head-of-line-blocking", "-c", "2", "-T", "60", "--dsn", dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 60
    while len([name for _, name in _load_backends(dsn) if name.startswith("pgrace-load/")]) < 2:
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()
            raise AssertionError(child.communicate()[1])
    return child


@pytest.fixture
def own_server() -> Iterator[ServerInfo]:
    """A server of this test's own: stopping it disturbs no other test."""
    with open_server("embedded") as server:
        yield server


@pytest.mark.server
def test_the_server_stopped_under_load_is_one_line_exit_3(own_server: ServerInfo) -> None:
    child = _start_load(own_server.dsn)
    try:
        with psycopg.connect(own_server.dsn, autocommit=True) as conn:
            (data,) = conn.execute("SHOW data_directory").fetchone() or ("",)
        postmaster = int((Path(data) / "postmaster.pid").read_text().split("\n", 1)[0])
        os.kill(postmaster, signal.SIGINT)  # a fast shutdown: every backend gets 57P01
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 3, err
    assert err.startswith("pgrace: the server went away during the load run (57P01"), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in out + err
    assert wait_gone(postmaster)


def test_pgraces_observer_terminated_under_load_is_exit_3(pgrace_server: ServerInfo) -> None:
    """pg_terminate_backend of everything pgrace load has connected: the run cannot be trusted."""
    child = _start_load(pgrace_server.dsn)
    try:
        with psycopg.connect(pgrace_server.dsn, autocommit=True) as conn:
            for name in ("pgrace-load-observer", "pgrace-load/%"):  # the observer first, as a restart takes all
                conn.execute(
                    "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE application_name LIKE %s",
                    (name,),
                )
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 3, err
    assert err.startswith("pgrace: pgrace's observer connection was lost during the load run (57P01"), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in out + err
    assert _load_backends(pgrace_server.dsn) == []
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as conn:
        leftover = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'pgrace_load_head%'").fetchall()
    assert leftover == []  # the scratch database was dropped
