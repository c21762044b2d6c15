"""Hostile and huge input to ``pgrace from-log`` and the readers next to it: one line, file and line, exit 2.

Each hostile case is the shipped example's lock wait or deadlock with one thing changed;
each huge one is timed, and its memory measured, in a child process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from pgrace import api
from pgrace.cli import main
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.scratch import scratch_database
from pgrace.scratch.roles import watcher_of
from pgrace.servers import ServerInfo

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "from-log" / "deadlock.log"

#: A lock wait as PostgreSQL 18 logs it with log_lock_waits, prefix '%m [%p] %a %v %x '.
LOCK_WAIT = (
    "2026-12-01 16:53:15.582 UTC [24914] alice 3/3 0 LOG:  statement: BEGIN\n"
    "2026-12-01 16:53:16.688 UTC [24915] bob 4/2 755 LOG:  process 24915 still waiting for ShareLock "
    "on transaction 754 after 1000.101 ms\n"
    "2026-12-01 16:53:16.688 UTC [24915] bob 4/2 755 DETAIL:  Process holding the lock: 24914. Wait queue: 24915.\n"
    '2026-12-01 16:53:16.688 UTC [24915] bob 4/2 755 CONTEXT:  while updating tuple (0,1) in relation "accounts"\n'
    "2026-12-01 16:53:16.688 UTC [24915] bob 4/2 755 STATEMENT:  UPDATE accounts SET balance = 0 WHERE id = 1\n"
)


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(main, args, env={"PGRACE_DSN": ""})


def refused_at(result: Result, where: str) -> str:
    """The one line of a refusal (exit 2, no traceback), which names ``where`` (FILE:LINE)."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert where in lines[0], lines[0]
    return lines[0]


def test_the_lock_wait_itself_is_read(tmp_path: Path) -> None:
    log = tmp_path / "wait.log"
    log.write_text(LOCK_WAIT)
    result = invoke(["from-log", str(log), "--list"])
    assert result.exit_code == 0, result.output
    assert "wait.log:2: lock wait of bob, alice on accounts" in result.stdout


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("holding the lock: 24914.", "holding the lock: 1, ."),  # an empty item
        ("holding the lock: 24914.", "holding the lock: 24914,."),  # a trailing comma
        ("after 1000.101 ms", "after 1.2.3 ms"),
        ("process 24915 still", "process " + "9" * 5000 + " still"),  # more digits than int() converts
        ("holding the lock: 24914.", "holding the lock: " + "7" * 5000 + "."),
    ],
    ids=["empty-holder", "trailing-comma", "bad-duration", "huge-waiter-pid", "huge-holder-pid"],
)
def test_a_lock_wait_report_with_numbers_no_server_writes(tmp_path: Path, old: str, new: str) -> None:
    log = tmp_path / "wait.log"
    assert old in LOCK_WAIT
    log.write_text(LOCK_WAIT.replace(old, new))
    refused_at(invoke(["from-log", str(log), "--list"]), f"{log}:2:")


def test_a_deadlock_cycle_with_a_pid_of_5000_digits(tmp_path: Path) -> None:
    log = tmp_path / "deadlock.log"
    text = EXAMPLE.read_text()
    log.write_text(text.replace("blocked by process 24914.", "blocked by process " + "4" * 5000 + "."))
    line = text[: text.index("ERROR:  deadlock detected")].count("\n") + 1
    refused_at(invoke(["from-log", str(log), "--list"]), f"{log}:{line}:")


def test_a_prefix_pid_of_5000_digits_is_not_a_record(tmp_path: Path) -> None:
    """The prefix's %p is at most 10 digits: the line is another program's, skipped, not a crash."""
    log = tmp_path / "wait.log"
    log.write_text(LOCK_WAIT.replace("[24914] alice", "[" + "1" * 5000 + "] alice"))
    result = invoke(["from-log", str(log), "--list"])
    assert result.exit_code == 0, result.output
    assert "lock wait of bob, pid24914" in result.stdout  # alice's line skipped: her name is not known


