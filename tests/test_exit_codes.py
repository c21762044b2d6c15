"""Each exit code means one thing, for every command: one test per code per command.

    0 held · 1 an expectation failed or the scenario could not run to its end · 2 invalid
    input · 3 no server could be had · 4 internal error · 130/143 SIGINT/SIGTERM

Codes 4, 130 and 143 are provoked in-process by making a function the command calls
raise (a stand-in bug, Ctrl-C, SIGTERM); the real signals are sent to real processes in
test_hangs.py and test_cleanup.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from documentation import page

from pgrace.cli import main
from pgrace.errors import Terminated
from pgrace.servers import ServerInfo

ROOT = Path(__file__).resolve().parents[1]
UNREACHABLE = "postgresql://nobody@127.0.0.1:1/db?connect_timeout=2"
MALFORMED = "host=127.0.0.1 port='5432"
FAILING = (
    'setup = "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)"\n'
    'sessions = ["a", "b"]\n'
    '[[step]]\nsession = "a"\nsql = "BEGIN"\n'
    '[[step]]\nsession = "a"\nsql = "SELECT id FROM t FOR UPDATE"\n'
    '[[step]]\nname = "nowait"\nsession = "b"\nsql = "SELECT id FROM t FOR UPDATE NOWAIT"\n'
    "expect = { error = false }\n"
)
SETUP_FAILS = "setup { SELECT 1/0; }\nsession s1\nstep s1a { SELECT 1; }\n"
# s1a is held until s2 raises a notice, which s2a never does.
MUTUALLY_BLOCKING = (
    "session s1\nstep s1a { SELECT 1; }\nsession s2\nstep s2a { SELECT 2; }\npermutation s1a(s2a notices 1) s2a\n"
)


def invoke(args: list[str], env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, args, env={"PGRACE_DSN": "", **(env or {})})


def one_line(result: Result) -> str:
    assert "Traceback" not in result.output, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def file_of(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- 0 -------------------------------------------------------------------------------------


def test_list_0() -> None:
    assert invoke(["list"]).exit_code == 0


def test_show_0() -> None:
    assert invoke(["show", "nowait"]).exit_code == 0


def test_run_0(pgrace_server: ServerInfo) -> None:
    assert invoke(["run", "nowait", "--dsn", pgrace_server.dsn]).exit_code == 0


def test_check_0(pgrace_server: ServerInfo) -> None:
    assert invoke(["check", str(ROOT / "scenarios" / "nowait.toml"), "--dsn", pgrace_server.dsn]).exit_code == 0


def test_explore_0(pgrace_server: ServerInfo) -> None:
    assert invoke(["explore", "nowait", "--max", "2", "--dsn", pgrace_server.dsn]).exit_code == 0


def test_explore_2() -> None:
    assert invoke(["explore", "no-such-scenario"]).exit_code == 2


def test_explore_3() -> None:
    assert invoke(["explore", "nowait", "--dsn", UNREACHABLE]).exit_code == 3


def test_sweep_0(pgrace_server: ServerInfo) -> None:
    args = ["sweep", "skip-locked-fanout", "-p", "workers=3,4", "--dsn", pgrace_server.dsn]
    assert invoke(args).exit_code == 0


def test_sweep_2() -> None:
    assert invoke(["sweep", "skip-locked-fanout", "-p", "workers=two"]).exit_code == 2
    assert invoke(["sweep", "skip-locked-fanout", "-p", "workers="]).exit_code == 2


def test_sweep_3() -> None:
    assert invoke(["sweep", "skip-locked-fanout", "-p", "workers=3", "--dsn", UNREACHABLE]).exit_code == 3


def test_matrix_0(pgrace_server: ServerInfo) -> None:
    assert invoke(["matrix", "--dsn", pgrace_server.dsn]).exit_code == 0


def test_matrix_3() -> None:
    assert invoke(["matrix", "--dsn", UNREACHABLE]).exit_code == 3


def test_clean_0(pgrace_server: ServerInfo) -> None:
    assert invoke(["clean", "--dsn", pgrace_server.dsn]).exit_code == 0


# -- 1 -------------------------------------------------------------------------------------


def test_run_1_an_expectation_failed(tmp_path: Path, pgrace_server: ServerInfo) -> None:
    assert invoke(["run", file_of(tmp_path, "f.toml", FAILING), "--dsn", pgrace_server.dsn]).exit_code == 1


def test_run_1_the_setup_fails_on_this_server(tmp_path: Path, pgrace_server: ServerInfo) -> None:
    path = file_of(tmp_path, "setup-fails.spec", SETUP_FAILS)
    result = invoke(["run", path, "--dsn", pgrace_server.dsn])
    assert result.exit_code == 1
    assert one_line(result) == f"pgrace: {path}:1: setup failed: ERROR:  division by zero"


def test_run_1_steps_blocking_each_other_are_the_scenarios_outcome(tmp_path: Path, pgrace_server: ServerInfo) -> None:
    path = file_of(tmp_path, "stuck.spec", MUTUALLY_BLOCKING)
    result = invoke(["run", path, "--format", "isolation", "--dsn", pgrace_server.dsn])
    assert result.exit_code == 1
    assert one_line(result) == f"pgrace: {path}: failed to complete permutation due to mutually-blocking steps: s1a"
    assert "step s1a: SELECT 1; <waiting ...>\nstep s2a: SELECT 2;\n" in result.stdout  # what ran until then


def test_check_1_a_case_failed(tmp_path: Path, pgrace_server: ServerInfo) -> None:
    assert invoke(["check", file_of(tmp_path, "f.toml", FAILING), "--dsn", pgrace_server.dsn]).exit_code == 1


def test_check_1_a_spec_whose_setup_fails_is_a_failed_case(tmp_path: Path, pgrace_server: ServerInfo) -> None:
    path = file_of(tmp_path, "setup-fails.spec", SETUP_FAILS)
    (tmp_path / "setup-fails.out").write_text("\nstarting permutation: s1a\n")
    result = invoke(["check", path, "--dsn", pgrace_server.dsn])
    assert result.exit_code == 1, result.output
    assert "setup failed: ERROR:  division by zero" in result.stdout
    assert result.stdout.rstrip().endswith("1 checks: 0 passed, 1 failed")


# -- 2 -------------------------------------------------------------------------------------


def test_list_2() -> None:
    assert invoke(["list", "--no-such-option"]).exit_code == 2


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--bogus"], "pgrace: No such option '--bogus'. (see pgrace --help)"),
        (["nosuch"], "pgrace: No such command 'nosuch'."),
        (["list", "--bogus"], "pgrace: list: No such option '--bogus'. (see pgrace list --help)"),
    ],
)
def test_2_usage_errors_are_one_line(args: list[str], line: str) -> None:
    result = invoke(args)
    assert result.exit_code == 2
    assert one_line(result) == line


def test_show_2() -> None:
    assert invoke(["show", "no-such-scenario"]).exit_code == 2


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "1e400", "ten"])
@pytest.mark.parametrize("command", ["run", "check"])
def test_run_and_check_2_for_a_step_timeout_that_is_not_a_positive_finite_number(command: str, value: str) -> None:
    target = "nowait" if command == "run" else str(ROOT / "scenarios" / "nowait.toml")
    result = invoke([command, target, "--step-timeout", value, "--dsn", UNREACHABLE])
    assert result.exit_code == 2, result.output
    assert one_line(result).startswith(f"pgrace: {command}: Invalid value for '--step-timeout': ")
    assert one_line(result).endswith(f" (see pgrace {command} --help)")


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_run_2_for_a_pace_that_is_not_a_positive_finite_number(value: str) -> None:
    assert invoke(["run", "nowait", "--pace", value, "--dsn", UNREACHABLE]).exit_code == 2


@pytest.mark.parametrize("command", ["run", "check", "clean"])
def test_2_for_a_malformed_dsn(command: str) -> None:
    args = {"run": ["run", "nowait"], "check": ["check", str(ROOT / "scenarios" / "nowait.toml")], "clean": ["clean"]}
    result = invoke([*args[command], "--dsn", MALFORMED])
    assert result.exit_code == 2, result.output
    assert one_line(result).startswith("pgrace: invalid PostgreSQL connection string")


@pytest.mark.server
def test_check_2(tmp_path: Path) -> None:
    assert invoke(["check", str(tmp_path / "missing")]).exit_code == 2


# -- 3 -------------------------------------------------------------------------------------


def test_run_3() -> None:
    assert invoke(["run", "nowait", "--dsn", UNREACHABLE]).exit_code == 3


def test_check_3() -> None:
    assert invoke(["check", str(ROOT / "scenarios" / "nowait.toml"), "--dsn", UNREACHABLE]).exit_code == 3


def test_clean_3() -> None:
    assert invoke(["clean", "--dsn", UNREACHABLE]).exit_code == 3


LOAD_VIOLATED = (
    'setup = "CREATE TABLE t (v int)"\nsessions = ["a"]\n[[step]]\nsession = "a"\nsql = "SELECT 1"\n'
    '[load]\ntransaction = ["INSERT INTO t VALUES (1)"]\n'
    '[[load.check]]\ndescription = "one row per transaction, less one"\nsql = "SELECT count(*) - 1, count(*) FROM t"\n'
)


def test_load_0(pgrace_server: ServerInfo) -> None:
    assert invoke(["load", "nowait", "--fix", "-c", "2", "-t", "3", "--dsn", pgrace_server.dsn]).exit_code == 0


def test_load_1_an_invariant_was_violated(tmp_path: Path, pgrace_server: ServerInfo) -> None:
    result = invoke(
        ["load", file_of(tmp_path, "v.toml", LOAD_VIOLATED), "-c", "2", "-t", "3", "--dsn", pgrace_server.dsn]
    )
    assert result.exit_code == 1, result.output
    assert "one row per transaction, less one: expected 5, actual 6" in result.stdout


def test_load_2() -> None:
    assert invoke(["load", "nowait", "-c", "0"]).exit_code == 2
    assert invoke(["load", "offset-overlock"]).exit_code == 2  # no [load] section


def test_load_3() -> None:
    assert invoke(["load", "nowait", "-t", "1", "--dsn", UNREACHABLE]).exit_code == 3
    assert invoke(["load", "nowait", "-t", "1", "--dsn", UNREACHABLE, "--pgbench", "/nonexistent"]).exit_code == 3


def test_from_log_3() -> None:
    """The incident's database (--dsn) or the server to verify on (--server) cannot be reached."""
    log = "examples/from-log/deadlock.log"
    assert invoke(["from-log", log, "--no-verify", "--dsn", UNREACHABLE]).exit_code == 3
    assert invoke(["from-log", log, "--server", UNREACHABLE]).exit_code == 3


