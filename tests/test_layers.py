"""pgrace's modules and packages import each other without a cycle, lazy imports included.

A function-level import only postpones a cycle to the moment the function runs, so the
graph is read from every import in each module's AST (tools/import_graph.py).
"""

from __future__ import annotations

from pathlib import Path

from tools.import_graph import build, collapse, cycles, unit_of


def test_no_module_imports_itself_back_through_others() -> None:
    assert cycles(build(type_checking=False)) == []


def test_no_package_imports_itself_back_through_others() -> None:
    """Types named for the type checker alone included, as import-linter's layers count them."""
    assert cycles(collapse(build(), unit_of)) == []


def test_a_function_level_import_closes_a_cycle(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("def f():\n    from pkg.high import g\n    return g\n")
    (package / "high.py").write_text("from pkg import low\n")
    (package / "typed.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import high\n")
    graph = build(tmp_path, "pkg", type_checking=False)
    assert cycles(graph) == [["pkg.high", "pkg.low"]]
    assert "pkg.high" not in graph["pkg.typed"]  # an import for the type checker never runs
    assert "pkg.high" in build(tmp_path, "pkg")["pkg.typed"]  # but it names a type its readers must know


def test_import_linter_counts_the_type_checkers_imports_too() -> None:
    """A type a module names under ``if TYPE_CHECKING:`` is one its readers must know: it is held to the layers."""
    import tomllib

    config = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert config["exclude_type_checking_imports"] is False


MAX_MODULE_LINES = 600


def test_no_module_is_too_long_to_read() -> None:
    """A module is read whole; past this size it holds more than one idea (cut it at its seams).

    A function's size and branching are ruff's (C901, PLR0915 in pyproject.toml); a class
    is as long as its methods need.
    """
    too_long = []
    for path in sorted(Path(__file__).parent.parent.joinpath("pgrace").rglob("*.py")):
        if (lines := path.read_text().count("\n")) > MAX_MODULE_LINES:
            too_long.append(f"{path.name}: {lines} lines")
    assert too_long == []


def test_the_layers_contract_holds() -> None:
    """import-linter's layers (pyproject.toml): cli over api over drivers over render over engine, and so down;
    in the CLI, the console entry over the commands over what they share and the terminal UI."""
    import subprocess
    import sys

    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint)], capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "4 kept, 0 broken" in done.stdout  # the layers of pgrace and of its CLI, and the engine's two
