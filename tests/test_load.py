"""`pgrace load`: pgbench drives a scenario's [load] transaction; the facts are counted, not assumed.

Short runs only (-t N or -T 1); the big measurements are in bench/bench_load.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from documentation import page
from procs import wait_gone

from pgrace.cli import main
from pgrace.drivers.load import LoadOptions, NoPgbench, pgbench_script, run_load
from pgrace.errors import ScenarioError
from pgrace.frontends import catalog
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.render.load import render_load_json, render_load_svg, render_load_text
from pgrace.servers import ServerInfo

BASE = """
name = "acct"
setup = "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0)"
sessions = ["a"]
[params]
start = 7
[[step]]
name = "read"
session = "a"
sql = "SELECT v FROM t WHERE id = 1"
capture = { x = "v" }
"""


def parse(load: str) -> object:
    return parse_toml_scenario(BASE + load, "acct.toml")


def test_load_section_naming_an_unknown_step_is_refused_with_its_line() -> None:
    text = '[load]\ntransaction = ["BEGIN", { step = "raed" }, "COMMIT"]\n'
    with pytest.raises(ScenarioError) as caught:
        parse(text)
    message = str(caught.value)
    assert message.startswith(f"acct.toml:{BASE.count(chr(10)) + 2}: ")
    assert "names no step 'raed'" in message and "did you mean 'read'?" in message


def test_load_variables_must_be_captured_or_set_earlier() -> None:
    with pytest.raises(ScenarioError, match=r"uses :y, which no earlier command"):
        parse('[load]\ntransaction = ["SELECT :y"]\n')
    scenario = parse_toml_scenario(
        BASE
        + '[load]\ntransaction = [{ set = "n", random = [1, 9] }, { step = "read" }, "UPDATE t SET v = :x + :n + :start"]\n',
        "acct.toml",
    )
    script = pgbench_script(scenario)
    # the capture is renamed as the scenario says (x = column v); the param is composed as a literal;
    # the captured and drawn values stay pgbench variables (bound parameters under -M extended)
    assert (
        '\\set n random(1, 9)\n-- step read\nWITH pgrace_step AS (SELECT v FROM t WHERE id = 1) SELECT "v" AS "x"'
        in script
    )
    assert "UPDATE t SET v = :x + :n + 7;" in script


def test_a_colon_pgbench_would_read_as_a_variable_is_refused() -> None:
    scenario = parse_toml_scenario(
        BASE + "[load]\ntransaction = [{ step = \"read\" }, \"SELECT 'a:x' = :'x'\"]\n", "acct.toml"
    )
    with pytest.raises(ScenarioError, match=r"pgbench would read ':x' as a variable"):
        pgbench_script(scenario)


def test_load_sql_the_scanner_cannot_read_is_refused_with_its_line() -> None:
    """Found by the fuzz: `LIMIT 1FOR` made pglast's split raise, an internal error (exit 4). Refused on reading."""
    with pytest.raises(ScenarioError, match=r"cannot be split into statements: trailing junk") as caught:
        parse_toml_scenario(BASE + '[load]\ntransaction = ["SELECT 1 LIMIT 1FOR UPDATE"]\n', "acct.toml")
    assert str(caught.value).startswith(f"acct.toml:{BASE.count(chr(10)) + 2}: ")


