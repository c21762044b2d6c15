"""The command line, fuzzed in-process: no traceback, no hang, only documented exit codes.

Every command gets hostile scenario files (see ``fuzzing.py``), random ``-p`` values and
random option values. Without a server (PGRACE_DSN and libpq point at a closed port) a
command can only answer 0 (list, show), 2 (invalid input) or 3 (no server); a small
sample of runs also goes to the real server. 4 (internal error) is always a failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from fuzzing import SPEC_PIECES, SPEC_SEEDS, TOML_PIECES, TOML_SEEDS, fuzz_settings, hostile
from hypothesis import currently_in_test_context, event, given
from hypothesis import strategies as st

from pgrace.cli import FORMATS, main
from pgrace.frontends import catalog
from pgrace.servers import ServerInfo

pytestmark = pytest.mark.slow

CLOSED = "host=127.0.0.1 port=1 connect_timeout=2"
OFFLINE = {"PGRACE_DSN": "postgresql://nobody@127.0.0.1:1/db?connect_timeout=2", "PGHOST": "127.0.0.1", "PGPORT": "1"}
SHIPPED = catalog.shipped_names()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("fuzz-cli")


def invoke(args: list[str], allowed: set[int], env: dict[str, str] | None = None) -> Result:
    result = CliRunner().invoke(main, args, env={**OFFLINE, "NO_COLOR": "1", **(env or {})})
    if currently_in_test_context():
        event(f"exit {result.exit_code}")
    shown = f"args={args!r}\nstdout={result.stdout[-2000:]!r}\nstderr={result.stderr[-2000:]!r}"
    assert result.exception is None or isinstance(result.exception, SystemExit), shown
    assert result.exit_code in allowed, shown
    # a generated value may itself be the word "Traceback", echoed in a usage error: look for the real thing
    assert "Traceback (most recent call last)" not in result.stdout + result.stderr, shown
    if result.exit_code >= 2:  # pgrace's errors and click's usage errors alike: one line
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("pgrace: "), shown
    return result


# -- what goes on the command line ------------------------------------------------------------

ODD_NUMBERS = ["nan", "inf", "-inf", "0", "-0", "1e400", "", " ", "0x10", "1_0", "-1", "1e-320", "3", "0.5"]
values = st.one_of(
    st.sampled_from(ODD_NUMBERS),
    st.text(max_size=12),
    st.floats().map(str),
    st.integers().map(str),
)
params = st.lists(
    st.one_of(
        st.text(max_size=20),
        st.builds("{}={}".format, st.text(max_size=8), st.text(max_size=20)),
        st.builds("workers={}".format, st.sampled_from(["3", "0", "65", "-1", "1e3", "\0", "", "2; DROP TABLE x"])),
    ),
    max_size=3,
).map(lambda items: [arg for item in items for arg in ("-p", item)])
dsns = st.one_of(
    st.sampled_from(["host=127.0.0.1 port='5432", "postgresql://", "postgresql://a:b@[::1", "=", "port=x", "a b c"]),
    st.text(max_size=20).map(lambda text: f"{text} {CLOSED}"),
)


@st.composite
def scenario_ref(draw: st.DrawFn, workdir: Path) -> str:
    """A shipped name, a random word, or a hostile file written to disk."""
    kind = draw(st.sampled_from(["shipped", "word", "toml", "spec", "toml", "spec"]))
    if kind == "shipped":
        return draw(st.sampled_from(SHIPPED))
    if kind == "word":
        return draw(st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=12))
    seeds, pieces = (TOML_SEEDS, TOML_PIECES) if kind == "toml" else (SPEC_SEEDS, SPEC_PIECES)
    path = workdir / f"case.{kind}"
    path.write_bytes(draw(hostile(seeds, pieces)))
    return str(path)


def options(draw: Callable[..., Any], choices: dict[str, st.SearchStrategy[str] | None]) -> list[str]:
    """A few of ``choices`` (flag: value strategy, or None for a switch), in any order."""
    picked = draw(st.lists(st.sampled_from(sorted(choices)), max_size=4))
    args: list[str] = []
    for flag in picked:
        strategy = choices[flag]
        args += [flag] if strategy is None else [flag, draw(strategy)]
    return args


RUN_OPTIONS: dict[str, st.SearchStrategy[str] | None] = {
    "--step-timeout": values,
    "--pace": values,
    "--width": values,
    "--format": st.one_of(st.sampled_from(FORMATS), st.text(max_size=8)),
    "--fix": None,
    "--bug": None,
    "--compare": None,
    "--no-color": None,
}
SWEEP_OPTIONS: dict[str, st.SearchStrategy[str] | None] = {
    "--explore": None,
    "--max": values,
    "--seed": values,
    "--jobs": values,
    "--max-preemptions": values,
    "--pct": values,
    "--format": st.one_of(st.sampled_from(FORMATS), st.text(max_size=8)),
    "--step-timeout": values,
    "--fix": None,
    "--bug": None,
    "-p": st.one_of(
        st.text(max_size=12), st.sampled_from(["workers=1,2", "workers=", "workers=,", "=1,2", "level=a,b"])
    ),
}
EXPLORE_OPTIONS: dict[str, st.SearchStrategy[str] | None] = {
    "--max": values,
    "--seed": values,
    "--shard": st.one_of(st.sampled_from(["1/2", "0/2", "3/2", "1/0", "a/b", "/"]), st.text(max_size=6)),
    "--jobs": values,
    "--show": values,
    "--format": st.one_of(st.sampled_from(FORMATS), st.text(max_size=8)),
}
MINIMIZE_OPTIONS: dict[str, st.SearchStrategy[str] | None] = {
    "--class": values,
    "--order": st.one_of(st.sampled_from(["alice-read,bob-read", ",", "nope"]), st.text(max_size=12)),
    "--repeat": values,
    "--step-timeout": values,
    "--format": st.one_of(st.sampled_from(["text", "json"]), st.text(max_size=8)),
}


# -- offline: no server can be had -----------------------------------------------------------


def test_offline_fuzz_runs_without_a_reachable_server() -> None:
    """The premise of the offline tests: nothing here reaches a server."""
    invoke(["run", "nowait"], {3})


@fuzz_settings(1500)
@given(data=st.data())
def test_show_never_crashes(workdir: Path, data: st.DataObject) -> None:
    ref = data.draw(scenario_ref(workdir))
    extra = data.draw(st.lists(st.sampled_from(["--fix", "--bug"]), max_size=2))
    invoke(["show", ref, *data.draw(params), *extra], {0, 2})


@fuzz_settings(1500)
@given(data=st.data())
def test_run_never_crashes_offline(workdir: Path, data: st.DataObject) -> None:
    ref = data.draw(scenario_ref(workdir))
    args = ["run", ref, *data.draw(params), *options(data.draw, RUN_OPTIONS)]
    invoke([*args, "--dsn", data.draw(dsns)], {2, 3})


@fuzz_settings(500)
@given(data=st.data())
def test_check_never_crashes_offline(workdir: Path, data: st.DataObject) -> None:
    ref = data.draw(scenario_ref(workdir))
    args = ["check", ref, "--step-timeout", data.draw(values), "--dsn", data.draw(dsns)]
    invoke([*args, *data.draw(st.lists(st.sampled_from(["--golden", "--quiet", "--update"]), max_size=2))], {2, 3})


@fuzz_settings(500)
@given(data=st.data())
def test_explore_never_crashes_offline(workdir: Path, data: st.DataObject) -> None:
    ref = data.draw(scenario_ref(workdir))
    args = ["explore", ref, *data.draw(params), *options(data.draw, EXPLORE_OPTIONS)]
    if data.draw(st.booleans()):  # a hostile file read as an exploration's JSON
        merge = workdir / "merge.json"
        merge.write_bytes(data.draw(st.one_of(hostile(TOML_SEEDS, TOML_PIECES), st.binary(max_size=64))))
        args += ["--merge", str(merge)]
    invoke([*args, "--dsn", data.draw(dsns)], {2, 3})


@fuzz_settings(300)
@given(data=st.data())
def test_minimize_never_crashes_offline(workdir: Path, data: st.DataObject) -> None:
    ref = data.draw(scenario_ref(workdir))
    args = ["minimize", ref, *data.draw(params), *options(data.draw, MINIMIZE_OPTIONS)]
    invoke([*args, "--dsn", data.draw(dsns)], {2, 3})


@fuzz_settings(500)
@given(data=st.data())
def test_sweep_never_crashes_offline(workdir: Path, data: st.DataObject) -> None:
    refs = data.draw(st.lists(scenario_ref(workdir), min_size=1, max_size=2))
    args = ["sweep", *refs, *data.draw(params), *options(data.draw, SWEEP_OPTIONS)]
    invoke([*args, "--dsn", data.draw(dsns)], {2, 3})


@fuzz_settings(300)
@given(data=st.data())
def test_clean_list_and_matrix_never_crash(data: st.DataObject) -> None:
    invoke(["clean", "--dsn", data.draw(dsns)], {2, 3})
    invoke(["list", *data.draw(st.lists(st.text(max_size=6), max_size=2))], {0, 2})
    matrix = ["matrix", "--step-timeout", data.draw(values), "--format", data.draw(st.text(max_size=8))]
    invoke([*matrix, "--dsn", data.draw(dsns)], {2, 3})


LOAD_OPTIONS: dict[str, st.SearchStrategy[str] | None] = {
    "-c": st.one_of(st.sampled_from(["1,2", "0", "1,,2", "²", "١", "1001", ""]), st.text(max_size=8)),
    "-T": values,
    "-t": values,
    "--format": st.one_of(st.sampled_from(FORMATS), st.text(max_size=8)),
    "--pgbench": st.text(max_size=8),
    "--fix": None,
    "--bug": None,
    "--compare": None,
}


@fuzz_settings(300)
@given(data=st.data())
def test_load_never_crashes_offline(workdir: Path, data: st.DataObject) -> None:
    ref = data.draw(scenario_ref(workdir))
    args = ["load", ref, *data.draw(params), *options(data.draw, LOAD_OPTIONS)]
    invoke([*args, "--dsn", data.draw(dsns)], {2, 3})


EXAMPLE_LOG = (
    (Path(__file__).parent.parent / "examples" / "from-log" / "deadlock.log").read_bytes().splitlines(keepends=True)
)


@st.composite
def server_log(draw: st.DrawFn) -> bytes:
    """Lines of a real deadlock's log, some dropped, repeated, cut short or replaced by hostile bytes."""
    lines = draw(st.lists(st.sampled_from(EXAMPLE_LOG), max_size=40)) or list(EXAMPLE_LOG)
    noise = st.one_of(st.binary(max_size=40), st.text(max_size=40).map(str.encode), st.just(b"\x1b[2J'''\n"))
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(lines)))
        cut = lines[at - 1][: draw(st.integers(0, 80))] if at and draw(st.booleans()) else draw(noise)
        lines.insert(at, cut)
    return b"".join(lines)


