"""Import only what a command needs: a short `pgrace run` is dominated by imports otherwise.

Checked on ``sys.modules`` of a fresh interpreter, never on time (this machine is shared
and noisy; bench/differential.py --speed measures the time).
"""

from __future__ import annotations

import json
import subprocess
import sys

from pgrace.servers import ServerInfo

# Heavy or format-specific modules that importing the CLI must not pull in.
NOT_AT_IMPORT = (
    "psycopg",
    "asyncio",
    "tabulate",
    "decimal",
    "pgrace.api",
    "pgrace.engine.libpq.runner",
    "pgrace.engine.observe.locks",
    "pgrace.scratch",
    "pgrace.servers",
    "pgrace.render.text",
    "pgrace.render.json",
    "pgrace.cli.terminal.presenter",
    "pgrace.render.html",
    "pgrace.render.svg",
    "pgrace.render.isolation",
)

# What a JSON run never needs: the other renderers and the presenter.
NOT_FOR_JSON = (
    "pgrace.render.text",
    "pgrace.cli.terminal.presenter",
    "pgrace.render.html",
    "pgrace.render.svg",
    "pgrace.render.mermaid",
    "pgrace.render.markdown",
    "pgrace.render.isolation",
    "pgrace.drivers.check",
)


def modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code`` (printed at exit as JSON)."""
    script = (
        "import atexit, json, sys\n"
        "atexit.register(lambda: print('\\nMODULES ' + json.dumps(sorted(sys.modules))))\n" + code
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    line = next(line for line in done.stdout.splitlines() if line.startswith("MODULES "))
    return set(json.loads(line.removeprefix("MODULES ")))


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_importing_the_cli_imports_no_driver_runner_or_renderer() -> None:
    assert loaded(modules_after("import pgrace.cli"), NOT_AT_IMPORT) == []


def test_the_console_entry_imports_only_what_it_needs_before_it_answers_signals() -> None:
    """The entry lives in the CLI's package: importing that package must not import click or the commands."""
    assert {m for m in modules_after("import pgrace.cli.entry") if m.split(".")[0] in ("pgrace", "click")} == {
        "pgrace",
        "pgrace.cli",
        "pgrace.cli.entry",
        "pgrace.cli.exits",
        "pgrace.errors",
    }


def test_the_packages_the_console_entry_lives_in_import_nothing_before_it_runs() -> None:
    """Until the entry's first lines run, Ctrl-C is Python's: typing (re, enum) there widens that window."""
    assert {m for m in modules_after("import pgrace.cli") if m.split(".")[0] in ("pgrace", "typing", "importlib")} == {
        "pgrace",
        "pgrace.cli",
    }


def test_importing_the_package_is_light_too() -> None:
    assert loaded(modules_after("import pgrace"), NOT_AT_IMPORT) == []


def test_a_json_run_imports_no_other_renderer(pgrace_server: ServerInfo) -> None:
    code = (
        "import sys\n"
        "from pgrace.cli import main\n"
        f"sys.argv = ['pgrace', 'run', 'nowait', '--format', 'json', '--dsn', {pgrace_server.dsn!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
    )
    modules = modules_after(code)
    assert "pgrace.render.json" in modules  # it did run
    assert loaded(modules, NOT_FOR_JSON) == []


def test_the_pytest_plugin_imports_nothing_of_pgrace_until_a_fixture_is_used() -> None:
    """pytest loads the plugin in every session of every project that installs pgrace, used or not."""
    modules = modules_after("import pytest\nimport pgrace.pytest_plugin\n")
    baseline = modules_after("import pytest\n")
    pulled = sorted(modules - baseline)
    assert pulled == ["pgrace", "pgrace.pytest_plugin"], pulled
