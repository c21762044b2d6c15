"""A merge of shards is complete only when it holds each of the N shards of one search once.

A shard's JSON says which search it is a shard of (scenario, variant, parameters, a digest
of the scenario's text, the settings) and which shard of how many. Merging a shard with
itself, shards of different N, of other parameters or settings is refused (exit 2, one line
naming the file); merging some of the shards says which are missing and claims no whole.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from pgrace.cli import main
from pgrace.drivers.explore import explore
from pgrace.drivers.shards import merge_explorations
from pgrace.errors import ScenarioError
from pgrace.frontends import catalog
from pgrace.servers import ServerInfo


@pytest.fixture(scope="module")
def shards(pgrace_server: ServerInfo, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """lost-update's shards 1..3 of 3 and 1/2, and skip-locked-fanout's 1/2 with two and three workers."""
    folder = tmp_path_factory.mktemp("shards")
    runs = {
        "1of3": ["lost-update", "--shard", "1/3"],
        "2of3": ["lost-update", "--shard", "2/3"],
        "3of3": ["lost-update", "--shard", "3/3"],
        "1of2": ["lost-update", "--shard", "1/2"],
        "2of3-timeout": ["lost-update", "--shard", "2/3", "--step-timeout", "5"],
        "2of2-no-reduce": ["lost-update", "--shard", "2/2", "--no-reduce"],
        "fanout-2": ["skip-locked-fanout", "-p", "workers=2", "--bug", "--max", "6", "--shard", "1/2"],
        "fanout-3": ["skip-locked-fanout", "-p", "workers=3", "--bug", "--max", "6", "--shard", "2/2"],
    }
    files = {}
    for name, args in runs.items():
        out = folder / f"{name}.json"
        done = CliRunner().invoke(main, ["explore", *args, "-f", "json", "-o", str(out), "--dsn", pgrace_server.dsn])
        assert done.exit_code == 0, done.output
        files[name] = str(out)
    return files


def merge(scenario: list[str], *files: str) -> Result:
    return CliRunner().invoke(main, ["explore", *scenario, *(a for f in files for a in ("--merge", f))])


def refused(result: Result, file: str, words: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"pgrace: {file}: ") and words in line, line


def test_a_shard_says_which_search_and_which_shard_it_is(shards: dict[str, str]) -> None:
    data = json.loads(Path(shards["2of3"]).read_text())
    assert data["shard"] == {"n": 3, "held": [2], "missing": [1, 3]}
    assert data["search"]["params"] == {} and data["search"]["reduced"] is True
    assert (data["search"]["max"], data["search"]["seed"], data["search"]["step_timeout"]) == (None, None, 10.0)
    assert len(data["search"]["steps"]) == 16
    fanout = json.loads(Path(shards["fanout-2"]).read_text())
    assert fanout["search"]["params"] == {"workers": 2} and fanout["search"]["max"] == 6


def test_a_shard_merged_with_itself_is_refused(shards: dict[str, str]) -> None:
    refused(merge(["lost-update"], shards["1of3"], shards["1of3"]), shards["1of3"], "shard 1/3 again")


def test_shards_of_different_n_are_refused(shards: dict[str, str]) -> None:
    refused(merge(["lost-update"], shards["1of3"], shards["1of2"]), shards["1of2"], "a shard of 2, not of 3")


def test_shards_of_other_settings_are_refused(shards: dict[str, str]) -> None:
    timeout = merge(["lost-update"], shards["1of3"], shards["2of3-timeout"], shards["3of3"])
    refused(timeout, shards["2of3-timeout"], "step_timeout 5.0, not 10.0")
    every = merge(["lost-update"], shards["1of2"], shards["2of2-no-reduce"])
    refused(every, shards["2of2-no-reduce"], "reduced false, not true")


def test_shards_of_other_parameters_are_refused(shards: dict[str, str]) -> None:
    mixed = merge(["skip-locked-fanout", "-p", "workers=2", "--bug"], shards["fanout-2"], shards["fanout-3"])
    refused(mixed, shards["fanout-3"], "params workers=3, not workers=2")
    other = merge(["skip-locked-fanout", "-p", "workers=3", "--bug"], shards["fanout-2"])
    refused(other, shards["fanout-2"], "params workers=2, not workers=3")


def test_shards_of_another_scenario_are_refused(shards: dict[str, str]) -> None:
    refused(merge(["write-skew"], shards["1of3"]), shards["1of3"], "a shard of lost-update (bug), not of write-skew")


def test_some_of_the_shards_say_which_are_missing(shards: dict[str, str]) -> None:
    two = merge(["lost-update"], shards["1of3"], shards["3of3"])
    assert two.exit_code == 0, two.output
    assert "not all covered, shards 1, 3 of 3 merged, shard 2 of 3 missing: " in two.stdout.splitlines()[0]
    data = json.loads(merge(["lost-update", "-f", "json"], shards["1of3"], shards["3of3"]).stdout)
    assert data["guarantee"] == {"kind": "part"} and data["shard"] == {"n": 3, "held": [1, 3], "missing": [2]}
    whole = json.loads(merge(["lost-update", "-f", "json"], shards["3of3"], shards["1of3"], shards["2of3"]).stdout)
    assert whole["guarantee"] == {"kind": "complete"} and (whole["explored"], whole["space"]) == (70, 70)
    assert whole["shard"] == {"n": 3, "held": [1, 2, 3], "missing": []}


def test_a_merge_of_some_shards_merges_with_the_rest(shards: dict[str, str], tmp_path: Path) -> None:
    partial = tmp_path / "1+3.json"
    partial.write_text(merge(["lost-update", "-f", "json"], shards["1of3"], shards["3of3"]).stdout)
    whole = json.loads(merge(["lost-update", "-f", "json"], str(partial), shards["2of3"]).stdout)
    assert whole["guarantee"] == {"kind": "complete"}
    refused(merge(["lost-update"], str(partial), shards["3of3"]), shards["3of3"], "shard 3/3 again")


def test_a_file_that_does_not_say_its_search_is_refused(shards: dict[str, str], tmp_path: Path) -> None:
    data = json.loads(Path(shards["1of2"]).read_text())
    del data["search"], data["shard"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    refused(merge(["lost-update"], str(old)), str(old), "not a shard of a known search")


def test_the_library_refuses_a_shard_held_twice(pgrace_server: ServerInfo) -> None:
    scenario = catalog.read_scenario("lost-update").variant_named("bug")
    first = explore(scenario, pgrace_server, shard=(1, 2))
    with pytest.raises(ScenarioError, match="shard 1/2 again"):
        merge_explorations([first, first])
    alone = merge_explorations([first])
    assert not alone.covers_all and alone.missing == (2,) and alone.guarantee == {"kind": "part"}
