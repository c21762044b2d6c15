"""The documentation the tests hold to the code: the README and every page of the site in docs/."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    """The README first, then the site's pages in path order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def page(name: str) -> str:
    """One page's Markdown, by its path under docs/ (``"guide/load.md"``)."""
    return (DOCS / name).read_text(encoding="utf-8")


def everything() -> str:
    """All of it, for a fact that must be stated somewhere."""
    return "\n".join(path.read_text(encoding="utf-8") for path in pages())
