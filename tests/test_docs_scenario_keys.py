"""docs/reference/scenario-keys.md lists every key the scenario parser accepts, and only those.

The parser says what it accepts in one set per table (``STEP_KEYS``, ``EXPECT_KEYS``, …),
each checked with ``Reader.check_keys``. ``TABLES`` below places each set at its path in
the file; the page's rows (`` `step.expect.waits_on.table` ``) must be exactly those
paths. A key added to a set, or a new set, fails here until the page tells it. And
every key on the page is held, at its path, by one of two files the parser reads
(tests/keys/), so a set placed at the wrong path fails too.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import tomllib
from collections.abc import Collection, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from documentation import ROOT, page

from pgrace.frontends import load_toml, scenario_toml
from pgrace.frontends.scenario_toml import builder, commands, expect, params, retry, steps, variants

#: Each table of a scenario file: its path on the page, and the keys the parser accepts there.
TABLES: dict[str, tuple[Collection[str], ...]] = {
    "": (builder.TOP_KEYS, builder.VARIANTS),
    "sessions": (builder.SESSION_KEYS,),
    "params.NAME": (params.PARAM_KEYS, params.BOUNDED_PARAM_KEYS),
    "step": (steps.STEP_KEYS,),
    "step.expect": (expect.EXPECT_KEYS,),
    "step.expect.waits_on": (expect.WAIT_KEYS,),
    "step.expect.locks": (expect.LOCK_KEYS,),
    "step.retry": (retry.RETRY_KEYS,),
    "check": (expect.CHECK_KEYS,),
    "fix": (variants.VARIANT_KEYS,),  # [bug] has the same keys, which the page says once
    "fix.step.NAME": (variants.OVERRIDE_KEYS,),
    "fix.insert": (variants.ANCHORS,),  # besides a step's keys, which the page says once, under [[step]]
    "exec.NAME": (commands.EXEC_KEYS,),
    "load": (load_toml.LOAD_KEYS,),
    "load.transaction": (load_toml.COMMAND_KEYS,),
    "load.check": (load_toml.CHECK_KEYS,),
}
ROW = re.compile(r"^\| `(?P<path>[A-Za-z_.]+)` \|", re.MULTILINE)


#: Files the parser accepts that between them use every key on the page (one tells the fix first, for [bug]).
EVERY_KEY = [ROOT / "tests" / "keys" / "every-key.toml", ROOT / "tests" / "keys" / "every-key-fix-first.toml"]


def accepted() -> set[str]:
    return {f"{table}.{key}" if table else key for table, sets in TABLES.items() for keys in sets for key in keys}


def documented() -> list[str]:
    return [m["path"] for m in ROW.finditer(page("reference/scenario-keys.md"))]


def test_the_page_lists_exactly_the_keys_the_parser_accepts() -> None:
    rows = documented()
    assert len(rows) == len(set(rows)), f"listed twice: {sorted({r for r in rows if rows.count(r) > 1})}"
    assert not accepted() - set(rows), f"accepted but not on the page: {sorted(accepted() - set(rows))}"
    assert not set(rows) - accepted(), f"on the page but refused by the parser: {sorted(set(rows) - accepted())}"


def readers() -> list[ModuleType]:
    """The scenario format's modules, found by walking the package: a new one is seen without a list to update."""
    found = [
        importlib.import_module(f"{scenario_toml.__name__}.{info.name}")
        for info in pkgutil.iter_modules(scenario_toml.__path__)
    ]
    return [scenario_toml, *found, load_toml]


def test_every_key_set_of_the_parser_has_its_place_in_the_file() -> None:
    """A new table (a new ``*_KEYS`` set) must be placed in ``TABLES``, so that the page is held to it too."""
    placed = {id(keys) for sets in TABLES.values() for keys in sets}
    unplaced = [
        f"{module.__name__}.{name}"
        for module in readers()
        for name, value in vars(module).items()
        if name.endswith("_KEYS") and id(value) not in placed
    ]
    assert not unplaced, f"key sets with no path in TABLES (and so none on the page): {unplaced}"


def used(data: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """The path of every key a scenario file's data holds, a chosen ``NAME`` written as such."""
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        yield path
        named = isinstance(value, dict) and f"{path}.NAME" in TABLES
        inner = [(f"{path}.NAME", v) for v in value.values()] if named else [(path, value)] if path in TABLES else []
        for where, table in inner:
            for item in table if isinstance(table, list) else [table]:
                if isinstance(item, dict):
                    yield from used(item, where)


def test_every_key_on_the_page_is_one_a_file_the_parser_reads_can_hold() -> None:
    """Not only the sets: the keys at their paths, in files the parser reads without an error."""
    from pgrace.frontends.scenario_toml import read_toml_scenario

    held: set[str] = set()
    for path in EVERY_KEY:
        scenario = read_toml_scenario(Path(path))
        assert scenario.other is not None, f"{path.name} has no other variant"
        held |= set(used(tomllib.loads(path.read_text(encoding="utf-8"))))
    assert not set(documented()) - held, f"no example file holds: {sorted(set(documented()) - held)}"
    inserted = {f"fix.insert.{key}" for key in steps.STEP_KEYS}  # an inserted step's keys, told under [[step]]
    assert not held - set(documented()) - inserted, f"held but not on the page: {sorted(held - set(documented()))}"
