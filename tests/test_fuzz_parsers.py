"""Malformed and hostile scenario and spec files never crash the parsers: one ScenarioError with file and line.

Hypothesis mutates real files (the shipped scenarios, and our own spec files), generates
random ones, and splices in hostile structure (see ``fuzzing.py``): deep nesting, huge
dotted keys, NUL and control characters, invalid UTF-8, long lines, files past 1 MiB.
Each example must finish within its deadline (no parser spins) and end either in a
scenario or in one located ScenarioError. 10,000 examples by default (with test_fuzz_cli.py, over 15,000 inputs); set
PGRACE_FUZZ_EXAMPLES (per test) or PGRACE_FUZZ_SCALE, or run bench/bench_fuzz.py, for more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fuzzing import SPEC_PIECES, SPEC_SEEDS, TOML_PIECES, TOML_SEEDS, fuzz_settings, hostile, mutated
from hypothesis import event, given
from hypothesis import strategies as st

from pgrace.errors import ScenarioError
from pgrace.frontends import limits
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.frontends.spec import parse_spec

pytestmark = pytest.mark.slow

Parse = Callable[[str], Any]


def toml(text: str) -> Any:
    return parse_toml_scenario(text, "fuzz.in")


def spec(text: str) -> Any:
    return parse_spec(text, "fuzz.in")


def check_error_or_scenario(parse: Parse, text: str) -> None:
    try:
        parse(text)
        event("parsed")
    except ScenarioError as error:
        event(f"refused: {' '.join(error.message.split()[:3])}")  # --hypothesis-show-statistics tells what was hit
        assert error.file == "fuzz.in"
        assert error.line is not None and error.line >= 1, f"no line for: {error}"
        assert "\n" not in str(error)


def check_bytes(parse: Parse, data: bytes) -> None:
    """As pgrace reads a file: bounded and decoded first, then parsed."""
    try:
        text = limits.decode(data, "fuzz.in")
    except ScenarioError as error:
        event(f"refused: {' '.join(error.message.split()[:3])}")
        assert error.line is not None and error.line >= 1, f"no line for: {error}"
        return
    check_error_or_scenario(parse, text)


@fuzz_settings(3000)
@given(st.one_of(mutated(TOML_SEEDS, TOML_PIECES), st.text(max_size=200)))
def test_malformed_scenario_files_give_one_located_error(text: str) -> None:
    check_error_or_scenario(toml, text)


@fuzz_settings(3000)
@given(st.one_of(mutated(SPEC_SEEDS, SPEC_PIECES), st.text(max_size=200)))
def test_malformed_spec_files_give_one_located_error(text: str) -> None:
    check_error_or_scenario(spec, text)


@fuzz_settings(2000)
@given(hostile(TOML_SEEDS, TOML_PIECES))
def test_hostile_scenario_files_give_one_located_error_in_time(data: bytes) -> None:
    check_bytes(toml, data)


@fuzz_settings(2000)
@given(hostile(SPEC_SEEDS, SPEC_PIECES))
def test_hostile_spec_files_give_one_located_error_in_time(data: bytes) -> None:
    check_bytes(spec, data)
