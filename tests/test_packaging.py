"""pgrace as a package people depend on: a wheel with its scenarios, its types, its licence, one version.

The wheel is built from this checkout and installed into a fresh virtualenv, outside the
checkout, so what a user of ``pip install pgrace`` gets is what is tested: the shipped
scenarios are found inside the installed package, not in a ``scenarios/`` nearby.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import pgrace
from pgrace.formats import catalog

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("pgrace-*.whl")
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
    assert pgrace.__version__ == importlib.metadata.version("pgrace")


def test_the_wheel_carries_scenarios_types_and_licence(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {Path(n).name for n in names if n.startswith("pgrace/scenarios/")}
    assert shipped == {p.name for p in catalog.shipped_dir().iterdir()}
    assert "lost-update.toml" in shipped and "lost-update.bug.out" in shipped
    assert "pgrace/py.typed" in names
    assert f"pgrace-{pgrace.__version__}.dist-info/licenses/LICENSE" in names


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
            "import pgrace, pgrace.formats.catalog as c; print(pgrace.__file__, pgrace.__version__, c.shipped_dir(), len(c.shipped_names()))",
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