def test_deeply_nested_json_in_a_jsonlog_line(tmp_path: Path) -> None:
    wait = {
        "timestamp": "2026-12-01 16:53:16.688 UTC",
        "pid": 24915,
        "error_severity": "LOG",
        "message": "process 24915 still waiting for ShareLock on transaction 754 after 1000.101 ms",
        "detail": "Process holding the lock: 24914. Wait queue: 24915.",
    }
    first = json.dumps({"timestamp": "2026-12-01 16:53:15.582 UTC", "pid": 1, "error_severity": "LOG", "message": "x"})
    nested = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"
    log = tmp_path / "server.json"
    log.write_text(f"{first}\n{nested}\n{json.dumps(wait)}\n")
    refused_at(invoke(["from-log", str(log), "--list"]), f"{log}:2:")
    log.write_text(f"{nested}\n{json.dumps(wait)}\n")  # the line the format is told from
    refused_at(invoke(["from-log", str(log), "--list"]), f"{log}:1:")


@pytest.mark.parametrize("prefix", ["%q%q", "%m [%p] %q%q%a %v %x ", "%q%u@%d %q"])
def test_a_prefix_with_q_twice(prefix: str) -> None:
    """%q twice is %q once: PostgreSQL stops printing non-session processes' prefix at the first."""
    result = invoke(["from-log", "--prefix", prefix, str(EXAMPLE), "--list"])
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    if prefix == "%m [%p] %q%q%a %v %x ":
        assert result.exit_code == 0, result.output
        assert "deadlock of bob, alice" in result.stdout
    else:
        refused_at(result, f"{EXAMPLE}:1:")


def test_a_deeply_nested_merge_file(tmp_path: Path) -> None:
    merged = tmp_path / "shard.json"
    merged.write_text("[" * 100_000 + "]" * 100_000)
    refused_at(invoke(["explore", "lost-update", "--merge", str(merged)]), f"{merged}:1:")


def test_a_scenario_name_longer_than_postgresql_names(tmp_path: Path) -> None:
    text = (ROOT / "examples" / "lock-timeout.toml").read_text()
    named = tmp_path / "named.toml"
    named.write_text(text.replace('name = "lock-timeout"', f'name = "{"x" * 300}"', 1))
    line = refused_at(invoke(["show", str(named)]), f"{named}:1:")
    assert "at most 63" in line
    stem = tmp_path / ("y" * 250 + ".toml")
    stem.write_text(text.replace('name = "lock-timeout"\n', "", 1))
    assert "shorter name" in refused_at(invoke(["show", str(stem)]), f"{stem}:1:")


@pytest.mark.server
def test_a_scenario_name_of_63_characters_runs(pgrace_server: ServerInfo) -> None:
    """The run's role and its observer's role (the role's name and ``_watch``) both fit PostgreSQL's 63 bytes."""
    if not pgrace_server.scenario_role:
        pytest.skip("a --dsn server runs as the DSN's own role: there is no run role")
    text = (ROOT / "examples" / "lock-timeout.toml").read_text()
    scenario = parse_toml_scenario(text.replace('name = "lock-timeout"', f'name = "{"x" * 63}"', 1), "named.toml")
    with scratch_database(pgrace_server, scenario.name) as db:
        assert db.role is not None and db.observer_dsn is not None
        assert len(watcher_of(db.role).encode()) <= 63
    assert api.run(scenario, server=pgrace_server).ok


SWAPPED = """
import os, sys
import pgrace.drivers.fromlog as fromlog
from pgrace.errors import ScenarioError

told = fromlog.open_log

def open_then_swap(path, prefix):
    fmt = told(path, prefix)  # the format is told from a regular file; then a FIFO takes its place
    os.replace(path, path + ".real")
    os.mkfifo(path)
    return fmt

fromlog.open_log = open_then_swap
try:
    fromlog.from_log([sys.argv[1]], list_only=True)
except ScenarioError as exc:
    print(exc)
    sys.exit(2)
"""


def test_a_log_replaced_by_a_fifo_after_it_was_checked(tmp_path: Path) -> None:
    """Each opening is checked, not the path beforehand: a FIFO with no writer is refused at once, not waited on."""
    log = tmp_path / "server.log"
    log.write_text(LOCK_WAIT)
    try:
        done = subprocess.run(
            [sys.executable, "-c", SWAPPED, str(log)], capture_output=True, text=True, timeout=30, cwd=ROOT
        )
    except subprocess.TimeoutExpired:
        pytest.fail("from-log waited on the FIFO put where the log was")
    assert done.returncode == 2, done.stderr
    assert done.stdout.strip() == f"{log}: not a regular file: a log is read from a file"


