"""Fuzz the new surfaces as a user meets them: ``python -m pgrace`` on generated scenario files and option values.

Usage: ``python bench/bench_fuzz_surfaces.py [--cases N] [--seed S] [--first I | --only I,J] [--jobs J] [--keep DIR]``

Each case is one scenario file and one command line. The files are
built around a small runnable scenario that uses what the last rounds added: ``[load]``
and ``[fix.load]`` (steps, sleeps, ``set``/``random``, captures, checks), ``sleep`` and
``crash`` steps, ``waits_on`` and ``released_by`` expectations, ``[params]`` with choices
(for ``sweep -p name=v1,v2``), and ``retry`` loops on a step (valid ones, which add attempts
to the session, and bad ones: an unknown or another session's ``from``, ``max`` out of range,
a malformed SQLSTATE; ``retry`` anywhere else is refused as unknown). Most cases then get
hostile values in a few places: huge and negative numbers, NaN-ish strings, control
characters, SQL in values, very long strings, and pgbench
meta-commands (``\\shell``, ``\\setshell``, ``\\gset``, ...) whose shell commands would
create a marker file; a few have their text cut or spliced. The command is one of
``show``, ``run``, ``explore``, ``sweep`` (with or without ``--explore``), ``check`` (with
or without ``--explore``) and ``load`` (or ``load --emit``), with hostile or small values
for ``-j``, ``--max``, ``--shard``, ``--seed``, ``-c``, ``-T``, ``-t``, ``--step-timeout``,
``-p``, ``-o`` (sometimes the scenario file itself, or a symlink to it) and ``--emit``.

Every case runs as a real subprocess in a scratch directory of its own, with HOME and
TMPDIR in a watched tree, against one embedded server per job that this process starts
once (``--dsn``), under a 4 GiB address-space limit (a MemoryError, not a swapped machine).
A case fails when:

* it exits with a code outside {0, 1, 2, 3} (4 is an internal error; a signal is a crash),
* stderr holds a Python traceback or says "internal error",
* it outlives its bound (worked out from what it asked for: runs, sleeps, step timeouts,
  load durations; killed at the bound plus a margin, never past 60 s),
* a marker file of a ``\\shell`` command exists afterwards (a scenario ran a command),
* the scenario file changed, or the case directory holds anything but the scenario and
  what ``-o``/``--emit`` asked for, or HOME/TMPDIR or the marker tree hold anything new,
* the server keeps a ``pgrace_`` scratch database or a client backend once it exited.

Prints the cases by command and exit code, the time, and each failure grouped by cause,
with a reproducer (the files and ``repro.sh``) saved under the directory it names.
Exit 1 if any case failed. tests/test_fuzz_surfaces.py runs a small deterministic slice.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTED = {0, 1, 2, 3}
HARD_S = 60.0  # no case is let run longer than this
BASE_S = 15.0  # a case that runs nothing: Python, pgrace, the file, an error (on a loaded 2-core machine)
RUN_S = 1.5  # one run of the small scenario (scratch database, setup, steps, checks, teardown)
MEMORY_LIMIT = 4 << 30
PGBENCH_PARSED = re.compile(r"pgbench: error: \S+\.sql:\d+:")  # a script pgbench could not parse (not a server error)
MARK = "@MARK@"  # replaced by a path under the watched marker directory (made of words: SQL's scanner reads it)
SCENARIO = "@SCENARIO@"  # replaced by the scenario file's name in the command line

# -- hostile values ---------------------------------------------------------------------------

METAS = [
    "\\shell touch @MARK@",
    "\\setshell v touch @MARK@",
    "SELECT 1 \\shell touch @MARK@",
    "SELECT 1;\n\\shell touch @MARK@",
    "SELECT 1 \\gset",
    "SELECT 1 AS x \\gset p_",
    "SELECT 1 \\aset",
    "\\set x 1",
    "\\sleep 1 ms",
    "\\if true",
    "\\endif",
    "\\startpipeline",
    "\\",
    "SELECT 1 \\\\ \\shell touch @MARK@",
    "SELECT '\\shell touch @MARK@'",  # inside a literal: SQL, never a command
    "SELECT $$\\shell touch @MARK@$$",
    "SELECT E'\\\\shell touch @MARK@'",
    "-- \\shell touch @MARK@\nSELECT 1",
    "/* \\shell touch @MARK@ */ SELECT 1",
    'SELECT 1 AS "\\shell touch @MARK@"',
]
SQLISH = [
    "",
    " ",
    ";",
    "SELECT 1; DROP DATABASE postgres; --",
    "'; DROP TABLE jobs; --",
    "$$",
    "$x$ unterminated",
    "'unterminated",
    '"unterminated',
    "/* unterminated",
    ":undefined",
    ":'nope'",
    ':"nope"',
    ":a.pid",
    "::int",
    "SELECT pg_sleep(100000)",
    "SELECT pg_terminate_backend(pg_backend_pid())",
    "SELECT 1\x00",
    "SELECT 1\x07\x1b[31m",
    "SELECT 'é\u202e\ufeff'",
    "BEGIN; COMMIT; BEGIN",
    "CREATE DATABASE pgrace_fuzz_extra",
]
STRINGS = [
    "",
    " ",
    "x" * 70_000,
    "y" * 150_000,
    "\x00",
    "\x1b[2J",
    "\r\n",
    "\t",
    "\ud7ff",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e400",
    "-1",
    "0",
    "99999999999999999999999",
    "0x10",
    "1_000",
    "null",
    "true",
    "../../etc/passwd",
    "/dev/zero",
    "$(touch @MARK@)",
    "`touch @MARK@`",
]
NUMBERS = [
    "0",
    "-1",
    "1",
    "2",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "1e308",
    "nan",
    "inf",
    "-inf",
    "1.5",
    "-0.0",
    "true",
    "[]",
    "{}",
]
DURATIONS = [
    "0ms",
    "-1ms",
    "61s",
    "60.001s",
    "1e3s",
    "NaN",
    "nanms",
    "infs",
    "1",
    "1 ms",
    "0.0001s",
    "0.0009s",
    "100000ms",
    "99999999999999999999999ms",
    "5 MS",
    "5m",
    "",
    "1ms1ms",
    "\u0665ms",
    "5ms\n",
]
CRASHES = ["kill", "", "TERMINATE", "terminate\n", "disconnect ", "abort", "segfault"]
RELEASED = [
    "nobody",
    "",
    "deadlock",
    "lock_timeout",
    "statement_timeout",
    "cancel",
    "step_timeout",
    "terminated",
    "unknown",
    "a",
    "b",
    "A",
    "a*",
]
WAITS_ON = [
    '{ table = "jobs" }',
    '{ table = "jobs", key = { id = 1 } }',
    '{ table = "jobs", mode = "NOPE" }',
    '{ table = "", key = {} }',
    '{ table = "jobs", key = { id = 9223372036854775808 } }',
    "{ advisory = 9223372036854775807 }",
    "{ advisory = -1 }",
    "{ advisory = [1, 2, 3] }",
    "{ advisory = nan }",
    '{ transaction_of = "zz" }',
    '{ transaction_of = "a" }',
    "{ unique_index = true }",
    '{ unique_index = "jobs_pkey" }',
    "{}",
    '"jobs"',
    "42",
    "true",
    "[]",
    '{ table = "jobs", retry = 3 }',
]
GOOD_RETRY = '{ on = ["40001", "40P01"], from = "b-write", max = 1 }'  # adds a ROLLBACK and b-write#2 to b
BAD_RETRIES = [
    '{ on = ["40001"], from = "nope", max = 1 }',
    '{ on = ["40001"], from = "a-read", max = 1 }',
    '{ on = ["40001"], from = "b-write", max = 0 }',
    '{ on = ["40001"], from = "b-write", max = 99999999999999999999 }',
    '{ on = ["4000"], from = "b-write", max = 1 }',
    '{ on = ["40p01"], from = "b-write", max = 1 }',
    '{ on = [], from = "b-write", max = 1 }',
    '{ on = ["40001"], from = "b-write" }',
    '{ on = ["40001"], from = "b-write", max = 1, until = "never" }',
    "3",
    '"forever"',
]
RETRIES = [  # where no retry key belongs
    "retry = 3",
    "retry = true",
    'retry = { max = 3, on = ["40001", "40P01"] }',
    "retry = -1",
    'retry = "forever"',
]
HOSTILE_ARGS = {
    "-j": ["0", "-1", "1e3", "nan", "", "2.5", "100000000", "99999999999999999999", "x", "64"],
    "--max": ["0", "-3", "nan", "1.5", "", "10000000", "100000000000", "99999999999999999999999", "1e3"],
    "--shard": ["0/2", "3/2", "1/0", "a/b", "/", "-1/2", "1/99999999999999999999", "1/3/4", " 1/2", "2/1", "", "1/-2"],
    "--seed": ["-1", "nan", "99999999999999999999999", "0x10", "", "1.5", "\x00"],
    "-c": ["0", "-1", "1,,2", "1000", "1e2", "", "\u0661", "1,1", "2,1", "99999999999999999999", "1;2", " "],
    "-T": ["0.5", "0", "-1", "nan", "inf", "1e400", "", "1e-9", "x", "-0"],
    "-t": ["0", "-1", "nan", "", "1.5", "99999999999999999999999", "x"],
    "--step-timeout": ["0", "-1", "nan", "inf", "1e400", "", "1e-9", "x", "-inf"],
}
SMALL_ARGS = {  # values that run, and run briefly
    "-j": ["1", "2", "3"],
    "--max": ["1", "2", "3", "5"],
    "--shard": ["1/1", "1/2", "2/2", "2/3"],
    "--seed": ["0", "1", "42", "123456789"],
    "-c": ["1", "2", "1,2", "1,3"],
    "-T": ["1", "2"],
    "-t": ["1", "3", "10"],
    "--step-timeout": ["0.5", "1", "2"],
}


def pick(rng: random.Random, flag: str, hostile: float) -> str:
    return rng.choice(HOSTILE_ARGS[flag] if rng.random() < hostile else SMALL_ARGS[flag])


def toml_string(text: str) -> str:
    """A TOML basic string holding ``text`` exactly (control characters escaped, so they reach pgrace)."""
    out = []
    for char in text:
        if char == '"':
            out.append('\\"')
        elif char == "\\":
            out.append("\\\\")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        elif 0xD800 <= ord(char) <= 0xDFFF:
            out.append("?")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


# -- the scenario ------------------------------------------------------------------------------


@dataclass
class Shape:
    """What a generated scenario asks of a run, for its time bound."""

    steps: dict[str, int] = field(default_factory=dict)  # session -> steps
    sleep_s: float = 0.0
    variants: int = 2
    group: int = 0  # members of the session group, from the workers param

    def interleavings(self) -> int:
        counts = list(self.steps.values())
        return math.factorial(sum(counts)) // math.prod(math.factorial(c) for c in counts)


class Slots:
    """The values of the base scenario that a hostile case may replace: each slot is a TOML value."""

    def __init__(self, rng: random.Random, hostile: int) -> None:
        self.rng = rng
        self.left = hostile
        self.used: list[str] = []

    def value(self, name: str, good: str, bad: Callable[[], str]) -> str:
        if self.left > 0 and self.rng.random() < 0.25:
            self.left -= 1
            self.used.append(name)
            return bad()
        return good


def scenario_text(rng: random.Random, hostile: int, shape: Shape) -> tuple[str, list[str]]:
    """A scenario with [load], [fix.load], sleep, crash, waits_on, released_by and params, ``hostile`` values in it."""
    slots = Slots(rng, hostile)
    sql_bad = lambda: toml_string(rng.choice(METAS + SQLISH + STRINGS))  # noqa: E731
    load_bad = lambda: toml_string(rng.choice(METAS) if rng.random() < 0.6 else rng.choice(SQLISH + STRINGS))  # noqa: E731
    big = rng.random() < 0.03  # a wide space: 12 to 24 sessions of 2 steps (explore --max must still answer)
    sessions = [f"s{i}" for i in range(rng.choice([12, 24]))] if big else ["a", "b"]
    lines = [
        'name = "fz"',
        'title = "fuzz"',
        'setup = """',
        "CREATE TABLE jobs (id int PRIMARY KEY, n int NOT NULL);",
        "INSERT INTO jobs VALUES (1, 0), (2, 0);",
        '"""',
    ]
    if rng.random() < 0.04:
        lines.append(rng.choice(RETRIES))
    group = rng.random() < 0.3 and not big
    listed = [toml_string(s) for s in sessions]
    if group:
        listed.append('{ name = "w", count = "workers" }')
    lines.append(f"sessions = [{', '.join(listed)}]")
    workers = 2
    lines += [
        "",
        "[params]",
        "lock = "
        + slots.value(
            "param choices",
            '{ default = "FOR UPDATE", choices = ["FOR UPDATE", "FOR SHARE", "FOR NO KEY UPDATE", ""] }',
            lambda: rng.choice(
                [
                    '{ default = "FOR UPDATE; DROP TABLE jobs", choices = ["FOR UPDATE; DROP TABLE jobs"] }',
                    '{ default = "X", choices = [] }',
                    "{ default = 1, choices = [1, 2] }",
                    '{ default = "FOR UPDATE", choices = ["FOR UPDATE", "FOR UPDATE"] }',
                    "{ default = " + toml_string(rng.choice(STRINGS)) + " }",
                    '{ choices = ["FOR UPDATE"] }',
                ]
            ),
        ),
        "delta = "
        + slots.value("param default", "1", lambda: rng.choice([*NUMBERS, toml_string(rng.choice(STRINGS))])),
    ]
    if group:
        lines.append("workers = " + slots.value("workers", str(workers), lambda: rng.choice(NUMBERS)))
    shape.group = workers if group else 0

    def step(session: str, body: str, name: str | None = None, extra: str = "") -> None:
        lines.extend(["", "[[step]]"])
        if name:
            lines.append(f"name = {toml_string(name)}")
        lines.append(f"session = {toml_string(session)}")
        lines.append(body)
        if extra:
            lines.append(extra)
        if rng.random() < 0.01:
            lines.append(rng.choice(RETRIES))
        shape.steps[session] = shape.steps.get(session, 0) + 1

    if big:
        for session in sessions:
            step(session, "sql = " + slots.value("sql", '"SELECT 1"', sql_bad))
            step(session, "sql = " + slots.value("sql", '"SELECT 2"', sql_bad))
    else:
        step("a", 'sql = "BEGIN"')
        step(
            "a",
            "sql = " + slots.value("step sql", '"SELECT n FROM jobs WHERE id = 1 :lock"', sql_bad),
            "a-read",
            'capture = "n"',
        )
        waits = slots.value("waits_on", '{ table = "jobs", key = { id = 1 } }', lambda: rng.choice(WAITS_ON))
        released = slots.value("released_by", '"a"', lambda: toml_string(rng.choice(RELEASED)))
        expect = rng.choice(
            [
                "",
                f"expect = {{ waits_on = {waits} }}",
                f"expect = {{ released_by = {released} }}",
                f'expect = {{ waits_on = {waits}, released_by = {released}, waits_for = "a" }}',
                f"expect = {{ may_fail = true, released_by = {released} }}",
            ]
        )
        retry = ""
        if rng.random() < 0.3:
            retry = "retry = " + slots.value("retry", GOOD_RETRY, lambda: rng.choice(BAD_RETRIES))
            if GOOD_RETRY in retry:
                shape.steps["b"] = shape.steps.get("b", 0) + 2
        step(
            "b",
            "sql = " + slots.value("step sql", '"UPDATE jobs SET n = n + :delta WHERE id = 1"', sql_bad),
            "b-write",
            "\n".join(line for line in (expect, retry) if line),
        )
        sleep = rng.choice(["5ms", "20ms", "0.01s"])
        shape.sleep_s += 0.02
        step(
            "a",
            "sleep = "
            + slots.value(
                "sleep",
                toml_string(sleep),
                lambda: rng.choice([toml_string(rng.choice(DURATIONS)), rng.choice(NUMBERS)]),
            ),
            "work",
        )
        step("a", 'sql = "COMMIT"')
        if rng.random() < 0.5:
            crash = slots.value(
                "crash",
                rng.choice(['"terminate"', '"disconnect"']),
                lambda: rng.choice([toml_string(rng.choice(CRASHES)), rng.choice(NUMBERS)]),
            )
            step("b", f"crash = {crash}", "b-dies")
        if group:
            step(
                "w",
                "sql = " + slots.value("group sql", '"SELECT id FROM jobs WHERE id = 2 :lock"', sql_bad),
                "claim",
                'capture = "id"',
            )
            shape.steps.pop("w")
            for member in range(workers):
                shape.steps[f"w{member + 1}"] = 1
    lines += [
        "",
        "[[check]]",
        'description = "n counts the writes"',
        'sql = "SELECT n FROM jobs WHERE id = 1"',
        "rows = [[1]]",
        "",
        "[fix]",
        'title = "fuzz, cured"',
    ]
    if not big:
        lines += [
            "",
            "[fix.step.a-read]",
            "sql = " + slots.value("fix sql", '"SELECT n FROM jobs WHERE id = 1 FOR UPDATE"', sql_bad),
        ]
        if rng.random() < 0.3:
            lines.append(
                "expect = { released_by = "
                + slots.value("fix released_by", '"b"', lambda: toml_string(rng.choice(RELEASED)))
                + " }"
            )
    # [load]: one worker's transaction, mixing every kind of command
    if rng.random() < 0.9:
        commands = ['"BEGIN"']
        if not big:
            commands.append(
                "{ step = "
                + slots.value(
                    "load step",
                    '"a-read"',
                    lambda: rng.choice(['"work"', '"b-dies"', '"nope"', "1", toml_string(rng.choice(STRINGS))]),
                )
                + " }"
            )
        commands.append(
            "{ sleep = " + slots.value("load sleep", '"1ms"', lambda: toml_string(rng.choice(DURATIONS))) + " }"
        )
        commands.append(
            '{ set = "amount", random = '
            + slots.value(
                "random",
                "[1, 100]",
                lambda: rng.choice(
                    [
                        "[100, 1]",
                        "[-9223372036854775808, 9223372036854775807]",
                        "[9223372036854775808, 2]",
                        "[1]",
                        '"1,2"',
                        "[1.5, 2]",
                        "[nan, 1]",
                        "[1, inf]",
                        "[]",
                    ]
                ),
            )
            + " }"
        )
        commands.append(
            "{ sql = "
            + slots.value("load sql", '"UPDATE jobs SET n = n + :amount WHERE id = 2"', load_bad)
            + (
                ", capture = " + rng.choice(['"n"', '["a", "b"]', '{ v = "n" }', '""', "1"])
                if rng.random() < 0.2
                else ""
            )
            + (", retry = 3" if rng.random() < 0.03 else "")
            + " }"
        )
        commands.append(slots.value("load string", '"COMMIT"', load_bad))
        lines += [
            "",
            "[load]",
            "setup = " + slots.value("load setup", '"CREATE TABLE ledger (amount int)"', load_bad),
            "transaction = [" + ", ".join(commands) + "]",
        ]
        if rng.random() < 0.05:
            lines.append(rng.choice(RETRIES))
        lines += [
            "",
            "[[load.check]]",
            'description = "the counter is the sum of what was added"',
            "sql = " + slots.value("load check", '"SELECT 0, 0"', load_bad),
        ]
        if rng.random() < 0.7:
            lines += ["", "[fix.load]"]
            fix = rng.choice(["transaction", "setup", "check"])
            if fix == "transaction":
                lines.append(
                    'transaction = ["BEGIN", '
                    + slots.value("fix.load string", '"SELECT n FROM jobs WHERE id = 1 FOR UPDATE"', load_bad)
                    + ', { sleep = "1ms" }, "COMMIT"]'
                )
            elif fix == "setup":
                lines.append("setup = " + slots.value("fix.load setup", '"SELECT 1"', load_bad))
            else:
                lines.append(
                    'check = [{ description = "fix", sql = '
                    + slots.value("fix.load check", '"SELECT 1, 1"', load_bad)
                    + " }]"
                )
            if rng.random() < 0.05:
                lines.append(rng.choice(RETRIES))
    text = "\n".join(lines) + "\n"
    if slots.left > 0 and rng.random() < 0.3:  # cut or splice the text itself
        slots.used.append("text")
        at = rng.randrange(len(text))
        edits: list[Callable[[], str]] = [
            lambda: text[:at],
            lambda: (
                text[:at] + rng.choice(STRINGS + METAS + ["[[step]]", "[load]", "[fix.load]", '"', "'''"]) + text[at:]
            ),
            lambda: text[:at] + text[at + rng.randrange(1, 60) :],
            lambda: text + "\n[load]\ntransaction = []\n",
            lambda: text[:at] + text[at : at + 200] * rng.randrange(2, 40) + text[at:],
        ]
        text = rng.choice(edits)()
    return text, slots.used


