"""Every command's result says whether it held (``ok``) and the CLI's exit code for it (``exit_code``).

The CLI exits with what the result says, so a Python caller of the library function gets the
same answer as the shell: each command below runs for real (a passing and, where the command
judges, a failing case), the library function's result recorded on its way to the CLI.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import CliRunner

import pgrace
from pgrace import api, proxy
from pgrace.cli import main
from pgrace.model.cases import Checked
from pgrace.model.exploration import Exploration
from pgrace.model.fromlog import FromLog
from pgrace.model.load import Loaded
from pgrace.model.matrix import Matrix
from pgrace.model.minimized import Minimized
from pgrace.model.results import Cleaned
from pgrace.model.sweep import Sweep
from pgrace.model.timeline import Run
from pgrace.servers import ServerInfo

ROOT = Path(__file__).resolve().parents[1]
RESULTS = (Run, Exploration, Sweep, Checked, Loaded, Minimized, FromLog, Matrix, Cleaned)
WITHDRAW = f"{sys.executable} {ROOT / 'examples' / 'any-language' / 'withdraw.py'}"
FAILING = (  # b's NOWAIT raises 55P03 where its expectation says no error
    'setup = "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)"\n'
    'sessions = ["a", "b"]\n'
    '[[step]]\nsession = "a"\nsql = "BEGIN"\n'
    '[[step]]\nsession = "a"\nsql = "SELECT id FROM t FOR UPDATE"\n'
    '[[step]]\nname = "nowait"\nsession = "b"\nsql = "SELECT id FROM t FOR UPDATE NOWAIT"\n'
    "expect = { error = false }\n"
)
VIOLATED = (  # one row more than the check says: the load's invariant fails
    'setup = "CREATE TABLE t (v int)"\nsessions = ["a"]\n[[step]]\nsession = "a"\nsql = "SELECT 1"\n'
    '[load]\ntransaction = ["INSERT INTO t VALUES (1)"]\n'
    '[[load.check]]\ndescription = "one row per transaction, less one"\nsql = "SELECT count(*) - 1, count(*) FROM t"\n'
)
BROKEN = 'sessions = ["a"]\n[[step]]\nsesion = "a"\n'


@pytest.mark.parametrize("result", RESULTS, ids=lambda t: t.__name__)
def test_every_result_type_says_ok_and_its_exit_code(result: type) -> None:
    assert isinstance(inspect.getattr_static(result, "ok"), property)
    assert isinstance(inspect.getattr_static(result, "exit_code"), property)


def test_every_library_function_that_runs_something_returns_one_of_them() -> None:
    """Each command's function (and code's and --exec's) returns a result type: none returns a wrapper or a part."""
    names = {t.__name__ for t in RESULTS}
    listed = set(pgrace.__all__)
    for name in (
        "run",
        "explore",
        "sweep",
        "check",
        "load",
        "minimize",
        "from_log",
        "matrix",
        "clean",
        "run_code",
        "explore_code",
        "run_exec",
        "explore_exec",
    ):
        returned = inspect.signature(getattr(pgrace, name)).return_annotation
        assert returned in names, (name, returned)
        assert returned in listed, f"pgrace.__all__ has no {returned}"


def _recording(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str) -> list[Any]:
    """The library function ``module.name`` as the CLI calls it, each result it returned kept."""
    seen: list[Any] = []
    real: Callable[..., Any] = getattr(module, name)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        seen.append(result)
        return result

    monkeypatch.setattr(module, name, recorded)
    return seen


def _file(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


CASES: list[tuple[str, ModuleType, str, Callable[[Path], list[str]], int]] = [  # each given --dsn SERVER
    ("run held", api, "run", lambda tmp: ["run", "nowait"], 0),
    ("run failed", api, "run", lambda tmp: ["run", _file(tmp, "f.toml", FAILING)], 1),
    ("run --exec held", proxy, "run_exec", lambda tmp: ["run", "lost-update", "--fix", *_withdraws("")], 0),
    ("run --exec failed", proxy, "run_exec", lambda tmp: ["run", "lost-update", *_withdraws(" --for-update")], 1),
    ("explore held", api, "explore", lambda tmp: ["explore", "nowait", "--max", "2"], 0),
    ("explore failed", api, "explore", lambda tmp: ["explore", _file(tmp, "f.toml", FAILING)], 1),
    ("explore --exec held", proxy, "explore_exec", lambda tmp: ["explore", "lost-update", *_withdraws("")], 0),
    (
        "explore --exec failed",
        proxy,
        "explore_exec",
        lambda tmp: ["explore", "lost-update", "--fix", *_withdraws("")],
        1,
    ),
    ("sweep", api, "sweep", lambda tmp: ["sweep", "skip-locked-fanout", "-p", "workers=3"], 0),
    ("check held", api, "check", lambda tmp: ["check", str(ROOT / "scenarios" / "nowait.toml")], 0),
    ("check failed", api, "check", lambda tmp: ["check", _file(tmp, "f.toml", FAILING)], 1),
    (
        "check unreadable",
        api,
        "check",
        lambda tmp: ["check", _file(tmp, "f.toml", FAILING), _file(tmp, "b.toml", BROKEN)],
        2,
    ),
    ("load held", api, "load", lambda tmp: ["load", "nowait", "--fix", "-c", "2", "-t", "3"], 0),
    ("load violated", api, "load", lambda tmp: ["load", _file(tmp, "v.toml", VIOLATED), "-c", "2", "-t", "3"], 1),
    ("minimize", api, "minimize", lambda tmp: ["minimize", _file(tmp, "f.toml", FAILING)], 0),
    (
        "from-log",
        api,
        "from_log",
        lambda tmp: ["from-log", str(ROOT / "examples" / "from-log" / "deadlock.log")],
        0,
    ),  # --server
    ("matrix", api, "matrix", lambda tmp: ["matrix"], 0),
    ("clean", api, "clean", lambda tmp: ["clean"], 0),
]


def _withdraws(flags: str) -> list[str]:
    return ["--exec", f"alice={WITHDRAW}{flags}", "--exec", f"bob={WITHDRAW}{flags}"]


@pytest.mark.parametrize(("case", "module", "function", "args", "code"), CASES, ids=[c[0] for c in CASES])
def test_the_cli_exits_with_the_results_exit_code(
    case: str,
    module: ModuleType,
    function: str,
    args: Callable[[Path], list[str]],
    code: int,
    tmp_path: Path,
    pgrace_server: ServerInfo,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = _recording(monkeypatch, module, function)
    server = "--server" if function == "from_log" else "--dsn"  # from-log's --dsn is the incident's database
    done = CliRunner().invoke(main, [*args(tmp_path), server, pgrace_server.dsn], env={"PGRACE_DSN": ""})
    assert "Traceback" not in done.output, done.output
    [result] = seen
    assert (done.exit_code, result.exit_code, result.ok) == (code, code, code == 0), done.output
