"""Hypothesis strategies shared by the fuzz tests: real files mutated, and hostile structure.

``mutated`` edits a seed (a shipped scenario, one of our specs) a few times; ``hostile``
then splices in what broke pgrace before: deep nesting, huge dotted keys, NUL and
control characters, bytes that are not UTF-8, very long lines and repeated blocks.
The number of examples per test is PGRACE_FUZZ_EXAMPLES (default per test) times
PGRACE_FUZZ_SCALE: 1 in the thorough tier (CI), a quarter in make test's everyday one;
bench/bench_fuzz.py raises the scale.
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from tiers import THOROUGH

ROOT = Path(__file__).resolve().parents[1]
SCALE = float(os.environ.get("PGRACE_FUZZ_SCALE", "1" if THOROUGH else "0.25"))
DOCUMENTED_EXITS = {0, 1, 2, 3}  # 4 is a bug; 130/143/141 need a signal or a closed pipe

TOML_SEEDS = [p.read_text() for p in sorted((ROOT / "scenarios").glob("*.toml"))]
SPEC_SEEDS = [p.read_text() for p in sorted((ROOT / "tests" / "specs").glob("*.spec"))] or [
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
CONTROL = st.sampled_from([chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)]])


def examples(default: int) -> int:
    return max(1, int(int(os.environ.get("PGRACE_FUZZ_EXAMPLES", str(default))) * SCALE))


def fuzz_settings(default: int, deadline_s: float = 10.0) -> settings:
    """A deadline per example: a parser that spins on an input fails the test instead of hanging it."""
    return settings(
        max_examples=examples(default),
        deadline=deadline_s * 1000,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )


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


@st.composite
def hostile_piece(draw: st.DrawFn) -> bytes:
    kind = draw(
        st.sampled_from(
            ["deep", "inline", "dotted", "header", "control", "nul", "bytes", "long", "bom", "crlf", "quotes"]
        )
    )
    if kind == "deep":
        return b"x = " + b"[" * draw(st.integers(0, 600)) + b"]" * draw(st.integers(0, 600)) + b"\n"
    if kind == "inline":
        depth = draw(st.integers(0, 200))
        return b"y = " + b"{a = " * depth + b"1" + b"}" * draw(st.integers(0, depth)) + b"\n"
    if kind == "dotted":
        return b"a" + b".a" * draw(st.one_of(st.integers(0, 40), st.integers(0, 120_000))) + b" = 1\n"
    if kind == "header":
        return b"[" + b"a." * draw(st.integers(0, 40)) + b"a]\n"
    if kind == "control":
        return draw(st.text(CONTROL, min_size=1, max_size=6)).encode()
    if kind == "nul":
        return draw(st.sampled_from([b"\0", b"\\u0000", b'"\\u0000"']))
    if kind == "bytes":
        return draw(st.binary(min_size=1, max_size=8))
    if kind == "long":
        return b"x" * draw(st.sampled_from([99_999, 100_000, 100_001, 150_000]))
    if kind == "bom":
        return b"\xef\xbb\xbf"
    if kind == "crlf":
        return b"\r\n" * draw(st.integers(1, 3))
    return draw(st.sampled_from([b'"""', b"'''", b'"', b"'", b"\\", b"#", b"$$", b"--", b"/*"]))


@st.composite
def hostile(draw: st.DrawFn, seeds: list[str], pieces: list[str]) -> bytes:
    """A mutated seed with hostile pieces spliced in, or a block repeated to a large size."""
    data = draw(mutated(seeds, pieces)).encode()
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        if draw(st.integers(0, 29)) == 0:  # a repeated slice: files from a few kB up to ~1 MiB and past it
            block = data[at : at + draw(st.integers(1, 200))] or b"\n"
            times = draw(st.one_of(st.integers(1, 50), st.integers(1, 1_100_000 // len(block))))
            data = data[:at] + block * times + data[at:]
        else:
            data = data[:at] + draw(hostile_piece()) + data[at:]
    return data