# -- 4, 130, 143 ------------------------------------------------------------------------------

# For each command, a function it calls and arguments that reach it.
REACHED: dict[str, tuple[str, list[str]]] = {
    "list": ("pgrace.frontends.catalog.shipped_names", ["list"]),
    "show": ("pgrace.frontends.catalog.read_scenario", ["show", "nowait"]),
    "run": ("pgrace.frontends.catalog.read_scenario", ["run", "nowait"]),
    "check": ("pgrace.frontends.catalog.find_files", ["check", "scenarios"]),
    "clean": ("pgrace.servers.existing.existing_server", ["clean", "--dsn", "host=/nowhere"]),
    "explore": ("pgrace.frontends.catalog.read_scenario", ["explore", "nowait"]),
    "sweep": ("pgrace.frontends.catalog.read_scenario", ["sweep", "nowait", "-p", "x=1,2"]),
    "matrix": ("pgrace.servers.open_server", ["matrix"]),  # the CLI imports it when the command runs
    "load": ("pgrace.frontends.catalog.read_scenario", ["load", "nowait", "-t", "1"]),
    "from-log": ("pgrace.drivers.fromlog.from_log", ["from-log", "examples/from-log/deadlock.log"]),
    "minimize": ("pgrace.frontends.catalog.read_scenario", ["minimize", "lost-update"]),
}


