"""Every command is a library function: a Python caller reaches what the CLI does, and gets what it draws.

Each test calls ``pgrace.<command>`` without the CLI and renders the result through the
format table, then checks it is what the command prints: the command is that call plus
the rendering, nothing more.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import pgrace
from pgrace.cli import main
from pgrace.cli.exits import exit_code_of_interrupt
from pgrace.drivers.searches import Exhaustive, Reduced
from pgrace.errors import Interrupted, OptionError, ScenarioError, Terminated
from pgrace.frontends import catalog
from pgrace.render import formats
from pgrace.render.text import Style
from pgrace.render.views import View
from pgrace.servers import BACKENDS, ServerInfo

LOST_UPDATE_P4 = "examples/hermitage/lost-update-p4.toml"
COMMANDS = [
    "check",
    "clean",
    "compare",
    "explore",
    "from_log",
    "list_scenarios",
    "load",
    "matrix",
    "run",
    "show",
    "sweep",
]
DEADLOCK_LOG = "examples/from-log/deadlock.log"


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code in (0, 1), result.output
    return result.stdout


def test_the_commands_and_read_scenario_are_the_packages_functions() -> None:
    assert set(COMMANDS) | {"read_scenario"} <= set(pgrace.__all__)
    for name in [*COMMANDS, "read_scenario"]:
        function = getattr(pgrace, name)
        assert callable(function) and function.__doc__, name
        assert function.__module__ == "pgrace.api", name


def test_the_drivers_modules_live_apart_from_the_functions_of_their_names() -> None:
    import pgrace.drivers.explore
    import pgrace.drivers.matrix
    import pgrace.drivers.sweep

    assert (pgrace.explore.__module__, pgrace.sweep.__module__, pgrace.matrix.__module__) == ("pgrace.api",) * 3
    assert pgrace.drivers.explore.explore.__module__ == "pgrace.drivers.explore"


def test_load_scenario_reads_a_file_and_load_is_pgbench(tmp_path: Path) -> None:
    scenario = pgrace.read_scenario("lost-update")
    assert (scenario.name, scenario.variants) == ("lost-update", ("bug", "fix"))
    done = pgrace.load(scenario, compare=True, emit=tmp_path)  # nothing runs, no server
    assert done.series == [] and {"lost-update.bug.pgbench.sql", "lost-update.fix.pgbench.sql"} <= {
        p.name for p in done.emitted
    }


def test_load_checks_its_options_as_the_command_does() -> None:
    scenario = pgrace.read_scenario("lost-update")
    with pytest.raises(OptionError, match="client counts are whole numbers from 1 to 1000") as caught:
        pgrace.load(scenario, clients=[0, 2])
    assert caught.value.parameter == "clients" and str(caught.value).startswith("clients: ")
    with pytest.raises(OptionError, match=r"a whole number of seconds from 1 to 86400, not 1\.5") as caught:
        pgrace.load(scenario, duration=1.5)
    assert caught.value.parameter == "duration"
    with pytest.raises(OptionError, match="duration and transactions exclude each other"):
        pgrace.load(scenario, duration=3, transactions=10)


def test_compare_returns_the_bug_then_the_fix_as_run_compare_draws_them(pgrace_server: ServerInfo) -> None:
    runs = pgrace.compare(pgrace.read_scenario("lost-update"), dsn=pgrace_server.dsn)  # the server as --dsn names it
    assert [r.scenario.variant for r in runs] == ["bug", "fix"]
    drawn = formats.render("compare", "text", runs, View(Style(colour=False, width=120)))
    assert drawn == cli("run", "lost-update", "--compare", "--width", "120", "--dsn", pgrace_server.dsn)


def test_compare_of_a_scenario_with_one_variant_is_invalid_input() -> None:
    with pytest.raises(ScenarioError, match="one variant only"):
        pgrace.compare(pgrace.read_scenario("crash-mid-transaction"), dsn="host=/nowhere")


def test_explore_returns_the_classes_and_the_examples_it_replayed(pgrace_server: ServerInfo) -> None:
    scenario = pgrace.read_scenario("lost-update")
    found = pgrace.explore(scenario, dsn=pgrace_server.dsn, examples=[1])
    assert found.explored == found.space and list(found.examples) == [1]
    assert formats.render("explore", "json", found) == cli(
        "explore", "lost-update", "-f", "json", "--dsn", pgrace_server.dsn
    )
    timeline = formats.render("run", "text", found.examples[1], View(Style(colour=False, width=120)))
    assert timeline == cli("explore", "lost-update", "--show", "1", "--dsn", pgrace_server.dsn)


def test_explore_merges_shards_without_a_server(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    scenario = pgrace.read_scenario("lost-update")
    whole = pgrace.explore(scenario, server=pgrace_server, search=Exhaustive())
    for reduce in (False, True):
        shards = []
        for k in (1, 2):
            part = pgrace.explore(
                scenario, server=pgrace_server, shard=(k, 2), search=Reduced() if reduce else Exhaustive()
            )
            shards.append(tmp_path / f"{k}.json")
            shards[-1].write_text(formats.render("explore", "json", part), encoding="utf-8")
        merged = pgrace.explore(scenario, dsn="host=/nowhere", merge=shards)
        if not reduce:  # every interleaving run once, by one shard or the other
            said, whole_said = merged.to_dict(), whole.to_dict()
            assert (said.pop("shard"), whole_said.pop("shard")) == (
                {"n": 2, "held": [1, 2], "missing": []},
                {"n": 1, "held": [1], "missing": []},
            )
            assert said == whole_said
        assert merged.covers_all and sorted(c.key for c in merged.classes) == sorted(c.key for c in whole.classes)


def test_sweep_returns_one_grid_per_scenario(pgrace_server: ServerInfo) -> None:
    levels = ["read-committed", "serializable"]
    swept = pgrace.sweep([LOST_UPDATE_P4], {"level": levels}, server=pgrace_server)
    [grid] = swept.grids
    assert [cell.params for cell in grid.cells] == [{"level": level} for level in levels]
    assert [cell.verdict for cell in grid.cells] == ["occurs", "prevented by 40001"]
    args = ["sweep", LOST_UPDATE_P4, "-p", "level=read-committed,serializable", "-f", "json"]
    assert json.loads(formats.render("sweep", "json", swept)) == json.loads(cli(*args, "--dsn", pgrace_server.dsn))


def test_matrix_measures_what_the_command_prints(pgrace_server: ServerInfo) -> None:
    measured = pgrace.matrix(server=pgrace_server)
    assert not measured.row.disagreements and not measured.table.disagreements
    assert formats.render("matrix", "json", measured) == cli("matrix", "-f", "json", "--dsn", pgrace_server.dsn)


def test_check_runs_files_on_each_server_and_reports_each_result(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    shipped = catalog.shipped_dir()
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n", encoding="utf-8")
    seen: list[str] = []
    invalid: list[str] = []
    checked = pgrace.check(
        [str(shipped / "lost-update.toml"), str(bad)],
        servers=[pgrace_server.dsn],
        on_result=lambda result: seen.append(result.case.name),
        on_invalid=lambda error: invalid.append(str(error.file)),
        junit=tmp_path / "junit.xml",
    )
    assert seen == ["lost-update (bug)", "lost-update (fix)"] and checked.failed == 0
    written = ET.parse(tmp_path / "junit.xml").getroot()  # by the library, as `check --junit` has it
    assert [case.get("name") for case in written.iter("testcase")] == ["invalid file", *seen]
    assert invalid == [str(bad)] and [s.version for s in checked.servers] == [pgrace_server.version]


def test_clean_says_what_it_removed(pgrace_server: ServerInfo) -> None:
    cleaned = pgrace.clean(pgrace_server.dsn)
    assert cleaned.skipped == []
    assert cli("clean", "--dsn", pgrace_server.dsn).endswith(f" leftovers removed from {cleaned.server}\n")


def test_list_filtering_is_the_catalogues_and_its_errors_name_the_option() -> None:
    assert {e.name for e in catalog.select(["deadlock"])} == {e.name for e in catalog.entries() if "deadlock" in e.tags}
    with pytest.raises(OptionError) as caught:
        catalog.select(["deadlok"])
    assert caught.value.parameter == "tags" and "did you mean" in caught.value.message
    result = CliRunner().invoke(main, ["list", "--tag", "deadlok"])
    assert result.exit_code == 2
    assert result.stderr.startswith("pgrace: list: Invalid value for --tag: no shipped scenario has tag 'deadlok'")


def test_every_format_in_the_table_is_a_function_and_each_format_option_reads_the_table() -> None:
    import importlib

    for (kind, name), where in formats.FORMATS.items():
        module, _, function = where.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), (kind, name)
    for command, kind in [("run", "run"), ("matrix", "matrix"), ("sweep", "sweep"), ("load", "load"), ("list", "list")]:
        [option] = [p for p in main.commands[command].params if p.name == "fmt"]
        assert isinstance(option.type, click.Choice)
        assert tuple(option.type.choices) == formats.names(kind), command


def test_every_server_backend_in_the_table_is_a_function() -> None:
    import importlib

    for prefix, where in BACKENDS.items():
        module, _, function = where.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), prefix


def test_list_and_show_are_the_packages_functions_the_commands_draw() -> None:
    chosen = pgrace.list_scenarios(["deadlock"])
    assert chosen and all("deadlock" in entry.tags for entry in chosen)
    assert formats.render("list", "text", chosen) == cli("list", "--tag", "deadlock")
    from pgrace.render.listing import render_show

    shown = pgrace.show("lost-update", variant="fix")
    assert (shown.scenario.variant, shown.variant.variant) == ("bug", "fix")
    assert render_show(shown) == cli("show", "lost-update", "--fix")


def test_from_log_is_the_packages_function_and_its_errors_name_its_parameters() -> None:
    from pgrace.render.from_log import incident_list

    found = pgrace.from_log([DEADLOCK_LOG], list_only=True)
    assert len(found.incidents) == 1
    assert "\n".join(incident_list(found)) + "\n" == cli("from-log", DEADLOCK_LOG, "--list")
    with pytest.raises(OptionError) as caught:
        pgrace.from_log([DEADLOCK_LOG], incident=2, verify=False)
    assert (caught.value.parameter, caught.value.message) == ("incident", "2: the logs hold 1 incident(s)")
    said = CliRunner().invoke(main, ["from-log", DEADLOCK_LOG, "--incident", "2", "--no-verify"])
    assert said.exit_code == 2
    assert said.stderr == (
        "pgrace: from-log: Invalid value for --incident: 2: the logs hold 1 incident(s) (see pgrace from-log --help)\n"
    )


@pytest.mark.parametrize(("stop", "code"), [(KeyboardInterrupt, 130), (Terminated, 143)])
def test_an_interrupted_load_declares_what_it_measured(
    pgrace_server: ServerInfo, stop: type[KeyboardInterrupt], code: int
) -> None:
    """Ctrl-C (or SIGTERM) after the first client count: the counts measured are the error's ``partial``."""

    def interrupt(result: object, run: object) -> None:
        raise stop()

    with pytest.raises(Interrupted) as caught:
        pgrace.load(
            pgrace.read_scenario("lost-update"),
            clients=[1, 2],
            transactions=1,
            server=pgrace_server,
            on_measured=interrupt,
        )
    [measured] = caught.value.partial.series
    assert measured.interrupted and [run.clients for run in measured.runs] == [1]
    assert isinstance(caught.value.by, stop) and exit_code_of_interrupt(caught.value) == code