def test_a_string_param_is_composed_by_psycopg() -> None:
    scenario = parse_toml_scenario(
        BASE.replace("start = 7", 'start = "it\'s"') + '[load]\ntransaction = ["SELECT :start"]\n', "acct.toml"
    )
    assert "SELECT 'it''s';" in pgbench_script(scenario)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-c", "0"], "Invalid value for '--clients' / '-c': '0' is not a list of client counts from 1 to 1000"),
        (["-c", "1,x"], "Invalid value for '--clients' / '-c': '1,x' is not a list of client counts"),
        (["-T", "abc"], "Invalid value for '--time' / '-T': 'abc' is not a whole number of seconds"),
        (["-T", "1.5"], "Invalid value for '--time' / '-T': '1.5' is not a whole number of seconds from 1 to 86400"),
        (["-t", "0"], "Invalid value for '--transactions' / '-t'"),
        (["-T", "1", "-t", "5"], "-T/--time and -t/--transactions exclude each other"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["load", "lost-update", *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_scenario_without_load_is_exit_2() -> None:
    result = CliRunner().invoke(main, ["load", "offset-overlock", "-t", "1"])
    assert result.exit_code == 2, result.output
    assert "has no [load] section" in result.stderr


def test_no_pgbench_is_exit_3(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    with pytest.raises(NoPgbench):
        run_load(
            catalog.read_scenario("lost-update"), pgrace_server, LoadOptions(clients=(1,), pgbench=str(tmp_path / "x"))
        )
    result = CliRunner().invoke(
        main, ["load", "lost-update", "-t", "1", "--dsn", pgrace_server.dsn, "--pgbench", str(tmp_path / "none")]
    )
    assert result.exit_code == 3
    assert "no pgbench found" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_lost_update_under_load_counts_lost_withdrawals_from_the_ledger(pgrace_server: ServerInfo) -> None:
    scenario = catalog.read_scenario("lost-update")
    bug = run_load(scenario, pgrace_server, LoadOptions(clients=(4,), duration=None, transactions=150))
    (run,) = bug.runs
    assert run.transactions == 600
    (violation,) = run.violations
    # The ledger has one row per committed withdrawal, as many as pgbench counted.
    assert int(violation.expected) == 1_000_000 - 100 * run.transactions
    actual = int(violation.actual.split()[0])
    lost = (actual - int(violation.expected)) // 100
    assert lost > 0 and violation.actual.endswith(f"({lost} withdrawals lost)")
    fix = run_load(
        scenario.variant_named("fix"), pgrace_server, LoadOptions(clients=(4,), duration=None, transactions=150)
    )
    assert fix.runs[0].transactions == 600 and fix.runs[0].violations == []
    assert fix.runs[0].lock_waiters_max >= 1  # FOR UPDATE: three clients queue behind the fourth at times


def test_head_of_line_blocking_clients_queue_on_one_row(pgrace_server: ServerInfo) -> None:
    scenario = catalog.read_scenario("head-of-line-blocking")
    bug = run_load(scenario, pgrace_server, LoadOptions(clients=(3,), duration=None, transactions=5))
    (run,) = bug.runs
    assert run.lock_waiters_max == 2 and run.lock_waits_on == "a row of jobs"
    assert run.violations == [] and run.latency_ms["p50"] is not None and run.latency_ms["p50"] >= 20
    fix = run_load(
        scenario.variant_named("fix"), pgrace_server, LoadOptions(clients=(3,), duration=None, transactions=5)
    )
    assert fix.runs[0].lock_waiters_max == 0 and fix.runs[0].violations == []
    text = render_load_text([bug, fix])
    assert "2 (a row of jobs) / 0" in text
    data = json.loads(render_load_json([bug, fix]))
    assert [d["variant"] for d in data] == ["bug", "fix"]
    assert set(data[0]) == {"scenario", "variant", "server_version", "runs"}
    assert set(data[0]["runs"][0]) == {
        "clients",
        "tps",
        "latency_ms",
        "failures",
        "retries",
        "lock_waiters_max",
        "lock_waits",
        "lock_waited_ms",
        "lock_waits_on",
        "lock_waits_rows",
        "lock_waits_cut",
        "violations",
    }
    assert data[0]["runs"][0]["lock_waits_on"] == [{"on": "a row of jobs", "waits": bug.runs[0].lock_waits}]
    assert data[1]["runs"][0]["lock_waits"] == 0
    assert render_load_svg([bug, fix]).count("<circle") == 4  # a point per variant in each of the two panels


def test_nowait_counts_its_errors(pgrace_server: ServerInfo) -> None:
    scenario = catalog.read_scenario("nowait")
    bug = run_load(scenario, pgrace_server, LoadOptions(clients=(4,), duration=None, transactions=40))
    (violation,) = bug.runs[0].violations
    assert violation.expected == "160"  # every attempt is logged, one per transaction
    failed = 160 - int(violation.actual.split()[0])
    assert failed > 0 and f"({failed} of 160 claims failed with 55P03)" in violation.actual
    fix = run_load(
        scenario.variant_named("fix"), pgrace_server, LoadOptions(clients=(4,), duration=None, transactions=40)
    )
    assert fix.runs[0].violations == []


def test_emit_writes_what_bare_pgbench_needs(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["load", "skip-locked-fanout", "--compare", "--emit", str(tmp_path)])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"skip-locked-fanout.{v}.{k}.sql" for v in ("bug", "fix") for k in ("check", "pgbench", "setup")]
    setup = (tmp_path / "skip-locked-fanout.fix.setup.sql").read_text()
    assert "generate_series(1, 3 + 2)" in setup and "generate_series(3 + 3, 100)" in setup  # params composed
    script = (tmp_path / "skip-locked-fanout.fix.pgbench.sql").read_text()
    assert "FOR UPDATE SKIP LOCKED) SELECT" in script and "\\sleep 20000 us" in script
    assert "SKIP LOCKED" not in (tmp_path / "skip-locked-fanout.bug.pgbench.sql").read_text()


def _pgbench_backends(dsn: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, datname FROM pg_stat_activity WHERE application_name LIKE 'pgrace-load/head-of-line%'"
        ).fetchall()
    return [(pid, name) for pid, name in rows]


def test_ctrl_c_stops_pgbench_and_leaves_nothing_behind(pgrace_server: ServerInfo) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "pgrace", "load", "head-of-line-blocking", "-c", "2", "-T", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PGRACE_DSN": pgrace_server.dsn, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 60
        backends: list[tuple[int, str]] = []
        while len(backends) < 2:  # pgbench's two clients are connected: it is running
            assert child.poll() is None and time.monotonic() < deadline, child.stderr.read() if child.stderr else ""
            backends = _pgbench_backends(pgrace_server.dsn)
        children = [
            int(p.name)
            for p in Path("/proc").iterdir()
            if p.name.isdigit() and _parent(p) == child.pid and "pgbench" in _cmdline(p)
        ]
        assert len(children) == 1
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130, err
    assert "interrupted; cleaned up" in err
    assert "(interrupted: the runs measured so far)" in out
    assert wait_gone(children[0], 1.0)
    assert _pgbench_backends(pgrace_server.dsn) == []
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (backends[0][1],)).fetchone() is None


def _parent(proc: Path) -> int:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_text(errors="replace")
    except OSError:
        return ""


def test_shipped_load_sections_do_not_change_run() -> None:
    for name in ("lost-update", "head-of-line-blocking", "skip-locked-fanout", "nowait"):
        scenario = catalog.read_scenario(name)
        assert scenario.load is not None and scenario.other is not None and scenario.other.load is not None
        assert pgbench_script(scenario) != pgbench_script(scenario.other)


def test_the_docs_load_example_is_a_valid_section() -> None:
    import re

    match = re.search(r"```toml\n(\[load\].*?)```", page("guide/load.md"), re.DOTALL)
    assert match is not None
    base = (Path(__file__).resolve().parents[1] / "scenarios" / "lost-update.toml").read_text().split("\n[load]")[0]
    script = pgbench_script(parse_toml_scenario(base + "\n" + match.group(1), "readme.toml"))
    assert "\\set amount random(1, 100)\nUPDATE accounts SET balance = :balance - :amount WHERE id = 1;" in script


RETRIED = """
name = "counter"
setup = "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); INSERT INTO t VALUES (1, 0); CREATE TABLE ledger (x int)"
sessions = ["a"]
[[step]]
name = "bump"
session = "a"
sql = "UPDATE t SET v = v + 1 WHERE id = 1"
[load]
transaction = ["BEGIN ISOLATION LEVEL REPEATABLE READ", { step = "bump" }, "INSERT INTO ledger VALUES (1)", "COMMIT"]
[[load.check]]
description = "one increment per committed transaction"
sql = "SELECT (SELECT count(*) FROM ledger)::int, v FROM t"
"""


def test_serialization_failures_are_retried_and_counted(pgrace_server: ServerInfo) -> None:
    scenario = parse_toml_scenario(RETRIED, "counter.toml")
    (run,) = run_load(scenario, pgrace_server, LoadOptions(clients=(4,), duration=None, transactions=50)).runs
    assert run.retries > 0  # concurrent updates under REPEATABLE READ fail with 40001; pgbench retries them
    assert run.transactions + run.failures == 200  # a transaction that ran out of tries is a failure, not lost
    assert run.violations == []  # retried transactions were rolled back: the counter matches the ledger


def test_the_emitted_files_run_with_bare_pgbench(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from pgrace.drivers.load import emit, find_pgbench
    from pgrace.scratch import scratch_database

    scenario = catalog.read_scenario("lost-update").other
    assert scenario is not None
    script, setup, check = emit(scenario, tmp_path)
    with scratch_database(pgrace_server, "emitted") as db:
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute(setup.read_text().encode())
        params = {k: str(v) for k, v in conninfo_to_dict(db.dsn).items() if v is not None}
        env = {**os.environ, "PGPASSWORD": params.pop("password", "")}
        argv = [find_pgbench(pgrace_server), "-n", "-M", "extended", "-f", str(script), "-c", "2", "-t", "20"]
        subprocess.run([*argv, make_conninfo(**params)], check=True, capture_output=True, env=env)
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            cur = conn.execute(check.read_text().encode())
            (row,) = cur.fetchall()
            assert conn.execute("SELECT count(*) FROM ledger").fetchone() == (40,)
    assert row[0] == row[1] == 1_000_000 - 40 * 100  # the fix loses nothing