def test_every_command_is_covered_here() -> None:
    assert set(REACHED) == set(main.commands)


def raising(exc: BaseException) -> Callable[..., object]:
    def fail(*args: object, **kwargs: object) -> object:
        raise exc

    return fail


@pytest.mark.server
@pytest.mark.parametrize("command", sorted(REACHED))
def test_4_an_internal_error_is_one_line(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    target, args = REACHED[command]
    monkeypatch.setattr(target, raising(ZeroDivisionError("a bug\nsecond line")))
    result = invoke(args)
    assert result.exit_code == 4
    assert re.fullmatch(
        r"pgrace: internal error, please report it: ZeroDivisionError: a bug \(.*PGRACE_DEBUG=1.*\)", one_line(result)
    )


def test_4_shows_the_traceback_with_pgrace_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pgrace.frontends.catalog.read_scenario", raising(ZeroDivisionError("a bug")))
    result = invoke(["show", "nowait"], env={"PGRACE_DEBUG": "1"})
    assert result.exit_code == 4
    assert "Traceback (most recent call last)" in result.stderr and "ZeroDivisionError: a bug" in result.stderr


@pytest.mark.server
@pytest.mark.parametrize(
    ("exc", "code", "word"), [(KeyboardInterrupt(), 130, "interrupted"), (Terminated(), 143, "terminated")]
)
@pytest.mark.parametrize("command", sorted(REACHED))
def test_130_and_143(command: str, exc: BaseException, code: int, word: str, monkeypatch: pytest.MonkeyPatch) -> None:
    target, args = REACHED[command]
    monkeypatch.setattr(target, raising(exc))
    result = invoke(args)
    assert result.exit_code == code
    assert one_line(result) == f"pgrace: {word}; cleaned up"


# -- documented ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", sorted(REACHED))
def test_every_commands_help_lists_the_exit_codes(command: str) -> None:
    text = " ".join(invoke([command, "--help"]).output.split())
    assert "Exit codes:" in text
    for code in ("0", "2", "4", "130", "143"):
        assert f" {code} " in text, (command, code)


def test_the_docs_table_lists_every_code() -> None:
    section = page("reference/exit-codes.md").split("## Exit codes", 1)[1].split("\n#", 1)[0]
    documented = set(re.findall(r"^\| (\d+(?: / \d+)?) \|", section, re.MULTILINE))
    assert documented == {"0", "1", "2", "3", "4", "130 / 143", "141"}


# -- 141 --------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["list", "show", "run"])
def test_141_when_stdout_is_closed_before_pgrace_writes(command: str, pgrace_server: ServerInfo) -> None:
    """`pgrace … | head -0`: the reader is gone; no BrokenPipeError traceback, exit 141."""
    args = {"list": ["list"], "show": ["show", "nowait"], "run": ["run", "nowait", "--dsn", pgrace_server.dsn]}
    reader, writer = os.pipe()
    os.close(reader)
    try:
        child = subprocess.run(
            [sys.executable, "-m", "pgrace", *args[command]],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(writer)
    assert child.returncode == 141, child.stderr
    assert child.stderr == ""


@pytest.mark.server
def test_the_quick_exit_loses_no_output(tmp_path: Path) -> None:
    """pgrace ends without the interpreter's teardown: every byte must be out first, on each stream."""
    picture = tmp_path / "run.svg"
    script = tmp_path / "at_exit.py"
    script.write_text(
        "import atexit, runpy, sys\n"
        f"atexit.register(lambda: open({str(tmp_path / 'ran')!r}, 'w').close())\n"
        "sys.argv = ['pgrace', *sys.argv[1:]]\n"
        "runpy.run_module('pgrace', run_name='__main__')\n"
    )
    child = subprocess.run(
        [sys.executable, str(script), "run", "lost-update", "--format", "json"], capture_output=True, text=True
    )
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout)["scenario"] == "lost-update"
    assert (tmp_path / "ran").exists(), "exit handlers did not run"
    child = subprocess.run(
        [sys.executable, "-m", "pgrace", "run", "lost-update", "--format", "svg", "-o", str(picture)],
        capture_output=True,
        text=True,
    )
    assert child.returncode == 0, child.stderr
    assert picture.read_text().rstrip().endswith("</svg>")
    child = subprocess.run([sys.executable, "-m", "pgrace", "show", "no-such-scenario"], capture_output=True, text=True)
    assert (child.returncode, child.stdout) == (2, "")
    assert child.stderr.startswith("pgrace: ") and child.stderr.endswith("\n")


# -- output and input files named by options ------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["run", "nowait", "-o", "/nonexistent/out.txt"],
        ["explore", "nowait", "-o", "/nonexistent/out.txt"],
        ["matrix", "-o", "/nonexistent/out.txt"],
        ["check", "scenarios/nowait.toml", "--junit", "/nonexistent/junit.xml"],
    ],
)
def test_2_for_an_output_file_in_a_missing_folder_before_anything_runs(args: list[str]) -> None:
    result = invoke([*args, "--dsn", UNREACHABLE])  # refused before any server is tried (else 3)
    assert result.exit_code == 2, result.output
    assert "no writable folder '/nonexistent'" in result.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_2_when_the_output_cannot_be_written(pgrace_server: ServerInfo) -> None:
    result = invoke(["run", "nowait", "-o", "/dev/full", "--dsn", pgrace_server.dsn])
    assert result.exit_code == 2
    assert one_line(result) == "pgrace: /dev/full: cannot write: No space left on device"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
