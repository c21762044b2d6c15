"""pgrace as a package people depend on: a wheel with its scenarios, its types, its licence, one version.

The wheel is built from this checkout and installed into a fresh virtualenv, outside the
checkout, so what a user of ``pip install pgrace-cli`` gets is what is tested: the shipped
scenarios are found inside the installed package, not in a ``scenarios/`` nearby.

On the package index the distribution is ``pgrace-cli``: ``pgrace`` there is an unrelated project,
so an install line that names it would install a stranger's code. The command and the import are ``pgrace``.
"""

from __future__ import annotations

import email.parser
import importlib.metadata
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import pgrace
from pgrace.frontends import catalog

ROOT = Path(__file__).resolve().parents[1]

DISTRIBUTION = "pgrace-cli"
"""pgrace's name on the package index (the command and the import package are ``pgrace``)."""

WHEEL_STEM = DISTRIBUTION.replace("-", "_")
"""How a wheel's file name and its .dist-info folder spell the distribution (PEP 427)."""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (built,) = out.glob(f"{WHEEL_STEM}-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtualenv with the wheel in it; its dependencies are borrowed from this one (no download)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # A plain path line: this environment's packages, after the wheel's own; the .pth files
    # there (this checkout's editable install) are not read, so pgrace comes from the wheel.
    (site / "borrowed-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    yield venv


def test_the_version_is_written_once() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and project["dynamic"] == ["version"]
    assert project["name"] == DISTRIBUTION
    assert pgrace.__version__ == importlib.metadata.version(DISTRIBUTION)


def test_the_wheel_carries_scenarios_types_and_licence(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {Path(n).name for n in names if n.startswith("pgrace/scenarios/")}
    assert shipped == {p.name for p in catalog.shipped_dir().iterdir()}
    assert "lost-update.toml" in shipped and "lost-update.bug.out" in shipped
    assert "pgrace/py.typed" in names
    assert f"{WHEEL_STEM}-{pgrace.__version__}.dist-info/licenses/LICENSE" in names


def test_the_wheel_is_named_for_the_package_index_and_installs_pgrace(wheel: Path) -> None:
    assert wheel.name.startswith(f"{WHEEL_STEM}-{pgrace.__version__}-")
    archive = zipfile.ZipFile(wheel)
    info = f"{WHEEL_STEM}-{pgrace.__version__}.dist-info"
    metadata = email.parser.Parser().parsestr(archive.read(f"{info}/METADATA").decode())
    assert metadata["Name"] == DISTRIBUTION
    assert set(metadata.get_all("Provides-Extra") or ()) >= {"docker", "sqlalchemy"}
    entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert "pgrace = pgrace.cli.entry:main" in entry_points
    assert {n.split("/")[0] for n in archive.namelist() if not n.startswith(info)} == {"pgrace"}


#: The files a user copies an install line from: the README, the docs, the examples, and pgrace's own hints.
INSTALL_TEXTS = sorted(
    [
        ROOT / "README.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "examples").rglob("*"),
        *(ROOT / "pgrace").rglob("*.py"),
    ]
)

#: `pip install ARGS` (also `python -m pip`, `pipx`), up to the end of the line, a backquote or a shell separator.
PIP_INSTALL = re.compile(r"\b(?:pip|pipx)\s+install\s+([^`\n;&|)]*)")

#: A requirement's name, before its extras or version: what the package index looks up.
REQUIREMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def install_lines() -> list[tuple[str, list[str]]]:
    """Each `pip install` in INSTALL_TEXTS as (file:line, the names it asks the package index for)."""
    found = []
    for path in INSTALL_TEXTS:
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in PIP_INSTALL.finditer(line):
                names = []
                for word in match.group(1).split():
                    word = word.strip("'\"")
                    if word.startswith(("-", ".", "/")) or (name := REQUIREMENT_NAME.match(word)) is None:
                        continue  # an option, or a path: nothing the package index is asked for
                    names.append(name.group(0).lower().replace("_", "-"))
                found.append((f"{path.relative_to(ROOT)}:{number}", names))
    return found


def test_every_install_line_names_pgraces_distribution_never_the_strangers() -> None:
    lines = install_lines()
    wrong = [(where, names) for where, names in lines if "pgrace" in names]
    assert wrong == [], "these install lines name `pgrace`, an unrelated project on the package index"
    assert sum(DISTRIBUTION in names for _, names in lines) >= 4, lines  # the docs do install pgrace somewhere
    # An extra is written with the distribution's name too, in prose as in a command.
    extras = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in INSTALL_TEXTS
        if path.is_file()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if re.search(r"(?<![\w.-])pgrace\[", line)
    ]
    assert extras == [], "these lines name an extra of `pgrace`, not of `pgrace-cli`"


def test_a_checkout_links_its_scenarios_to_the_package() -> None:
    assert (ROOT / "scenarios").is_symlink()
    assert (ROOT / "scenarios").resolve() == catalog.shipped_dir().resolve() == ROOT / "pgrace" / "scenarios"


@pytest.mark.server
def test_an_installed_wheel_finds_its_scenarios_away_from_any_checkout(installed: Path, tmp_path: Path) -> None:
    python = installed / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PGRACE_DSN")}
    where = subprocess.run(
        [
            python,
            "-c",
            "import pgrace, pgrace.frontends.catalog as c; print(pgrace.__file__, pgrace.__version__, c.shipped_dir(), len(c.shipped_names()))",
        ],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert where[0].startswith(str(installed)), where
    assert where[1] == pgrace.__version__
    assert Path(where[2]) == Path(where[0]).parent / "scenarios"
    assert int(where[3]) == len(catalog.shipped_names())
    listing = subprocess.run(
        [installed / "bin" / "pgrace", "list"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert listing.returncode == 0, listing.stderr
    assert "lost-update" in listing.stdout
    run = subprocess.run(
        [installed / "bin" / "pgrace", "run", "nowait"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert "verdict: ✔" in run.stdout


def test_the_main_help_names_the_environment_and_shell_completion() -> None:
    from click.testing import CliRunner

    from pgrace.cli import main

    text = CliRunner().invoke(main, ["--help"]).output
    assert "PGRACE_DSN" in text
    assert 'eval "$(_PGRACE_COMPLETE=bash_source pgrace)"' in text
    reading_it = [
        name for name, command in main.commands.items() if any(p.envvar == "PGRACE_DSN" for p in command.params)
    ]
    assert {"run", "check", "clean"} <= set(reading_it)
    for name in reading_it:
        assert "[env var: PGRACE_DSN" in CliRunner().invoke(main, [name, "--help"], terminal_width=200).output, name


def test_bash_completion_offers_the_shipped_scenarios_then_files(tmp_path: Path) -> None:
    env = {**os.environ, "COMP_WORDS": "pgrace run lost", "COMP_CWORD": "2", "_PGRACE_COMPLETE": "bash_complete"}
    out = subprocess.run([sys.executable, "-m", "pgrace"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert out.stdout.splitlines() == ["plain,lost-update", "file,lost"], out.stderr
