"""pgrace's own scenario format: a TOML file that reads like a story.

Parsing happens in two passes (as isolationtester's ``check_testspec``): ``tomllib``
turns text into plain data, then :class:`Builder` checks every key and reference and turns
it into a :class:`~pgrace.model.scenario.Scenario`, raising one :class:`ScenarioError` that names
the file and line of the first problem, with a "did you mean" hint where one helps.
``tomllib`` keeps no positions, so :class:`Locator` finds lines by scanning the text.

The builder is composed of one small reader per part of the file, each in its module:
``builder`` (top-level keys and sessions), ``params`` (``[params]`` and the ``:name``
check), ``steps``, ``expect`` (expectations and checks), ``retry`` (retry loops),
``variants`` (``[fix.step.X]``, ``[[fix.step]]``, ``[[fix.insert]]``, ``fix.drop``),
over ``reader`` (typed values) and ``locator`` (lines).

The format is documented, with a complete example, in docs/guide/writing-a-scenario.md.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from pgrace.errors import ScenarioError
from pgrace.frontends import limits
from pgrace.frontends.scenario_toml.builder import Builder
from pgrace.frontends.scenario_toml.locator import Locator
from pgrace.model.scenario import Scenario

__all__ = ["Builder", "Locator", "parse_toml_scenario", "read_toml_scenario"]


def read_toml_scenario(path: Path, params: dict[str, str] | None = None) -> Scenario:
    """Read and validate a scenario file; ``params`` override its ``[params]`` defaults."""
    return parse_toml_scenario(limits.read_text(path), str(path), params or {})


def parse_toml_scenario(text: str, source: str, params: dict[str, str] | None = None) -> Scenario:
    limits.check_toml(text, source)
    locator = Locator(text, source)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        match = re.search(r"\(at line (\d+), column \d+\)$", message)
        line = int(match.group(1)) if match else max(1, len(text.splitlines()))  # "at end of document"
        message = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)$", "", message)
        raise ScenarioError(f"invalid TOML: {message}", source, line) from None
    except RecursionError:  # limits.check_toml keeps nesting far below this; never a traceback
        raise ScenarioError(f"nested too deeply ({limits.LIMITS_TEXT})", source, 1) from None
    nul = limits.nul_in(data)
    if nul is not None:  # libpq would silently cut the SQL there
        raise locator.error("NUL character (\\u0000) in a string", *nul)
    return Builder(data, locator, params or {}).build()