@pytest.mark.parametrize("command", ["list", "show", "run", "check", "clean", "from-log --list", "load --emit"])
def test_2_when_stdout_cannot_be_written(command: str, pgrace_server: ServerInfo, tmp_path: Path) -> None:
    """`pgrace run x > /dev/full`: a full disk is the user's to fix, said as `-o FILE` says it, not a bug (4)."""
    args = {
        "list": ["list"],
        "show": ["show", "nowait"],
        "run": ["run", "nowait", "--dsn", pgrace_server.dsn],
        "check": ["check", "scenarios/nowait.toml", "--dsn", pgrace_server.dsn],
        "clean": ["clean", "--dsn", pgrace_server.dsn],
        "from-log --list": ["from-log", "examples/from-log/deadlock.log", "--list"],
        "load --emit": ["load", "lost-update", "--emit", str(tmp_path / "emitted")],
    }
    with open("/dev/full", "w") as full:
        child = subprocess.run(
            [sys.executable, "-m", "pgrace", *args[command]], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60
        )
    assert (child.returncode, child.stderr) == (2, "pgrace: stdout: cannot write: No space left on device\n")


def test_explore_2_for_a_merge_file_that_is_not_utf8(tmp_path: Path) -> None:
    merge = tmp_path / "shard.json"
    merge.write_bytes(b'{"schema": 1, "x": "\xff"}')
    result = invoke(["explore", "nowait", "--merge", str(merge)])
    assert result.exit_code == 2
    assert one_line(result) == f"pgrace: {merge}:1: not UTF-8: byte 0xff"
