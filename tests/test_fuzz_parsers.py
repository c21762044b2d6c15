"""Malformed scenario and spec files never crash the parsers: one ScenarioError with file and line.

Hypothesis mutates real files (the shipped scenarios, and our own spec files) and
generates random ones. 5,000 examples per format run by default (10,000 in all);
set PGRACE_FUZZ_EXAMPLES to run more.
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgrace.errors import ScenarioError
from pgrace.formats.scenario_toml import parse_toml_scenario
from pgrace.formats.spec import parse_spec

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = int(os.environ.get("PGRACE_FUZZ_EXAMPLES", "5000"))
TOML_SEEDS = [p.read_text() for p in sorted((ROOT / "scenarios").glob("*.toml"))]
SPEC_SEEDS = [p.read_text() for p in sorted((ROOT / "tests").rglob("*.spec"))] or [
    'setup { CREATE TABLE t (id int); }\nsession s1\nstep s1a { SELECT 1; }\nsession "s2"\nstep s2a { SELECT 2; }\npermutation s1a s2a(s1a)\n'
]
TOML_PIECES = [
    "[[step]]",
    "[fix]",
    "[fix.step.x]",
    "[[check]]",
    "sessions = ",
    '"',
    "'''",
    "=",
    "{",
    "}",
    "[",
    "]",
    "\n",
    "expect = {",
    "waits_for",
    "capture",
    ":id",
    "rows = [[",
    "count",
    "[params]",
    "session = ",
]
SPEC_PIECES = [
    "setup",
    "teardown",
    "session",
    "step",
    "permutation",
    "{",
    "}",
    "(",
    ")",
    "*",
    '"',
    "#",
    "notices",
    "\n",
    ",",
    "s1a",
    "s2a",
    "1",
]


@st.composite
def mutated(draw: st.DrawFn, seeds: list[str], pieces: list[str]) -> str:
    text = draw(st.sampled_from(seeds))
    for _ in range(draw(st.integers(1, 6))):
        if not text:
            break
        at = draw(st.integers(0, len(text) - 1))
        end = min(len(text), at + draw(st.integers(0, 40)))
        action = draw(st.sampled_from(["delete", "insert", "duplicate", "piece"]))
        if action == "delete":
            text = text[:at] + text[end:]
        elif action == "insert":
            text = text[:at] + draw(st.text(max_size=8)) + text[at:]
        elif action == "duplicate":
            text = text[:at] + text[at:end] + text[at:]
        else:
            text = text[:at] + draw(st.sampled_from(pieces)) + text[at:]
    return text


def check_error_or_scenario(parse: object, text: str) -> None:
    assert callable(parse)
    try:
        parse(text)
    except ScenarioError as error:
        assert error.file == "fuzz.in"
        assert error.line is not None and error.line >= 1, f"no line for: {error}"
        assert "\n" not in str(error)


FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.one_of(mutated(TOML_SEEDS, TOML_PIECES), st.text(max_size=200)))
def test_malformed_scenario_files_give_one_located_error(text: str) -> None:
    check_error_or_scenario(lambda t: parse_toml_scenario(t, "fuzz.in"), text)


@FUZZ
@given(st.one_of(mutated(SPEC_SEEDS, SPEC_PIECES), st.text(max_size=200)))
def test_malformed_spec_files_give_one_located_error(text: str) -> None:
    check_error_or_scenario(lambda t: parse_spec(t, "fuzz.in"), text)