# -- the case ----------------------------------------------------------------------------------


@dataclass
class Case:
    index: int
    command: str  # a label: show, run, explore, sweep, sweep-explore, check, check-explore, load, load-emit
    args: list[str]  # after ``python -m pgrace``; SCENARIO stands for the file
    text: str
    hostile: list[str]  # what was made hostile: slots of the file, and flags
    bound_s: float
    outputs: list[str] = field(default_factory=list)  # what the case may create in its directory
    symlink: bool = False  # the case directory also holds link.toml -> the scenario


def generate(seed: int, index: int) -> Case:
    """Case ``index`` of campaign ``seed``: the same pair always gives the same case."""
    rng = random.Random(f"{seed}/{index}")
    command = rng.choices(
        ["show", "run", "explore", "sweep", "sweep-explore", "check", "check-explore", "load", "load-emit"],
        weights=[6, 14, 16, 8, 6, 8, 6, 24, 12],
    )[0]
    valid = rng.random() < 0.3  # about a third of the cases keep the file valid and the options small: they run
    hostile_opts = 0.0 if valid else rng.choice([0.0, 0.3, 0.7])
    shape = Shape()
    text, used = scenario_text(rng, 0 if valid else rng.choice([0, 1, 1, 2, 3]), shape)
    hostile = list(used)
    args = [command.split("-")[0], SCENARIO]
    outputs: list[str] = []
    symlink = False
    runs = 1
    variants = 2 if "--compare" in args else 1

    def flag(name: str) -> str:
        value = pick(rng, name, hostile_opts)
        if value not in SMALL_ARGS[name]:
            hostile.append(f"{name} {value!r}")
        args.extend([name, value])
        return value

    def number(value: str, default: float) -> float:
        try:
            found = float(value)
        except ValueError:
            return default
        return found if math.isfinite(found) and found > 0 else default

    step_timeout = 10.0
    if command in ("run", "explore", "sweep", "sweep-explore", "check", "check-explore") and rng.random() < 0.7:
        step_timeout = min(10.0, number(flag("--step-timeout"), 10.0))
    variant = rng.choice(["", "", "--fix", "--bug", "--compare"])
    if variant == "--compare" and command not in ("run", "load"):
        variant = ""
    if variant and command not in ("check", "check-explore"):
        args.append(variant)
        variants = 2 if variant == "--compare" else 1
    if command in ("check", "check-explore"):
        variants = 2
    if command.endswith("explore") and command != "explore":
        args.append("--explore")
    space = shape.interleavings()
    if command.endswith("explore"):
        limit = space
        if rng.random() < 0.7 or space > 200:
            limit = min(space, int(number(flag("--max"), space)))
        if rng.random() < 0.3:
            flag("--seed")
        if command == "explore" and rng.random() < 0.3:
            shard = flag("--shard")
            with_n = re.fullmatch(r"(\d+)/(\d+)", shard)
            if with_n and int(with_n[2]) > 0:
                limit = math.ceil(limit / int(with_n[2]))
        if rng.random() < 0.4:
            flag("-j")
        runs = min(limit, 50)
    params: list[str] = []
    if command.startswith("sweep"):
        choices = ["FOR UPDATE", "FOR SHARE", "FOR NO KEY UPDATE"]
        cells = 1
        for name in rng.sample(["lock", "delta", "workers"] if shape.group else ["lock", "delta"], rng.randint(1, 2)):
            if name == "lock":
                values = rng.sample(choices, rng.randint(1, 3))
            elif name == "delta":
                values = [str(v) for v in rng.sample(range(-5, 100), rng.randint(1, 4))]
            else:
                values = [str(v) for v in rng.sample(range(1, 4), rng.randint(1, 2))]
            if not valid and rng.random() < 0.3:
                values = rng.choice(
                    [
                        [str(v) for v in range(37)],  # a grid that takes long: its size must be said first
                        ["", ""],
                        [rng.choice(STRINGS)],
                        ["1", "1"],
                        ["FOR UPDATE; DROP TABLE jobs"],
                        ["x" * 10_000],
                    ]
                )
                hostile.append(f"-p {name}=<{len(values)} hostile values>")
            cells *= len(values)
            params += ["-p", f"{name}=" + ",".join(values)]
        if not valid and rng.random() < 0.1:
            params += ["-p", rng.choice(["nope=1,2", "=1", "lock", "lock=", ",", "a" * 300 + "=1"])]
            hostile.append("-p (malformed)")
        runs = cells * (runs if command == "sweep-explore" else 1)
    elif command in ("run", "explore", "load") and rng.random() < 0.3:
        name, value = rng.choice(
            [("delta", str(rng.randint(-3, 3))), ("lock", "FOR SHARE"), ("workers", "3")][: 3 if shape.group else 2]
        )
        if not valid and rng.random() < 0.5:
            value = rng.choice([*STRINGS, "FOR UPDATE; DROP TABLE jobs", "1,2"])
            hostile.append(f"-p {name}=hostile")
        params += ["-p", f"{name}={value}"]
    args += params
    load_s = 0.0
    if command.startswith("load"):
        clients = flag("-c") if rng.random() < 0.8 else "1,2,4,8"
        counts = [c for c in clients.split(",") if c.strip().isdigit()]
        if rng.random() < 0.5:
            seconds = number(flag("-T"), 5.0)
        elif rng.random() < 0.7:
            seconds = number(flag("-t"), 5.0) * 0.05
        else:
            seconds = 5.0
        load_s = max(1, len(counts)) * (seconds + 3.0)
        if command == "load-emit":
            target = rng.choice(["emit", "emit", "emit/deep/er", ".", SCENARIO, "emit\x01"])
            args += ["--emit", target]
            if target.startswith("emit"):
                outputs.append(target.split("/")[0])
            elif target == ".":
                outputs += [f"fz.{v}.{kind}.sql" for v in ("bug", "fix") for kind in ("setup", "pgbench", "check")]
            else:
                hostile.append(f"--emit {target!r}")
            load_s = 0.0
    if command not in ("show", "load-emit", "check", "check-explore") and rng.random() < 0.35:
        target = rng.choice(["out.txt", "out.txt", "sub/out.txt", SCENARIO, "link.toml", ".", "out\x01.txt"])
        args += ["-o", target]
        if target in ("out.txt", "out\x01.txt"):
            outputs.append(target)
        else:
            hostile.append(f"-o {target!r}")
            symlink = target == "link.toml"
    if command not in ("show", "check", "check-explore") and rng.random() < 0.4:
        formats = {"load": ["json", "svg", "html", "text"], "sweep": ["json", "markdown", "html", "text"]}
        args += ["-f", rng.choice(formats.get(command.split("-")[0], ["json", "markdown", "html", "text"]))]
    # a hostile statement (pg_sleep, a lock never released) may run each of its steps into the step timeout
    stuck = sum(1 for slot in used if "sql" in slot) * max(1, shape.group)
    steps_run = command != "show" and not command.startswith("load")
    own_timeout = not any("--step-timeout" in h for h in hostile)
    slow = BASE_S + variants * runs * (RUN_S + shape.sleep_s + step_timeout * (1 + stuck)) > HARD_S
    if stuck and steps_run and own_timeout and slow:
        step_timeout = 0.5  # keep a run that is slow by its own SQL inside the harness's hard bound
        args += ["--step-timeout", "0.5"]
    per_run = RUN_S + shape.sleep_s + step_timeout * (1 + stuck)
    bound = BASE_S + variants * (runs * per_run + load_s)
    args = [a.replace("\x00", "\\0")[:100_000] for a in args]  # no argv can hold a NUL, nor 128 kB in one
    return Case(index, command, args, text, hostile, min(bound, HARD_S), outputs, symlink)