def retry_loops(sessions: int, steps: int, retries: int) -> str:
    """``sessions`` sessions of ``steps`` steps, each session one retry loop over all its steps."""
    lines = ['setup = "CREATE TABLE t (id int)"', "sessions = [" + ", ".join(f'"s{i}"' for i in range(sessions)) + "]"]
    for i in range(sessions):
        for j in range(steps):
            lines += ["[[step]]", f'name = "s{i}_{j}"', f'session = "s{i}"', 'sql = "SELECT 1"']
        lines.append(f'retry = {{ on = ["40001"], from = "s{i}_0", max = {retries} }}')
    return "\n".join(lines) + "\n"


def test_retry_loops_unrolled_past_the_limit_are_refused_where_the_limit_is_crossed(tmp_path: Path) -> None:
    path = tmp_path / "loops.toml"
    text = retry_loops(64, 150, 10)
    path.write_text(text)
    crossing = [n for n, line in enumerate(text.splitlines(), 1) if line.startswith("retry")][
        6
    ]  # 9,600 + 7 x 1,510 > 20,000
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pgrace", "show", str(path)], capture_output=True, text=True, timeout=60, cwd=ROOT
        )
    except subprocess.TimeoutExpired:
        pytest.fail("pgrace show unrolled a million attempt steps")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"pgrace: {path}:{crossing}: retry: unrolled, this loop (150 steps, max = 10) makes the scenario "
        "20,170 steps or more: at most 20,000, pgrace's limit"
    ]


@pytest.mark.timing
def test_a_steps_loop_is_found_without_a_scan() -> None:
    """13,288 steps: the run asks each step's loop once per step it sends; a scan per question is 10^8 comparisons."""
    scenario = parse_toml_scenario(retry_loops(8, 150, 10), "loops.toml")
    assert len(scenario.steps) == 8 * 150 * 11 + 8 * 10
    started = time.perf_counter()
    loops = {scenario.retry_of(step) is not None for step in scenario.steps}
    assert loops == {True}
    assert time.perf_counter() - started < 1.0


MEASURED = """
import json, sys, time
from pgrace.drivers.fromlog import from_log
from tools.memory import peak_mib

started = time.perf_counter()
found = from_log([sys.argv[1]], list_only=sys.argv[2] == "list", verify=False)
print(json.dumps({
    "seconds": time.perf_counter() - started,
    "peak_mib": peak_mib(),
    "incidents": len(found.incidents),
    "unsaid": found.written.unsaid if found.written else [],
}))
"""


def measured(log: Path, mode: str = "list", timeout: float = 120) -> dict[str, object]:
    """from_log on ``log`` in a child process: its time, peak RSS and what it found (fails past ``timeout``)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", MEASURED, str(log), mode], capture_output=True, text=True, timeout=timeout, cwd=ROOT
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"from-log gave no answer in {timeout:.0f} s")
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_a_lock_with_10000_holders_is_written_with_32_sessions_and_says_so(tmp_path: Path) -> None:
    log = tmp_path / "holders.log"
    holders = ", ".join(str(30000 + i) for i in range(10_000))
    log.write_text(LOCK_WAIT.replace("holding the lock: 24914.", f"holding the lock: {holders}."))
    result = measured(log, "write", timeout=60)
    assert "the lock had 10,000 holders: the scenario has the first 31 (at most 32 sessions)" in result["unsaid"]  # type: ignore[operator]


@pytest.mark.timing  # measured()'s child must answer within its timeout
def test_tab_continuation_lines_are_joined_in_linear_time(tmp_path: Path) -> None:
    log = tmp_path / "tabs.log"
    statement = "2026-12-01 16:53:15.575 UTC [24913] [unknown] 2/2 0 LOG:  statement: SELECT 1\n"
    log.write_text(statement + "\tx\n" * 1_300_000 + LOCK_WAIT)  # 3.9 MB of one statement's lines
    result = measured(log, timeout=60)
    assert result["incidents"] == 1 and result["peak_mib"] < 128  # type: ignore[operator]


@pytest.mark.timing  # measured()'s child must answer within its timeout
def test_the_example_repeated_4000_times_is_listed_in_bounded_time_and_memory(tmp_path: Path) -> None:
    """The same two pids in 4,000 deadlocks (15 MB): each incident reads its own processes' records near it."""
    log = tmp_path / "repeated.log"
    log.write_text(EXAMPLE.read_text() * 4000)
    result = measured(log)
    assert result["incidents"] == 4000
    assert result["peak_mib"] < 128, result  # type: ignore[operator]


