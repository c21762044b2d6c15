"""The one scheduler's shape: it alone writes its state, names no transport, and branches on one run option.

A transport's part (sleeps, crashes, ended sessions, the sockets to watch) is behind the
hooks of :class:`~pgrace.engine.transport.Transport`; isolationtester's semantics are
:attr:`RunOptions.isolationtester`, set once from the scenario, never the file's format.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pgrace import api
from pgrace.engine.options import RunOptions
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.servers import ServerInfo

ENGINE = Path(__file__).parent.parent / "pgrace" / "engine"
PACKAGE = ENGINE.parent
TRANSPORTS = ("pgrace.engine.libpq", "pgrace.engine.threads")


def _named_scheduler(node: ast.expr) -> bool:
    """``scheduler``, ``self.scheduler``, ``runner.scheduler``: an expression that is the scheduler."""
    return (isinstance(node, ast.Name) and node.id == "scheduler") or (
        isinstance(node, ast.Attribute) and node.attr == "scheduler"
    )


def _writes_to_the_scheduler(tree: ast.AST) -> list[int]:
    """Lines that set a scheduler's attribute or change a list it holds (``scheduler.waiting.remove(...)``)."""
    lines = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        lines += [t.lineno for t in targets if isinstance(t, ast.Attribute) and _named_scheduler(t.value)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            held = node.func.value
            changes = node.func.attr in {"append", "remove", "pop", "clear", "extend", "add", "discard"}
            if changes and isinstance(held, ast.Attribute) and _named_scheduler(held.value):
                lines.append(node.lineno)
    return lines


def test_no_module_but_the_scheduler_writes_its_state() -> None:
    written = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == ENGINE / "scheduler.py":
            continue
        lines = _writes_to_the_scheduler(ast.parse(path.read_text(), str(path)))
        written += [f"{path.relative_to(PACKAGE)}:{line}" for line in lines]
    assert written == []


def test_the_writes_test_sees_a_write() -> None:
    assert _writes_to_the_scheduler(ast.parse("self.scheduler.last_done = 1\nscheduler._pending.remove(a)\n")) == [1, 2]


def test_the_engine_asks_no_scenario_its_dialect_and_its_shared_modules_import_no_transport() -> None:
    dialects, transports = [], []
    for path in sorted(ENGINE.rglob("*.py")):
        shared = path.parent == ENGINE
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == "dialect":
                dialects.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
            if shared and isinstance(node, ast.ImportFrom) and (node.module or "").startswith(TRANSPORTS):
                transports.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert dialects == [] and transports == []


TIMEZONE = """name = "zone"
sessions = ["s"]

[[step]]
name = "shown"
session = "s"
sql = "SHOW timezone"
"""


@pytest.mark.server
def test_isolationtester_semantics_are_one_run_option(pgrace_server: ServerInfo) -> None:
    """Asked for, a pgrace scenario's sessions open as isolationtester's do (pg_regress's timezone)."""
    scenario = parse_toml_scenario(TIMEZONE, "<zone>")

    def zone(options: RunOptions) -> str:
        (step,) = api.run(scenario, server=pgrace_server, options=options).step_runs()
        rows = step.outcome.last_rows if step.outcome is not None else None
        assert rows is not None
        return str(rows.text_rows[0][0])

    assert zone(RunOptions(isolationtester=True)) == "America/Los_Angeles"
    assert zone(RunOptions()) != "America/Los_Angeles"