FROM_LOG_OPTIONS: dict[str, st.SearchStrategy[str] | None] = {
    "--prefix": st.one_of(
        st.sampled_from(["%m [%p] %a %v %x ", "%t [%p]: ", "%q%u@%d ", "%", "%Z"]), st.text(max_size=10)
    ),
    "--incident": values,
    "--list": None,
}


@fuzz_settings(300)
@given(data=st.data())
def test_from_log_never_crashes_offline(workdir: Path, data: st.DataObject) -> None:
    """A hostile log is listed or written without verifying: 0 (written or listed) or 2 (a bad log), one line."""
    log = workdir / "server.log"
    log.write_bytes(data.draw(server_log()))
    result = invoke(["from-log", str(log), "--no-verify", *options(data.draw, FROM_LOG_OPTIONS)], {0, 2})
    assert "\x1b" not in result.stdout + result.stderr, "a log's escapes never reach the terminal raw"


@pytest.mark.server
def test_every_command_is_fuzzed() -> None:
    fuzzed = {"show", "run", "check", "explore", "sweep", "clean", "list", "matrix", "load", "from-log", "minimize"}
    assert set(main.commands) == fuzzed, "a new command needs its fuzz test here"


# -- a small sample on the real server ---------------------------------------------------------


@pytest.mark.timing
@fuzz_settings(20, deadline_s=120)
@given(data=st.data())
def test_runs_on_the_server_with_random_options_end_in_time(pgrace_server: ServerInfo, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(SHIPPED))
    step_timeout = data.draw(st.sampled_from([0.05, 0.2, 1.0, 3.0]))
    fmt = data.draw(st.sampled_from(FORMATS))
    args = ["run", name, "--step-timeout", str(step_timeout), "--format", fmt]
    if name == "skip-locked-fanout":
        args += ["-p", f"workers={data.draw(st.one_of(st.integers(1, 6), st.text(max_size=4)))}"]
    variant = data.draw(st.sampled_from(["--fix", "--bug", "--compare", ""]))
    args += [variant] if variant and (variant != "--compare" or fmt in ("text", "svg", "markdown", "html")) else []
    started = time.perf_counter()
    invoke([*args, "--dsn", pgrace_server.dsn], {0, 1, 2})
    took = time.perf_counter() - started
    # Each statement is bounded by the step timeout (a blocked one waits at most 3x after its cancel).
    assert took < 60, f"{args} took {took:.1f} s"
