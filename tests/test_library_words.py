"""The library speaks the library: what a driver or the engine raises names parameters, never the CLI's flags.

A Python caller never typed ``--pct``; the CLI, which maps its flags to the library's
parameters, says a refusal in its own words where it catches one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import pgrace
from pgrace.drivers.exec import parse_exec
from pgrace.errors import OptionError

PACKAGE = Path(__file__).resolve().parents[1] / "pgrace"
LIBRARY = [PACKAGE / "drivers", PACKAGE / "engine", PACKAGE / "proxy.py", PACKAGE / "api.py"]
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z-]*|-[jTpfo])\b")
OTHERS = {"--version"}  # pgbench's own option, in the command line pgrace could not run


def _raised_flags(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, flag) of each CLI flag in the text of a raised exception's arguments."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            arguments = [*node.exc.args, *(keyword.value for keyword in node.exc.keywords)]
            for part in (n for argument in arguments for n in ast.walk(argument)):
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    found += [(node.lineno, flag) for flag in FLAG.findall(part.value) if flag not in OTHERS]
    return found


def test_no_driver_or_engine_message_names_a_cli_flag() -> None:
    named = []
    for root in LIBRARY:
        for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            named += [f"{path.relative_to(PACKAGE)}:{line}: {flag}" for line, flag in _raised_flags(tree)]
    assert named == []


def test_the_flag_test_sees_a_flag() -> None:
    tree = ast.parse(
        'raise OptionError(f"{option} runs in one process: --shard and -j cannot split it", "--pct")\n'
        'raise ScenarioError("too many: explore a sample with --max N")\n'
        'raise OptionError("a bounded search runs in one process: jobs cannot split it", "jobs")\n'
    )
    assert _raised_flags(tree) == [(1, "--shard"), (1, "-j"), (1, "--pct"), (2, "--max")]


def test_explore_refuses_a_search_by_its_parameter_before_a_server_starts() -> None:
    scenario = pgrace.read_scenario("lost-update")
    nowhere = "postgresql://nowhere.invalid/x"
    with pytest.raises(OptionError) as refused:
        pgrace.explore(scenario, dsn=nowhere, search=pgrace.PreemptionBounded(99))
    assert (refused.value.parameter, refused.value.message) == (
        "search",
        "99: K is 0 or more and below the 8 steps (a schedule of N steps has at most N-1 preemptions)",
    )
    with pytest.raises(OptionError) as split:
        pgrace.explore(scenario, dsn=nowhere, search=pgrace.Pct(2), jobs=2)
    assert split.value.parameter == "jobs"
    with pytest.raises(OptionError) as sampled:
        pgrace.explore(scenario, dsn=nowhere, search=pgrace.Sample(10**9))
    assert sampled.value.parameter == "search"


# Pairs still to be told apart by name; a new one fails the test below.
SHARED_NAMES = {"Started"}


def test_a_class_name_means_one_class() -> None:
    """``Step``, ``Wait``, ``Session`` and the like name one class each: a reader never asks which."""
    homes: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                homes.setdefault(node.name, []).append(str(path.relative_to(PACKAGE)))
    shared = {name: where for name, where in homes.items() if len(where) > 1}
    assert {name: where for name, where in shared.items() if name not in SHARED_NAMES} == {}
    assert set(shared) == SHARED_NAMES  # one told apart: take it off the list


def test_an_exec_command_is_refused_by_the_parameter_commands() -> None:
    for given, says in [(["1bad"], "'1bad' is not NAME=COMMAND (NAME a word)"), (["a=x", "a=y"], "'a' named twice")]:
        with pytest.raises(OptionError) as refused:
            parse_exec(given)
        assert (refused.value.parameter, refused.value.message) == ("commands", says)
