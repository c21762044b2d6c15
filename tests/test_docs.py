"""The documentation site: every command and option of the CLI is in its reference, and it builds.

The reference page (docs/reference/commands.md) holds a ``<!-- help: pgrace CMD -->`` line
per command, which the site's build replaces with that command's ``--help``
(tools/mkdocs_hooks.py). So a command is documented when its line is there, and an
option when its help says what it does.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from documentation import README, ROOT, page

import pgrace
from pgrace.cli import main
from tools.mkdocs_hooks import HELP, with_help


def commands(
    command: click.Command = main, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command of the CLI, the group itself first, walking click's tree."""
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            if not sub.hidden:
                yield from commands(sub, (*path, name))


def test_every_command_has_its_help_in_the_reference() -> None:
    documented = {tuple(m["args"].split()) for m in HELP.finditer(page("reference/commands.md"))}
    existing = {path for path, _ in commands()}
    assert not existing - documented, f"undocumented in docs/reference/commands.md: {sorted(existing - documented)}"
    assert not documented - existing, (
        f"docs/reference/commands.md names no such command: {sorted(documented - existing)}"
    )


@pytest.mark.parametrize("path", [" ".join(path) or "(pgrace)" for path, _ in commands()])
def test_every_option_says_what_it_does(path: str) -> None:
    command = dict((" ".join(p) or "(pgrace)", c) for p, c in commands())[path]
    for option in command.params:
        if isinstance(option, click.Option):
            assert not option.hidden, f"pgrace {path}: {option.opts} is hidden from the reference"
            assert option.help, (
                f"pgrace {path}: {'/'.join(option.opts)} has no help, so the reference says nothing of it"
            )


def test_a_help_line_becomes_the_commands_help() -> None:
    expected = CliRunner().invoke(main, ["explore", "--help"], prog_name="pgrace", terminal_width=80).stdout
    assert (
        with_help("a\n<!-- help: pgrace explore -->\nb")
        == f"a\n<!-- help: pgrace explore -->\n```text\n{expected}```\nb"
    )
    assert expected.startswith("Usage: pgrace explore [OPTIONS] SCENARIO")
    with pytest.raises(ValueError, match="pgrace nosuch"):
        with_help("<!-- help: pgrace nosuch -->")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `make docs` builds it (mkdocs build --strict), once for this module's tests."""
    mkdocs = Path(sys.executable).parent / "mkdocs"
    assert mkdocs.exists() or shutil.which("mkdocs"), "mkdocs is a dev dependency: pip install -e '.[dev]'"
    built = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [str(mkdocs) if mkdocs.exists() else "mkdocs", "build", "--strict", "--site-dir", str(built)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return built


def test_the_site_builds_strictly_and_loads_nothing_from_elsewhere(site: Path) -> None:
    """What `make docs` runs: a broken link or anchor, a page left out of the nav or a failing hook is an error.

    The pages load no font, script or picture from another host (the theme's fonts are off),
    so the site reads offline; links out (Hermitage, the theme's credit) are only links.
    """
    built = (site / "reference" / "commands" / "index.html").read_text(encoding="utf-8")
    assert "Usage: pgrace run [OPTIONS] SCENARIO" in built
    for html in site.rglob("*.html"):
        loaded = re.findall(r"""(?:src|<link[^>]*href)=["'](https?://[^"']+)""", html.read_text(encoding="utf-8"))
        assert not loaded, f"{html.relative_to(site)} loads {loaded}"


API_ENTRY = re.compile(r"^::: pgrace\.(?P<name>\w+)$", re.MULTILINE)


def test_the_api_reference_names_every_public_name_once() -> None:
    """docs/reference/api.md holds one ``::: pgrace.NAME`` per name of ``pgrace.__all__``, and no other."""
    listed = [m["name"] for m in API_ENTRY.finditer(page("reference/api.md"))]
    assert len(listed) == len(set(listed)), f"listed twice: {sorted({n for n in listed if listed.count(n) > 1})}"
    assert not set(pgrace.__all__) - set(listed), (
        f"missing from docs/reference/api.md: {sorted(set(pgrace.__all__) - set(listed))}"
    )
    assert not set(listed) - set(pgrace.__all__), f"not in pgrace.__all__: {sorted(set(listed) - set(pgrace.__all__))}"


def test_every_public_name_has_a_docstring_of_its_own() -> None:
    """As the reference reads them (griffe, statically): a dataclass's generated ``Session(name, ...)`` is none."""
    import griffe

    package = griffe.load("pgrace", search_paths=[str(ROOT)])
    bare = [name for name in pgrace.__all__ if not package[name].docstring]
    assert not bare, f"no docstring, so the reference says nothing of them: {bare}"


def test_the_api_reference_draws_every_public_name(site: Path) -> None:
    """Each name has its section (its anchor is ``pgrace.NAME``), and no docstring shows reST roles raw."""
    built = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    drawn = set(re.findall(r'id="pgrace\.(\w+)"', built))
    assert not set(pgrace.__all__) - drawn, f"no section on the built page: {sorted(set(pgrace.__all__) - drawn)}"
    raw = sorted(set(re.findall(r":(?:func|meth|class|mod|attr|data|exc|obj):<code>[^<]*</code>", built)))
    assert not raw, f"reST roles render as text in Markdown; write ``name`` instead: {raw}"


def test_the_readme_is_the_entrance_and_its_links_lead_somewhere() -> None:
    """The README stays short (the guides live in docs/), and each file it links to exists."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert "docs/quickstart.md" in links and "docs/reference/commands.md" in links
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert not missing, f"the README links to files that do not exist: {missing}"
