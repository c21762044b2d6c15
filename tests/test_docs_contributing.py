"""docs/contributing.md maps every package of pgrace to its tests, and names none that is gone.

The map is the table under "Where the tests are": a package is named by its folder
(`` `pgrace/engine/observe/` ``), a test by its module (`` `test_runner.py` ``). A package
added, moved or removed, or a test module renamed, fails here until the page says so.
"""

from __future__ import annotations

import re

from documentation import ROOT, page

PACKAGE = re.compile(r"`(pgrace/(?:[a-z_]+/)*)`")
TEST = re.compile(r"`(test_\w+\.py)`")


def the_map() -> str:
    text = page("contributing.md")
    start = text.index("## Where the tests are")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def folders() -> set[str]:
    """Every folder of the package that holds Python or its data (``pgrace/scenarios/``), as ``pgrace/a/b/``."""
    return {
        f"{path.relative_to(ROOT).as_posix()}/"
        for path in [ROOT / "pgrace", *(ROOT / "pgrace").rglob("*")]
        if path.is_dir() and path.name != "__pycache__" and any(path.glob("*.*"))
    }


def test_every_package_is_on_the_map() -> None:
    named = set(PACKAGE.findall(the_map()))
    assert not folders() - named, f"not on the map in docs/contributing.md: {sorted(folders() - named)}"
    assert not named - folders(), f"the map names folders that do not exist: {sorted(named - folders())}"


def test_every_test_the_map_names_exists() -> None:
    named = set(TEST.findall(the_map()))
    assert named, "the map names no test"
    missing = sorted(name for name in named if not (ROOT / "tests" / name).is_file())
    assert not missing, f"docs/contributing.md names tests that do not exist: {missing}"
