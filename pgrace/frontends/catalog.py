"""Find scenarios: the shipped ones by name, or a user's ``.toml`` / ``.spec`` file."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

from pgrace.errors import OptionError, ScenarioError
from pgrace.frontends import limits
from pgrace.frontends.names import did_you_mean
from pgrace.frontends.scenario_toml import read_toml_scenario
from pgrace.model.scenario import Scenario

SUFFIXES = (".toml", ".spec")


def shipped_dir() -> Path:
    """The scenarios shipped inside the package (a checkout's top-level ``scenarios/`` links here).

    The package's own folder, so a wheel, an editable install and a checkout find them alike.
    pgrace is never imported from a zip, so this is the folder ``importlib.resources`` names
    too, without importing its readers on every run.
    """
    return Path(__file__).parent.parent / "scenarios"


def shipped_names() -> list[str]:
    folder = shipped_dir()
    return sorted(p.stem for p in folder.glob("*.toml")) if folder.is_dir() else []


OTHER_TOPIC = "other"  # the group of scenarios whose file names no topic


@dataclass(frozen=True)
class Entry:
    """One shipped scenario as `pgrace list` shows it."""

    name: str
    title: str
    topic: str
    tags: tuple[str, ...]
    variants: tuple[str, ...]

    @property
    def variants_label(self) -> str:
        return " + ".join(sorted(self.variants))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "topic": self.topic,
            "tags": list(self.tags),
            "variants": sorted(self.variants),
        }


def entries() -> list[Entry]:
    """Every shipped scenario, by name."""
    found = []
    for name in shipped_names():
        scenario = read_scenario(name)
        topic = scenario.topic or OTHER_TOPIC
        found.append(Entry(name, scenario.title, topic, scenario.tags, scenario.variants))
    return found


def select(tags: tuple[str, ...] | list[str] = (), topic: str | None = None) -> list[Entry]:
    """The shipped scenarios with every one of ``tags`` and of ``topic``; an unknown tag or topic is an error."""
    found = entries()
    known_tags = {tag for entry in found for tag in entry.tags}
    for tag in tags:
        if tag not in known_tags:
            raise OptionError(f"no shipped scenario has tag {tag!r}{did_you_mean(tag, known_tags)}", "tags")
    known_topics = {entry.topic for entry in found}
    if topic is not None and topic not in known_topics:
        raise OptionError(f"no shipped scenario has topic {topic!r}{did_you_mean(topic, known_topics)}", "topic")
    return [e for e in found if set(tags) <= set(e.tags) and (topic is None or e.topic == topic)]


def by_topic(chosen: list[Entry]) -> list[tuple[str, list[Entry]]]:
    """Topics in alphabetical order ("other" last), scenarios by name within each."""
    ordered = sorted(chosen, key=lambda e: (e.topic == OTHER_TOPIC, e.topic, e.name))
    return [(topic, list(members)) for topic, members in groupby(ordered, key=lambda e: e.topic)]


def looks_like_path(ref: str) -> bool:
    return ref.endswith(SUFFIXES) or "/" in ref or Path(ref).exists()


def variant(scenario: Scenario, wanted: str | None) -> Scenario:
    """``scenario``'s variant ``wanted`` ("bug", "fix"; None: the first in the file), or an error naming the file."""
    try:
        return scenario.variant_named(wanted)
    except KeyError:
        raise ScenarioError(f"scenario {scenario.name!r} has no {wanted} variant", scenario.source) from None


def read_scenario(ref: str, params: dict[str, str] | None = None) -> Scenario:
    """A shipped scenario's name, or a path to a scenario or spec file."""
    if not looks_like_path(ref):
        names = shipped_names()
        if ref not in names:
            known = ", ".join(names)
            raise ScenarioError(f"no shipped scenario {ref!r}{did_you_mean(ref, names)}; shipped: {known}")
        return read_toml_scenario(shipped_dir() / f"{ref}.toml", params)
    path = Path(ref)
    if path.is_dir():
        raise ScenarioError("a directory, not a scenario file (pgrace check DIR runs every file in one)", ref)
    if not path.is_file():
        raise ScenarioError("no such scenario file" if not path.exists() else "not a regular file", ref)
    if path.suffix == ".spec":
        from pgrace.frontends.spec import parse_spec

        if params:
            raise OptionError(f"{ref} is a .spec file: parameters are set in pgrace scenario files only", "params")
        return parse_spec(limits.read_text(path), ref)
    return read_toml_scenario(path, params)


def find_files(paths: list[str]) -> list[Path]:
    """Every scenario file under the given files and directories, sorted, no duplicates."""
    found: list[Path] = []
    for ref in paths:
        path = Path(ref)
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file()))
        elif path.is_file():
            found.append(path)
        else:
            raise ScenarioError("no such file or directory", ref)
    unique: list[Path] = []
    for path in found:
        if path not in unique:
            unique.append(path)
    return unique


def both_variants(scenario: Scenario) -> list[Scenario]:
    """What a comparison runs: the bug, then the fix."""
    if scenario.other is None:
        raise ScenarioError(
            f"scenario {scenario.name!r} has one variant only; a comparison needs a bug and a fix", scenario.source
        )
    return sorted([scenario, scenario.other], key=lambda s: s.variant != "bug")