# -- running it --------------------------------------------------------------------------------


@dataclass
class Result:
    case: Case
    code: int | None  # None: killed at its bound
    took: float
    stderr: str
    problems: list[str]


class Lane:
    """One server and one watched tree: the cases of one job run here, one after another."""

    def __init__(self, stack: ExitStack, root: Path, name: str) -> None:
        from pgrace.servers import open_server

        self.root = root / name
        self.home, self.tmp, self.marks, self.cases = (self.root / d for d in ("home", "tmp", "marks", "cases"))
        for d in (self.home, self.tmp, self.marks, self.cases):
            d.mkdir(parents=True)
        self.server = stack.enter_context(open_server("embedded"))
        self.dsn = self.server.dsn

    def env(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "PGRACE_"))}
        path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
        return {
            **keep,
            "HOME": str(self.home),
            "TMPDIR": str(self.tmp),
            "PYTHONPATH": path,
            "NO_COLOR": "1",
            "XDG_CACHE_HOME": str(self.home / ".cache"),
        }

    def run(self, case: Case) -> Result:
        work = self.cases / f"case-{case.index}"
        work.mkdir()
        scenario = work / "fz.toml"
        text = case.text.replace(MARK, str(self.marks / f"case-{case.index}"))
        data = text.encode("utf-8", "surrogatepass")
        scenario.write_bytes(data)
        if case.symlink:
            (work / "link.toml").symlink_to("fz.toml")
        mark = str(self.marks / f"case-{case.index}")
        args = [a.replace(SCENARIO, "fz.toml").replace(MARK, mark) for a in case.args]
        if case.command != "show":
            args += ["--dsn", self.dsn]
        problems: list[str] = []
        started = time.monotonic()
        child = subprocess.Popen(
            [sys.executable, "-m", "pgrace", *args],
            cwd=work,
            env=self.env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        resource.prlimit(child.pid, resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))  # before pgrace is imported
        kill_at = min(HARD_S, max(case.bound_s * 1.5, case.bound_s + 10))
        try:
            out, err = child.communicate(timeout=kill_at)
            code: int | None = child.returncode
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, 9)
            out, err = child.communicate()
            code = None
            problems.append(f"hang: killed after {kill_at:.0f} s (bound {case.bound_s:.0f} s)")
        took = time.monotonic() - started
        stderr = err.decode(errors="replace")
        _ = out
        if code is not None:
            if code not in DOCUMENTED:
                problems.append(f"exit {code}")
            if took > case.bound_s:
                problems.append(f"slow: {took:.1f} s, bound {case.bound_s:.0f} s")
        if "Traceback (most recent call last)" in stderr:
            problems.append("traceback")
        if "internal error" in stderr.lower():
            problems.append("internal error")
        if PGBENCH_PARSED.search(stderr):  # pgbench's own parser read text of the scenario as a meta-command
            problems.append("meta-command reached pgbench")
        problems += self._files(case, work, scenario, data)
        problems += self._server()
        return Result(case, code, took, stderr, problems)

    def _files(self, case: Case, work: Path, scenario: Path, data: bytes) -> list[str]:
        problems = []
        marks = sorted(p.name for p in self.marks.iterdir())
        if marks:
            problems.append("shell ran: marker " + ", ".join(marks))
            for p in self.marks.iterdir():
                p.unlink()
        if not scenario.is_file() or scenario.read_bytes() != data:
            problems.append("the scenario file was overwritten")
        allowed = {"fz.toml", *case.outputs, *(["link.toml"] if case.symlink else [])}
        stray = sorted(p.name for p in work.iterdir() if p.name not in allowed)
        for emitted in work.rglob("*.pgbench.sql"):
            if re.search(r"\\(shell|setshell)\b", emitted.read_text(errors="replace")):
                problems.append(f"emitted a shell meta-command: {emitted.name}")
        if stray:
            problems.append("stray files in cwd: " + ", ".join(stray))
        for where in (self.home, self.tmp):
            left = sorted(str(p.relative_to(self.root)) for p in where.rglob("*"))
            if left:
                problems.append("left in " + where.name + ": " + ", ".join(left[:5]))
                shutil.rmtree(where)
                where.mkdir()
        return problems

    def _server(self) -> list[str]:
        import psycopg

        deadline = time.monotonic() + 5.0
        while True:
            with psycopg.connect(self.dsn, autocommit=True, application_name="fuzz-watch") as conn:
                dbs = [r[0] for r in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'pgrace%'")]
                backends = [
                    f"{r[0]} ({r[1]})"
                    for r in conn.execute(
                        "SELECT application_name, datname FROM pg_stat_activity"
                        " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
                    )
                ]
                if not dbs and not backends:
                    return []
                if time.monotonic() > deadline:  # report, then clear the way for the next case
                    conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
                    )
                    for db in dbs:
                        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
                    said = []
                    if dbs:
                        said.append("scratch databases left: " + ", ".join(dbs))
                    if backends:
                        said.append("backends left: " + ", ".join(backends))
                    return said
            time.sleep(0.1)  # a backend ends a moment after its client: polling for that, bounded


