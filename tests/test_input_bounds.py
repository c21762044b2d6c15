"""Hostile scenario text is refused before parsing: exit 2, one line naming file:line, at once.

Before these bounds, ``x = [[[…]]]`` 500 deep printed a 3,000-line RecursionError and a
100,000-part dotted key kept tomllib busy for minutes. The limits are documented in
:mod:`pgrace.frontends.limits` and docs/reference/exit-codes.md.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from documentation import page

from pgrace.cli import main
from pgrace.errors import ScenarioError
from pgrace.frontends import catalog, limits
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.frontends.spec import parse_spec

STORY = 'sessions = ["a"]\n[[step]]\nsession = "a"\nsql = "SELECT 1"\n'
SPEC = "session s1\nstep s1a { SELECT 1; }\n"


def refused(name: str, content: bytes, tmp_path: Path) -> tuple[str, float]:
    """Run `pgrace show` on a file: it must answer exit 2 with one line, quickly."""
    path = tmp_path / name
    path.write_bytes(content)
    started = time.perf_counter()
    result = CliRunner().invoke(main, ["show", str(path)])
    took = time.perf_counter() - started
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    [line] = result.stderr.splitlines()
    assert line.startswith(f"pgrace: {path}:"), line
    return line.removeprefix(f"pgrace: {path}:"), took


@pytest.mark.timing
@pytest.mark.parametrize(
    ("name", "content", "where", "says"),
    [
        ("deep.toml", b"x = " + b"[" * 500 + b"]" * 500 + b"\n", "1", "nested more than 32 deep"),
        (
            "deep-inline.toml",
            b"title = 't'\nx = " + b"{a = " * 100 + b"1" + b"}" * 100 + b"\n",
            "2",
            "nested more than 32 deep",
        ),
        ("dotted.toml", b"a" + b".a" * 100_000 + b" = 1\n", "1", "line longer than 100,000 characters"),
        (
            "dotted-short.toml",
            b"title = 't'\n" + b"a" + b".a" * 20 + b" = 1\n",
            "2",
            "dotted key with more than 16 parts",
        ),
        ("header.toml", b"[" + b"a." * 20 + b"a]\n", "1", "dotted key with more than 16 parts"),
        ("huge.toml", b"# filler\n" * 1_200_000, "116509", "file is larger than 1 MiB"),
        ("huge.spec", b"# filler\n" * 1_200_000, "116509", "file is larger than 1 MiB"),
        ("latin1.toml", b'title = "caf\xe9"\n', "1", "not UTF-8: byte 0xe9 at column 13"),
        ("latin1.spec", b"session s1\nstep s1a { SELECT 'caf\xe9'; }\n", "2", "not UTF-8: byte 0xe9"),
        ("nul.spec", b"session s1\nstep s1a { SELECT 1;\0 DROP TABLE x; }\n", "2", "NUL character"),
        ("nul.toml", STORY.encode().replace(b"SELECT 1", b"SELECT 1\\u0000"), "4", "NUL character"),
        ("long.spec", b"session s1\nstep s1a { SELECT '" + b"x" * 200_000 + b"'; }\n", "2", "line longer than 100,000"),
    ],
)
def test_hostile_files_are_refused_with_file_and_line(
    name: str, content: bytes, where: str, says: str, tmp_path: Path
) -> None:
    message, took = refused(name, content, tmp_path)
    assert message.startswith(f"{where}: "), message
    assert says in message
    assert took < 10, f"{name} took {took:.1f} s"  # a hang guard, not a benchmark: tomllib took minutes


def test_ten_megabytes_are_not_read_whole(tmp_path: Path) -> None:
    message, _ = refused("ten.toml", b"x" * 10_000_000, tmp_path)
    assert "file is larger than 1 MiB" in message


def test_brackets_dots_and_hashes_inside_strings_and_comments_are_not_counted() -> None:
    nested = "[" * 40 + "]" * 40
    dotted = ".".join("a" * 20)
    text = (
        f'title = "{nested} {dotted}"\n'
        f"narrative = '''\n{nested}\n{dotted} # not a comment\n'''\n"
        f'setup = """\nSELECT \'{nested}\' -- \\""" {dotted}\n"""\n'
        f"# {nested} {dotted}\n" + STORY
    )
    scenario = parse_toml_scenario(text, "ok.toml")
    assert scenario.title == f"{nested} {dotted}"


