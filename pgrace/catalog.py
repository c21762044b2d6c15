"""Find scenarios: the shipped ones by name, or a user's ``.toml`` / ``.spec`` file."""

from __future__ import annotations

from pathlib import Path

from pgrace.errors import ScenarioError
from pgrace.formats import limits
from pgrace.formats.scenario_toml import did_you_mean, load_toml_scenario
from pgrace.model import Scenario

SUFFIXES = (".toml", ".spec")


def shipped_dir() -> Path:
    """Installed wheels carry the scenarios inside the package; a checkout has them at the top."""
    packaged = Path(__file__).parent / "scenarios"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent / "scenarios"


def shipped_names() -> list[str]:
    folder = shipped_dir()
    return sorted(p.stem for p in folder.glob("*.toml")) if folder.is_dir() else []


def looks_like_path(ref: str) -> bool:
    return ref.endswith(SUFFIXES) or "/" in ref or Path(ref).exists()


def load(ref: str, params: dict[str, str] | None = None) -> Scenario:
    """A shipped scenario's name, or a path to a scenario or spec file."""
    if not looks_like_path(ref):
        names = shipped_names()
        if ref not in names:
            known = ", ".join(names)
            raise ScenarioError(f"no shipped scenario {ref!r}{did_you_mean(ref, names)}; shipped: {known}")
        return load_toml_scenario(shipped_dir() / f"{ref}.toml", params)
    path = Path(ref)
    if not path.is_file():
        raise ScenarioError("no such scenario file", ref)
    if path.suffix == ".spec":
        from pgrace.formats.spec import parse_spec

        if params:
            raise ScenarioError("--param applies to pgrace scenario files, not .spec files", ref)
        return parse_spec(limits.read_text(path), ref)
    return load_toml_scenario(path, params)


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