@contextmanager
def lanes(jobs: int) -> Iterator[list[Lane]]:
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fuzz_surfaces_")))
        yield [Lane(stack, root, f"lane{i}") for i in range(jobs)]


def run_cases(cases: list[Case], jobs: int = 1, progress: Callable[[Result], None] | None = None) -> list[Result]:
    """Run ``cases`` on ``jobs`` lanes (each its own server), in order of index within a lane."""
    results: list[Result] = []
    todo = iter(cases)
    lock = threading.Lock()
    stop = threading.Event()

    def work(lane: Lane) -> None:
        while not stop.is_set():
            with lock:
                case = next(todo, None)
            if case is None:
                return
            try:
                result = lane.run(case)
            except Exception as error:  # the harness's own trouble is reported with the case, not lost in a thread
                result = Result(case, None, 0.0, "", [f"harness error: {error!r}"])
            with lock:
                results.append(result)
                if progress:
                    progress(result)

    with lanes(jobs) as all_lanes:
        threads = [threading.Thread(target=work, args=(lane,)) for lane in all_lanes]
        for t in threads:
            t.start()
        try:
            for t in threads:
                t.join()
        except KeyboardInterrupt:  # let each lane finish its case, then stop its server
            stop.set()
            for t in threads:
                t.join()
            raise
    return sorted(results, key=lambda r: r.case.index)


