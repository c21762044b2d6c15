"""The library: every shipped scenario has a topic and tags, and `pgrace list` groups and filters by them."""

from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner

from pgrace.cli import main
from pgrace.errors import ScenarioError
from pgrace.frontends import catalog
from pgrace.frontends.scenario_toml import parse_toml_scenario

STORY = """
title = "two sessions"
topic = "job queue"
tags = ["skip-locked", "for-update"]
sessions = ["a"]

[[step]]
session = "a"
sql = "SELECT 1"

[fix]
title = "the cure"
"""


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env={"PGRACE_DSN": "host=/nonexistent"})  # never needs a server
    return result.exit_code, result.output


def listing(output: str) -> tuple[str, list[str]]:
    """`pgrace list` text: the scenario part, and the tags named under it."""
    scenarios, _, tags = output.partition("\ntags (pgrace list --tag TAG):\n")
    return scenarios, " ".join(line.strip() for line in tags.splitlines()).split(", ") if tags else []


def test_topic_and_tags_are_read_and_shared_by_both_variants() -> None:
    scenario = parse_toml_scenario(STORY, "story.toml")
    assert (scenario.topic, scenario.tags) == ("job queue", ("skip-locked", "for-update"))
    assert scenario.other is not None and (scenario.other.topic, scenario.other.tags) == (scenario.topic, scenario.tags)
    bare = parse_toml_scenario('sessions = ["a"]\n[[step]]\nsession = "a"\nsql = "SELECT 1"\n', "bare.toml")
    assert (bare.topic, bare.tags) == ("", ())


@pytest.mark.parametrize(
    ("replace", "by", "message"),
    [
        ('topic = "job queue"', 'topic = "Job Queue"', "topic 'Job Queue' must be lower-case words"),
        ('topic = "job queue"', 'topic = "job  queue"', "separated by single spaces"),
        ('topic = "job queue"', "topic = 3", "topic must be a string"),
        ('topic = "job queue"', 'topic = "job queue\\n"', "topic 'job queue\\n' must be"),
        ('tags = ["skip-locked", "for-update"]', 'tags = "skip-locked"', "tags must be a list of strings"),
        ('tags = ["skip-locked", "for-update"]', 'tags = ["SKIP LOCKED"]', "tag 'SKIP LOCKED' must be lower-case"),
        ('tags = ["skip-locked", "for-update"]', 'tags = ["skip--locked"]', "joined by single '-'"),
        ('tags = ["skip-locked", "for-update"]', "tags = [1]", "tag 1 must be"),
        ('tags = ["skip-locked", "for-update"]', 'tags = ["a", "b", "a"]', "tag 'a' is listed twice"),
        ('tags = ["skip-locked", "for-update"]', 'tag = ["a"]', "unknown top-level key 'tag' (did you mean 'tags'?)"),
    ],
)
def test_bad_topics_and_tags_name_their_line(replace: str, by: str, message: str) -> None:
    text = STORY.replace(replace, by)
    line = text.splitlines().index(by) + 1
    with pytest.raises(ScenarioError) as info:
        parse_toml_scenario(text, "story.toml")
    assert str(info.value).startswith(f"story.toml:{line}: "), str(info.value)
    assert message in info.value.message


def test_a_bad_tag_in_a_file_is_exit_2_with_file_and_line(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "bad.toml"
    path.write_text(textwrap.dedent(STORY).replace('"for-update"', '"FOR UPDATE"'), encoding="utf-8")
    code, output = invoke("show", str(path))
    assert code == 2
    assert f"{path}:4: tag 'FOR UPDATE' must be" in output


def test_every_shipped_scenario_has_a_topic_and_tags() -> None:
    for entry in catalog.entries():
        assert entry.topic != catalog.OTHER_TOPIC, f"{entry.name}: no topic"
        assert entry.tags, f"{entry.name}: no tags"


def test_list_groups_by_topic_in_order_and_names_the_tags() -> None:
    code, full = invoke("list")
    assert code == 0
    output, tags = listing(full)
    entries = {e.name: e for e in catalog.entries()}
    topics = [line for line in output.splitlines() if line and not line.startswith(" ") and ":" not in line]
    assert topics == sorted({e.topic for e in entries.values()})
    current = None
    seen: list[str] = []
    for line in output.splitlines():
        if line in topics:
            current = line
        elif line.startswith("  "):
            name = line.split()[0]
            assert entries[name].topic == current, name
            seen.append(name)
    assert sorted(seen) == sorted(entries)
    assert "head-of-line-blocking" in output.split("job queue")[1].split("\n\n")[0]
    assert tags == sorted({t for e in entries.values() for t in e.tags})
    assert all(len(line) <= 102 for line in full.split("--tag TAG):")[1].splitlines())


def test_list_filters_by_every_tag_given_and_by_topic() -> None:
    code, output = invoke("list", "--tag", "skip-locked")
    assert code == 0
    listed = {line.split()[0] for line in listing(output)[0].splitlines() if line.startswith("  ")}
    assert listed == {e.name for e in catalog.entries() if "skip-locked" in e.tags}
    assert {"head-of-line-blocking", "skip-locked-fanout"} <= listed and "lost-update" not in listed
    code, output = invoke("list", "--tag", "skip-locked", "--tag", "limit", "-f", "json")
    assert code == 0
    assert [e["name"] for e in json.loads(output)] == [
        e.name for e in catalog.entries() if {"skip-locked", "limit"} <= set(e.tags)
    ]
    code, output = invoke("list", "--topic", "money", "--format", "json")
    assert code == 0
    data = json.loads(output)
    assert data and all(e["topic"] == "money" for e in data)
    assert set(data[0]) == {"name", "title", "topic", "tags", "variants"}
    assert "lost-update" in [e["name"] for e in data]


def test_list_refuses_an_unknown_tag_or_topic_with_a_hint() -> None:
    code, output = invoke("list", "--tag", "skiplocked")
    assert code == 2 and "no shipped scenario has tag 'skiplocked' (did you mean 'skip-locked'?)" in output
    code, output = invoke("list", "--topic", "jobqueue")
    assert code == 2 and "no shipped scenario has topic 'jobqueue' (did you mean 'job queue'?)" in output


def test_show_names_the_topic_and_tags() -> None:
    code, output = invoke("show", "skip-locked-fanout")
    assert code == 0
    assert "topic: job queue; tags: skip-locked" in output
