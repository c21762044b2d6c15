"""The library entry points: everything the CLI does, a Python caller can do.

Each function is one command of the CLI (same name; ``load`` is the pgbench driver) and
returns what that command's formats draw (:mod:`pgrace.render.formats`). A function that
opens its own server (from ``dsn``, what ``--server`` takes) tidies it as the CLI does:
``on_note`` hears what was mended and which leftovers of killed runs were dropped. A
``server`` given is the caller's and is used as it is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pgrace.servers  # its open_server looked up at each call: a test may stand in for it
from pgrace import bounds
from pgrace.drivers.bounded import check_bounded_jobs
from pgrace.drivers.one_run import run_in_scratch
from pgrace.drivers.one_run import teardown_failures as teardown_failures  # what `run` says after a run
from pgrace.drivers.searches import REDUCED, SearchMode
from pgrace.engine.options import RunOptions
from pgrace.errors import ExecError, Interrupted, OptionError, PgraceError, ScenarioError
from pgrace.files import read_input, refuse_overwriting_inputs, write_output
from pgrace.frontends import catalog
from pgrace.model.cases import CaseVerdict, Checked
from pgrace.model.load import ClientRun, Loaded, LoadSeries
from pgrace.model.monitor import Monitor, Note, Unwatched, following, note_long
from pgrace.model.results import Cleaned, Shown
from pgrace.model.scenario import Scenario
from pgrace.model.sweep import Sweep
from pgrace.model.timeline import Run
from pgrace.scratch import sweep_leftovers
from pgrace.servers import ServerInfo
from pgrace.text import visible

if TYPE_CHECKING:
    from pgrace.frontends.catalog import Entry
    from pgrace.model.exploration import Exploration
    from pgrace.model.fromlog import FromLog
    from pgrace.model.matrix import Matrix
    from pgrace.model.minimized import Minimized


def run(
    scenario: Scenario,
    *,
    dsn: str | None = None,
    server: ServerInfo | None = None,
    options: RunOptions | None = None,
    allow_scratch_schema: bool = False,
    database_name: str | None = None,
) -> Run:
    """Run one scenario variant in a scratch database and evaluate its expectations.

    Give ``server`` to reuse a server across runs; otherwise one is opened from ``dsn``
    (or ``PGRACE_DSN``, or the embedded PostgreSQL) and closed afterwards. Without the
    CREATEDB privilege, ``allow_scratch_schema`` runs in a throwaway schema instead.
    ``database_name`` names the scratch database exactly (it must not exist yet).
    """
    if server is None:
        with pgrace.servers.open_server(dsn) as opened:
            return run(
                scenario,
                server=opened,
                options=options,
                allow_scratch_schema=allow_scratch_schema,
                database_name=database_name,
            )
    return run_in_scratch(scenario, server, options, allow_scratch_schema, database_name)


# -- what the commands do, for a Python caller too ---------------------------------------------


def _ignore(*_: object) -> None:
    pass


def read_scenario(ref: str, params: dict[str, str] | None = None) -> Scenario:
    """A shipped scenario's name, or a path to a ``.toml`` scenario or an isolation ``.spec`` file, read.

    ``params`` set the file's parameters. The file's first variant is returned; ``.other``
    (and ``Scenario.variant_named``) hold the other one.
    """
    return catalog.read_scenario(ref, params)


def list_scenarios(tags: Sequence[str] = (), topic: str | None = None) -> list[Entry]:
    """The shipped scenarios with every one of ``tags`` and of ``topic``, in the catalogue's order.

    A tag or topic no shipped scenario has is an ``OptionError`` (with a "did you mean").
    """
    return catalog.select(list(tags), topic)


def show(ref: str, params: dict[str, str] | None = None, variant: str | None = None) -> Shown:
    """``ref`` read (as ``read_scenario`` reads it), and its ``variant`` ("bug", "fix"; None: the file's first).

    What ``pgrace show`` tells without running it: the story, the sessions, the steps, the checks.
    """
    scenario = catalog.read_scenario(ref, params)
    return Shown(scenario, catalog.variant(scenario, variant))


def tidy(server: ServerInfo, on_note: Note | None = None) -> None:
    """Say what was mended to start ``server``; drop what killed runs left on it, and say so.

    The drivers tidy each server they open; a failure here never stops a run.
    """
    say = on_note or _ignore
    for note in server.notes:
        say(f"note: {visible(note)}")
    if server.fresh:  # started for this command a moment ago: nothing to sweep, no connection to spend
        return
    with suppress(PgraceError):
        swept = sweep_leftovers(server)
        for name in swept.removed:
            say(f"removed {name}, left behind by a killed pgrace run")
        for note in swept.skipped:
            say(note)


@contextmanager
def _serving(
    server: ServerInfo | None,
    dsn: str | None,
    superuser: bool,
    on_note: Note | None,
    settings: dict[str, str] | None = None,
) -> Iterator[ServerInfo]:
    """The caller's server as it is, or one opened (and tidied) from ``dsn`` for the call."""
    if server is not None:
        yield server
        return
    with pgrace.servers.open_server(dsn, superuser, settings) as opened:
        tidy(opened, on_note)
        yield opened


def compare(
    scenario: Scenario,
    *,
    dsn: str | None = None,
    server: ServerInfo | None = None,
    superuser: bool = False,
    options: RunOptions | None = None,
    allow_scratch_schema: bool = False,
    on_note: Note | None = None,
) -> list[Run]:
    """Run the bug, then the fix, on one server: the runs side by side.

    ``scenario`` is as ``read_scenario`` reads it: its first variant, holding the other.
    """
    variants = catalog.both_variants(scenario)
    with _serving(server, dsn, superuser, on_note) as opened:
        return [run(v, server=opened, options=options, allow_scratch_schema=allow_scratch_schema) for v in variants]


def explore(
    scenario: Scenario,
    *,
    dsn: str | None = None,
    server: ServerInfo | None = None,
    superuser: bool = False,
    search: SearchMode = REDUCED,
    shard: tuple[int, int] = (1, 1),
    jobs: int = 1,
    step_timeout: float = 10.0,
    examples: Iterable[int] | Literal["all"] = (),
    merge: Sequence[str | Path] = (),
    monitor: Monitor | None = None,
    on_note: Note | None = None,
    minimize: bool = False,
) -> Exploration:
    """Run the interleavings of ``scenario``'s steps that ``search`` chooses and group the outcomes.

    ``search`` (``pgrace.drivers.searches``): ``Reduced()``, one run of each set of
    equivalent interleavings (the default); ``Exhaustive()``, every interleaving;
    ``Sample(size, seed)``; ``PreemptionBounded(K)``, every schedule with at most K
    preemptions; ``Pct(D, runs, seed)``, PCT schedules of depth D (100 of them unless ``runs``
    says). The exploration's ``guarantee`` says which of these its classes carry. ``examples``:
    class numbers (from 1; "all": every class) whose example is replayed as a fully observed
    run. ``merge``: the JSON files of shards, merged instead of running. ``minimize``: the first
    class that fails (the bug happened, or an error no step declares) has its example shrunk
    to the smallest scenario that fails the same way (``minimized``; see ``minimize``).
    """
    # Names from the module: the package's own ``pgrace.drivers.explore`` is this function.
    from pgrace.drivers.explore import explore as explore_space
    from pgrace.drivers.explore import reduces, replay, same_class
    from pgrace.drivers.shards import merge_explorations, read_explorations
    from pgrace.model.orders.space import Space

    space = Space(scenario)
    if merge and minimize:
        raise OptionError(
            "merged shards have no server to minimize on: minimize a class of the merged result instead", "minimize"
        )
    if merge:
        texts = [(str(name), read_input(name)) for name in merge]
        return merge_explorations(read_explorations(texts, space), scenario)
    from pgrace.drivers.bounded import check_bounds
    from pgrace.drivers.searches import Pct, PreemptionBounded, Reduced, Sample, runs_asked

    bounds.check_sample(runs_asked(search), "search")  # before a server starts
    check_bounds(space, search, shard, jobs)
    watch = monitor or Unwatched()
    label = f"{scenario.name} ({scenario.variant})"

    # A preemption-bounded search's runs are learnt as it goes, as a reduced search's.
    reduced = isinstance(search, PreemptionBounded) or (
        isinstance(search, Reduced | Sample)
        and (not isinstance(search, Sample) or search.reduce)
        and reduces(scenario, space, runs_asked(search), shard, jobs)
    )

    def explored(done: int, total: int) -> None:
        if reduced:  # the runs still to come are learnt as it goes: say the ones known
            if done == 0:
                watch.start(label, 0, "runs")
            elif total == done:  # the search is over: the total is known at last
                watch.start(label, total, "runs")
            watch.update(done, f"at least {total - done:,} more" if total > done else "")
            return
        if done == 0:
            note_long(watch, label, total, jobs)
            watch.start(label, total, "runs" if isinstance(search, Pct) else "interleavings")
        watch.update(done)

    with _serving(server, dsn, superuser, on_note) as opened:
        try:
            found = explore_space(
                scenario,
                opened,
                search=search,
                shard=shard,
                jobs=jobs,
                step_timeout=step_timeout,
                on_progress=explored,
            )
        finally:
            watch.close()
        wanted = range(1, len(found.classes) + 1) if examples == "all" else examples
        for n in wanted:
            if 1 <= n <= len(found.classes):
                found.examples[n] = replay(scenario, opened, found.classes[n - 1], step_timeout)
                if not same_class(found.examples[n], found.classes[n - 1]):
                    found.replayed_differently.append(n)
        if minimize:
            from pgrace.drivers.minimize import minimize as shrink

            found.asked_to_minimize = True
            failing = next((n for n, c in enumerate(found.classes, 1) if c.breaks), None)
            if failing is not None:
                found.minimized_class = failing
                example = tuple(found.classes[failing - 1].example)
                found.minimized = shrink(scenario, opened, example, step_timeout=step_timeout)
    return found


def minimize(
    scenario: Scenario,
    *,
    dsn: str | None = None,
    server: ServerInfo | None = None,
    superuser: bool = False,
    cls: int | None = None,
    order: Sequence[str] | None = None,
    output: str | Path | None = None,
    spec: str | Path | None = None,
    pytest: str | Path | None = None,
    step_timeout: float = 10.0,
    repeats: int | None = None,
    on_note: Note | None = None,
) -> Minimized:
    """Shrink a failing run of ``scenario`` to the smallest scenario that fails the same way.

    The run: class ``cls`` of its exploration (numbered from 1), the steps in ``order``, or
    the file's own order. ``output``, ``spec``, ``pytest``: paths to write the minimized
    scenario (TOML), an isolation spec (and its ``.out`` beside it) and a pytest test (it
    needs ``output``) to, each verified on the server first. ``repeats``: runs per
    candidate (by default 1, or 5 when the failure may hang on timing or chance).
    """
    from pgrace.drivers.minimize import failing_order
    from pgrace.drivers.minimize import minimize as shrink
    from pgrace.drivers.minimize.export import export

    if pytest is not None and output is None:
        raise OptionError("a pytest test runs the minimized scenario: give its output too", "pytest")
    with _serving(server, dsn, superuser, on_note) as opened:
        start = failing_order(scenario, opened, cls, tuple(order) if order is not None else None, step_timeout)
        found = shrink(scenario, opened, start, step_timeout=step_timeout, repeats=repeats)
        export(found, opened, _path(output), _path(spec), _path(pytest), step_timeout)
    return found


def sweep(
    scenarios: Sequence[str],
    params: Mapping[str, Sequence[str]],
    *,
    variant: str | None = None,
    explore: SearchMode | None = None,
    jobs: int = 1,
    step_timeout: float = 10.0,
    examples: bool = False,
    output: str | Path | None = None,
    dsn: str | None = None,
    server: ServerInfo | None = None,
    superuser: bool = False,
    monitor: Monitor | None = None,
    on_note: Note | None = None,
) -> Sweep:
    """Run each scenario (a shipped name or a file) under every combination of ``params``' values: a grid each.

    ``explore``: the search each combination is explored with, as ``pgrace.explore`` runs it
    (None: each runs its file's order once).
    ``examples``: each class's example replayed as a run. ``output``: a file the caller
    will write, refused before anything runs when it is one of the scenario files.
    """
    from pgrace.drivers.explore import replay
    from pgrace.drivers.sweep import interleavings, variants  # the module's: the package's drivers.sweep is this
    from pgrace.drivers.sweep import sweep as sweep_grid

    check_bounded_jobs(explore, jobs)
    grid = {name: list(values) for name, values in params.items()}
    combinations = math.prod(len(values) for values in grid.values()) * len(scenarios)
    bounds.check_combinations(combinations)
    watch = monitor or Unwatched()
    if combinations > bounds.LONG_COMBINATIONS:
        watch.note(f"pgrace: {combinations:,} combinations to run")
    # Every combination is read once, up front: invalid input fails before a server starts.
    variant_lists = [variants(ref, grid, variant) for ref in scenarios]
    refuse_overwriting_inputs(output, [scenario.source for chosen in variant_lists for _, scenario in chosen])
    if explore is not None:
        note_long(watch, "sweep", sum(interleavings(c, explore) for c in variant_lists), jobs)
    result = Sweep()
    with _serving(server, dsn, superuser, on_note) as opened:
        try:
            watch.start("sweep", combinations, "combinations")
            for chosen in variant_lists:
                before = sum(len(c) for c in variant_lists[: len(result.grids)])

                def combination_done(done: int, total: int, before: int = before) -> None:
                    watch.update(before + done)

                def interleaved(done: int, total: int) -> None:
                    watch.update(watch.done, f"{done:,}/{total:,} interleavings")

                result.grids.append(
                    sweep_grid(
                        chosen,
                        grid,
                        opened,
                        explore=explore,
                        jobs=jobs,
                        step_timeout=step_timeout,
                        on_cell=combination_done,
                        on_interleavings=interleaved,
                    )
                )
        finally:
            watch.close()
        if examples:
            for i, (chosen, swept) in enumerate(zip(variant_lists, result.grids, strict=True)):
                for j, ((_, scenario), cell) in enumerate(zip(chosen, swept.cells, strict=True)):
                    for k, cls in enumerate(cell.classes):
                        result.examples[(i, j, k)] = replay(scenario, opened, cls, step_timeout)
    return result


def matrix(
    *,
    dsn: str | None = None,
    server: ServerInfo | None = None,
    superuser: bool = False,
    step_timeout: float = 10.0,
    on_note: Note | None = None,
) -> Matrix:
    """Measure the row-lock and table-lock conflict tables on a server, next to the manual's."""
    from pgrace.drivers.matrix import measure

    with _serving(server, dsn, superuser, on_note) as opened:
        return measure(opened, step_timeout=step_timeout)


def check(
    paths: Sequence[str | Path] = (),
    *,
    servers: Sequence[str | None] = (None,),
    superuser: bool = False,
    golden: bool = False,
    update: bool = False,
    expected: Path | None = None,
    junit: str | Path | None = None,
    step_timeout: float = 10.0,
    database_name: str | None = None,
    explore: SearchMode | None = None,
    jobs: int = 1,
    params: Mapping[str, str] | None = None,
    commands: Sequence[str] = (),
    monitor: Monitor | None = None,
    on_invalid: Callable[[ScenarioError], None] | None = None,
    on_result: Callable[[CaseVerdict], None] | None = None,
    on_note: Note | None = None,
) -> Checked:
    """Run scenario files and specs (files or directories) as regression checks, on each server in turn.

    ``paths`` default to ``scenarios/`` here, else the shipped scenarios. ``servers``: what
    ``--server`` takes, each (None: ``PGRACE_DSN`` or the embedded server); they boot side by
    side while the files are read. A file that cannot be read is reported to ``on_invalid``
    and the others still run; each result goes to ``on_result`` as it is known. ``junit``:
    a file to write every case to as JUnit XML once all ran (refused, before anything runs,
    when it is one of the inputs). Specs share one scratch database per server, reset only
    when a spec leaves objects. ``params``: every pgrace scenario's parameters. ``explore``:
    the search each pgrace scenario is judged over, as in ``pgrace.explore`` (None: its file's
    order); a bounded one's ``guarantee`` says what it covered. ``commands`` (``NAME=COMMAND``): each
    case's sessions instead of its steps (docs/guide/any-language.md); a case they leave unproved goes
    to ``on_invalid``.
    """
    from pgrace.drivers import check as regression
    from pgrace.scratch import reusable_scratch_database
    from pgrace.servers import booting_server

    if not paths:  # scenarios/ here, else the shipped ones (an installed wheel carries them)
        paths = ("scenarios",) if Path("scenarios").is_dir() else (str(catalog.shipped_dir()),)
    names = [str(path) for path in paths]
    options = RunOptions(step_timeout=step_timeout)
    check_bounded_jobs(explore, jobs)
    regression.check_exec_options(commands, (), explore, jobs, database_name)
    watch = monitor or Unwatched()
    checked = Checked()
    with ExitStack() as stack:
        # pgrace's own servers boot, side by side, while the files are read.
        booting = [stack.enter_context(booting_server(t, superuser)) for t in (servers or [None])]
        cases = regression.prepare(
            names, golden or update, expected, checked.invalid, dict(params or {}), bool(commands)
        )
        refuse_overwriting_inputs(junit, [case.path for case in cases] + ([expected] if expected else []), "junit")
        regression.check_exec_options(commands, cases, explore, jobs, database_name)
        for error in checked.invalid:  # reported at once; the valid files still run
            (on_invalid or _ignore)(error)
        if checked.invalid and not cases:  # nothing to run: no server is needed to say so
            raise ScenarioError(f"no valid scenario files under {', '.join(names)}")
        checked.servers = [ready() for ready in booting]
        stack.callback(watch.close)
        watch.start("check", len(cases) * len(checked.servers), "cases")
        for server in checked.servers:
            tidy(server, on_note)
            scratch = None
            if explore is None and any(case.spec is not None for case in cases):
                scratch = stack.enter_context(reusable_scratch_database(server, "check", database_name))
            for case in cases:
                try:
                    if explore is not None:
                        progress = following(watch, case.name, checked.verdicts, jobs)
                        result = regression.run_explore_case(case, server, options, explore, jobs, progress, commands)
                    else:
                        result = regression.run_case(case, server, options, update, database_name, scratch, commands)
                except ExecError as error:  # no proof from this case: reported as invalid input, the others go on
                    checked.invalid.append(error)
                    (on_invalid or _ignore)(error)
                else:
                    checked.verdicts.append(result)
                    (on_result or _ignore)(result)
                watch.update(len(checked.verdicts))
        watch.close()
    if junit is not None:
        from pgrace.render.junit import render_junit

        write_output(junit, render_junit(checked.verdicts, checked.invalid))
    return checked


def _path(name: str | Path | None) -> Path | None:
    return None if name is None else Path(name)


def load(
    scenario: Scenario,
    *,
    compare: bool = False,
    clients: Sequence[int] = (1, 2, 4, 8),
    duration: float | None = None,
    transactions: int | None = None,
    pgbench: str | None = None,
    emit: Path | None = None,
    dsn: str | None = None,
    server: ServerInfo | None = None,
    setup_timeout: float | None = None,
    monitor: Monitor | None = None,
    on_measured: Callable[[LoadSeries, ClientRun], None] | None = None,
    on_note: Note | None = None,
) -> Loaded:
    """Run ``scenario``'s ``[load]`` transaction with pgbench at each client count; count what went wrong.

    ``compare``: the bug's, then the fix's. ``clients``: the client counts, one pgbench run
    each. ``duration`` whole seconds per count (5 by default), or ``transactions`` per
    client. ``setup_timeout`` whole seconds (60 by default) bound each setup statement and
    each check. A server pgrace starts for the call (no ``server``,
    ``dsn`` embedded or a bin directory) is started with room for the most clients asked
    for, and ``on_note`` says so; a server pgrace only connects to must have that room
    already. With ``emit``, the pgbench script and the setup and check SQL are written to
    that folder and nothing runs. Ctrl-C (or SIGTERM) raises ``Interrupted``
    whose ``partial`` is the ``Loaded`` measured so far, once everything is cleaned up.
    """
    from pgrace.drivers import load as engine

    options = engine.LoadOptions.asked(clients, duration, transactions, setup_timeout, pgbench, on_measured)
    variants = catalog.both_variants(scenario) if compare else [scenario]
    for variant in variants:
        engine.pgbench_script(variant)  # invalid input (no [load], a stray :name) fails before a server starts
    if emit is not None:
        return Loaded(emitted=[path for variant in variants for path in engine.emit(variant, emit)])
    watch = monitor or Unwatched()
    loaded = Loaded()
    settings = None
    if server is None and pgrace.servers.starts_its_own(dsn):
        settings = {"max_connections": str(engine.connections_for(max(options.clients)))}
        if int(settings["max_connections"]) > engine.DEFAULT_CONNECTIONS:
            (on_note or _ignore)(
                f"note: starting PostgreSQL with max_connections = {settings['max_connections']}"
                f" for {max(options.clients)} clients"
            )
    try:
        with _serving(server, dsn, False, on_note, settings) as opened:
            try:
                watch.start(f"load {scenario.name}", len(variants) * len(options.clients), "client counts")
                for variant in variants:
                    loaded.series.append(engine.run_load(variant, opened, options))
            finally:
                watch.close()
    except KeyboardInterrupt as exc:
        if isinstance(exc, Interrupted):  # a variant part-measured
            loaded.series.append(exc.partial)
        raise Interrupted(loaded, exc) from exc
    return loaded


def from_log(
    paths: Sequence[str | Path],
    *,
    prefix: str | None = None,
    dsn: str | None = None,
    incident: int | None = None,
    list_only: bool = False,
    verify: bool = True,
    server: ServerInfo | None = None,
    server_target: str | None = None,
    step_timeout: float = 10.0,
    minimize: bool = False,
) -> FromLog:
    """Read server logs; write the scenario of incident number ``incident`` (from 1; the first by default).

    ``prefix``: the server's ``log_line_prefix`` (detected by default). ``dsn``: the incident's
    database, read only, for the tables' DDL and rows. ``list_only``: the incidents found,
    nothing written. ``verify``: run the scenario in a scratch database on ``server`` (or one
    opened from ``server_target``: pgrace's own embedded PostgreSQL by default, never the
    incident's server) and say whether the incident came back. ``minimize``: once it came
    back, shrink the scenario to the smallest one that still brings it back.
    """
    from pgrace.drivers.fromlog import from_log as read_incidents  # the package's from_log is this function

    return read_incidents(
        [str(path) for path in paths],
        prefix=prefix,
        dsn=dsn,
        incident=incident,
        list_only=list_only,
        verify=verify,
        server=server,
        server_target=server_target,
        step_timeout=step_timeout,
        minimize=minimize,
    )


def clean(dsn: str) -> Cleaned:
    """Remove the scratch databases and schemas killed pgrace runs left on a server, and their work folders."""
    from pgrace.drivers.load import sweep_work_dirs

    with pgrace.servers.open_server(dsn) as server:
        swept = sweep_leftovers(server)
    return Cleaned(server.label, swept.removed, sweep_work_dirs(), swept.skipped)