# -- the report --------------------------------------------------------------------------------


def cause(result: Result) -> str:
    """A failure's group: the kind of problem, and the line pgrace printed with numbers and names folded."""
    kinds = sorted({p.split(":")[0] for p in result.problems})
    last = (result.stderr.strip().splitlines() or [""])[-1]
    raised = re.search(r"^([\w.]+(?:Error|Exception|Terminated|Interrupt)\w*)\b", result.stderr, re.MULTILINE)
    if "traceback" in kinds and raised:
        last = f"{raised[1]} ... {last}"
    last = re.sub(r"/\S*", "PATH", last)
    last = re.sub(r"\d+", "N", last)[:110]
    return f"{result.case.command}: {', '.join(kinds)}: {last}"


def save(result: Result, where: Path) -> Path:
    folder = where / f"case-{result.case.index}"
    folder.mkdir(parents=True, exist_ok=True)
    scenario = folder / "fz.toml"
    scenario.write_bytes(result.case.text.replace(MARK, "/tmp/pgrace-fuzz-marker").encode("utf-8", "surrogatepass"))
    args = " ".join(_quote(a.replace(SCENARIO, "fz.toml")) for a in result.case.args)
    dsn = "" if result.case.command == "show" else ' --dsn "$PGRACE_DSN"'
    link = "ln -sf fz.toml link.toml\n" if result.case.symlink else ""
    (folder / "repro.sh").write_text(f'#!/bin/sh\ncd "$(dirname "$0")"\n{link}python -m pgrace {args}{dsn}\n')
    (folder / "result.json").write_text(
        json.dumps(
            {
                "exit": result.code,
                "took_s": round(result.took, 2),
                "bound_s": result.case.bound_s,
                "problems": result.problems,
                "hostile": result.case.hostile,
                "stderr": result.stderr[-4000:],
            },
            indent=2,
        )
    )
    return folder


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def report(results: list[Result], took: float, keep: Path | None) -> int:
    by = Counter((r.case.command, "killed" if r.code is None else str(r.code)) for r in results)
    commands = sorted({c for c, _ in by})
    codes = sorted({e for _, e in by}, key=lambda e: (e == "killed", int(e) if e.isdigit() else 999))
    print(f"{'command':<15}" + "".join(f"{'exit ' + e if e.isdigit() else e:>9}" for e in codes) + f"{'total':>8}")
    for command in commands:
        row = [by[(command, e)] for e in codes]
        print(f"{command:<15}" + "".join(f"{n:>9}" for n in row) + f"{sum(row):>8}")
    failed = [r for r in results if r.problems]
    ran = sum(1 for r in results if r.code in (0, 1))
    print(f"{len(results)} cases ({ran} ran to a verdict) in {took:.0f} s; {len(failed)} failed")
    if not failed:
        return 0
    where = keep or Path(tempfile.mkdtemp(prefix="pgrace-fuzz-failures-"))
    groups: dict[str, list[Result]] = {}
    for r in failed:
        groups.setdefault(cause(r), []).append(r)
    print(f"failures by cause (reproducers in {where}):")
    for name, members in sorted(groups.items(), key=lambda g: -len(g[1])):
        smallest = min(members, key=lambda r: (len(r.case.text), len(r.case.args)))
        folder = save(smallest, where)
        for r in members:
            if r is not smallest:
                save(r, where)
        print(f"  {len(members):>4} x {name}")
        shown = " ".join(a if len(a) < 80 else a[:40] + f"...<{len(a)} chars>" for a in smallest.case.args)
        print(f"       e.g. case {smallest.case.index}: {shown}  [{folder}]")
        print(f"       problems: {'; '.join(smallest.problems)}; hostile: {', '.join(smallest.case.hostile) or '-'}")
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", type=int, default=0, help="index of the first case (to re-run a range)")
    parser.add_argument("--only", default="", help="run only these case indices, e.g. 12,977 (from a report)")
    parser.add_argument("--jobs", type=int, default=1, help="lanes at once, each with its own server")
    parser.add_argument("--keep", type=Path, default=None, help="where to save the reproducers")
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per case")
    options = parser.parse_args()
    indices = [int(i) for i in options.only.split(",") if i] or range(options.first, options.first + options.cases)
    cases = [generate(options.seed, i) for i in indices]
    started = time.monotonic()
    done = itertools.count(1)

    def progress(r: Result) -> None:
        n = next(done)
        if options.verbose or r.problems:
            state = "killed" if r.code is None else f"exit {r.code}"
            said = (r.stderr.strip().splitlines() or [""])[-1][:160]
            print(
                f"[{n}/{len(cases)}] case {r.case.index} {r.case.command} {state} {r.took:.1f}s {'; '.join(r.problems)}"
                f" | {said}",
                flush=True,
            )
        elif n % 100 == 0:
            print(f"[{n}/{len(cases)}] {time.monotonic() - started:.0f} s", flush=True)

    results = run_cases(cases, options.jobs, progress)
    return report(results, time.monotonic() - started, options.keep)


if __name__ == "__main__":
    sys.exit(main())