def test_every_shipped_scenario_is_well_inside_the_limits() -> None:
    for name in catalog.shipped_names():
        path = catalog.shipped_dir() / f"{name}.toml"
        limits.check_toml(path.read_text(), str(path))


def test_the_parsers_enforce_the_limits_on_text_too() -> None:
    with pytest.raises(ScenarioError, match="nested more than 32 deep") as toml_error:
        parse_toml_scenario("x = " + "[" * 33 + "]" * 33, "t.toml")
    assert toml_error.value.line == 1
    with pytest.raises(ScenarioError, match="NUL") as spec_error:
        parse_spec(SPEC + "\0", "s.spec")
    assert spec_error.value.line == 3


def test_many_steps_parse_in_linear_time() -> None:
    """20,000 steps in one file (under 1 MiB) parse in linear time: a set and a bisect, not scans."""
    small, large = (
        STORY.split("[[step]]")[0] + '[[step]]\nsession = "a"\nsql = "SELECT 1"\n' * n for n in (2_000, 20_000)
    )
    timings = []
    for text in (small, large):
        started = time.perf_counter()
        assert len(parse_toml_scenario(text, "many.toml").steps) == text.count("[[step]]")
        timings.append(time.perf_counter() - started)
    assert timings[1] < 30 * timings[0] + 1, timings  # 10x the input: linear, with room for a noisy machine


def test_the_docs_state_the_limits() -> None:
    text = " ".join(page("reference/exit-codes.md").split())
    assert limits.LIMITS_TEXT in text


@pytest.mark.parametrize(
    "number", ["1e999", "-1e999", "NaN", "Infinity", "1" * 5000, "1.5", '"70"', "true", "null", "[70]"]
)
@pytest.mark.parametrize("field", ["space", "explored", "count"])
def test_a_shards_json_with_numbers_out_of_bounds_is_refused(tmp_path: Path, field: str, number: str) -> None:
    """JSON may say 1e999 (inf), NaN or a 5,000-digit number: each is invalid input, never an internal error."""
    values = {"space": "70", "explored": "70", "count": "70"}
    values[field] = number
    shard = tmp_path / "shard.json"
    shard.write_text(
        f'{{"scenario": "lost-update", "variant": "bug", "space": {values["space"]}, "explored": {values["explored"]},'
        f' "seed": null, "classes": [{{"ok": true, "count": {values["count"]}, "errors": [], "waits": [],'
        f' "final": [], "example": ["alice-begin"]}}]}}'
    )
    result = CliRunner().invoke(main, ["explore", "lost-update", "--merge", str(shard)])
    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("pgrace: ") and "not an exploration's JSON" in line, line


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("scenarios", "a directory, not a scenario file (pgrace check DIR runs every file in one)"),
        ("/dev/null", "not a regular file"),
        ("nowhere/x.toml", "no such scenario file"),
    ],
)
def test_what_is_not_a_scenario_file_is_named_for_what_it_is(ref: str, message: str) -> None:
    result = CliRunner().invoke(main, ["show", ref])
    assert result.exit_code == 2
    assert result.stderr == f"pgrace: {ref}: {message}\n"


@pytest.mark.parametrize(
    ("dsn", "problem"),
    [
        ("host=127.0.0.1 port=99999 dbname=x", "port '99999' is not a number from 1 to 65535"),
        ("postgresql://u@127.0.0.1:abc/db", "port 'abc' is not a number from 1 to 65535"),
        ("host=127.0.0.1 port=5432,0", "port '0' is not a number from 1 to 65535"),
        ("host=127.0.0.1 connect_timeout=soon", "connect_timeout 'soon' is not a whole number"),
    ],
)
@pytest.mark.parametrize("command", [["run", "lost-update"], ["clean"], ["matrix"]])
def test_a_dsn_with_a_bad_number_is_invalid_input_not_an_unreachable_server(
    dsn: str, problem: str, command: list[str]
) -> None:
    result = CliRunner().invoke(main, [*command, "--dsn", dsn])
    assert result.exit_code == 2, result.output
    assert result.stderr == f"pgrace: invalid PostgreSQL connection string (not shown): {problem}\n"