@pytest.mark.timing  # measured()'s child must answer within its timeout
def test_20000_lock_waits_are_listed_in_bounded_memory(tmp_path: Path) -> None:
    log = tmp_path / "waits.log"
    with log.open("w") as f:
        for n in range(20_000):
            f.write(LOCK_WAIT.replace("24915", str(100_000 + n)).replace("24914", str(200_000 + n)))
    result = measured(log)
    assert result["incidents"] == 20_000
    assert result["peak_mib"] < 128, result  # type: ignore[operator]


HELD = """
import sys, tracemalloc
from pgrace.drivers.fromlog import from_log
from_log([sys.argv[1]], list_only=True)  # the caches (compiled prefixes and patterns) are filled once
tracemalloc.start()
found = from_log([sys.argv[1]], list_only=True)
print(len(found.incidents), tracemalloc.get_traced_memory()[0])
"""


def test_an_incident_listed_is_held_in_a_few_hundred_bytes(tmp_path: Path) -> None:
    """A list keeps one line per incident, not its processes' records: 20,000 of them fit in a few MiB."""
    log = tmp_path / "waits.log"
    with log.open("w") as f:
        for n in range(2_000):
            f.write(LOCK_WAIT.replace("24915", str(100_000 + n)).replace("24914", str(200_000 + n)))
    done = subprocess.run([sys.executable, "-c", HELD, str(log)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    incidents, held = map(int, done.stdout.split())
    assert incidents == 2_000
    assert held / incidents < 500, f"{held / incidents:.0f} bytes held per incident listed"


VERIFY_IN_TIME = """
import sys, time
import pgrace.drivers.fromlog.verify as verify
verify.VERIFY_SECONDS = 5.0
from pgrace.drivers.fromlog import from_log
from pgrace.render.from_log import report_lines
started = time.perf_counter()
found = from_log([sys.argv[1]])
print(time.perf_counter() - started)
print("\\n".join(report_lines(found)))
"""


@pytest.mark.server
def test_verification_is_bounded_as_a_whole_and_says_so(tmp_path: Path) -> None:
    """A logged statement that sleeps times every interleaving out: verification stops at its limit."""
    log = tmp_path / "sleeps.log"
    log.write_text(
        EXAMPLE.read_text().replace(
            "balance = balance + 100 WHERE id = 2",
            "balance = balance + 100 + (SELECT 0 FROM pg_sleep(300)) WHERE id = 2",
        )
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", VERIFY_IN_TIME, str(log)], capture_output=True, text=True, timeout=180, cwd=ROOT
        )
    except subprocess.TimeoutExpired:
        pytest.fail("verification waited out step timeouts past its limit")
    assert done.returncode == 0, done.stderr
    seconds, *report = done.stdout.splitlines()
    assert float(seconds) < 5 + 3 * 10 + 20  # the limit, then the interleaving under way (10 s step timeouts)
    assert any("verification stopped at its 5 s limit" in line for line in report), report


SCAN_AND_LIST = """
import json, sys, time
from pgrace.drivers.fromlog import from_log
from pgrace.drivers.fromlog.records import scan
started = time.process_time()
hits = len(scan(sys.argv[1]).hits)
scanned = time.process_time() - started
started = time.process_time()
listed = len(from_log([sys.argv[1]], list_only=True).incidents)
print(json.dumps({"hits": hits, "incidents": listed, "scan": scanned, "list": time.process_time() - started}))
"""


@pytest.mark.timing
def test_a_log_dense_with_incidents_is_listed_in_a_few_scans_time(tmp_path: Path) -> None:
    """400 deadlocks in 20 MB of a busy server's statements: each line is parsed only if an incident names its process.

    CPU time, against a plain ``bytes.find`` scan of the same file, so that a loaded machine
    does not decide: reading 4 MiB around each report in Python took some 50 scans.
    """
    log = tmp_path / "busy.log"
    incident = "".join(EXAMPLE.read_text().splitlines(keepends=True)[5:])
    busy = "".join(
        f"2026-12-01 10:00:00.{n % 1000:03d} UTC [{10000 + n % 200}] web {n % 97}/{n} 0 "
        f"LOG:  statement: UPDATE orders SET status = 'shipped' WHERE id = {n}\n"
        for n in range(400)
    )
    with log.open("w") as f:
        for n in range(400):
            f.write(busy)
            f.write(incident.replace("24914", str(400_000 + n)).replace("24915", str(600_000 + n)))
    done = subprocess.run(
        [sys.executable, "-c", SCAN_AND_LIST, str(log)], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout)
    assert measured["incidents"] == 400, measured
    assert measured["list"] < 20 * max(measured["scan"], 0.01), measured
