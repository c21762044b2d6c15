"""`pgrace check`: scenario files as regression checks, on one server or several.

A *case* is one thing that passes or fails: one variant of a pgrace scenario (its
expectations, and with ``golden`` its text timeline against ``NAME.VARIANT.out``), or
one isolation spec (its isolationtester output against the expected file, as
``pg_regress`` compares). Cases are prepared (parsed, expected files found) before any
server starts, so invalid input fails fast with exit code 2.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from pgrace.drivers import speccheck
from pgrace.drivers.one_run import run_in_scratch
from pgrace.drivers.searches import REDUCED, Sample, SearchMode, fitted
from pgrace.engine.options import RunOptions
from pgrace.errors import OptionError, ScenarioError, ScenarioFailed
from pgrace.frontends import catalog
from pgrace.model.cases import Case as Case
from pgrace.model.cases import CaseVerdict
from pgrace.model.cases import differs_across_servers as differs_across_servers
from pgrace.model.timeline import Run
from pgrace.render.text import Style, render_text
from pgrace.scratch import ReusableScratch
from pgrace.servers import ServerInfo

if TYPE_CHECKING:
    from pgrace.model.exploration import Exploration

GOLDEN_STYLE = Style(colour=False, width=120, show_server=False, until_server_chose=True)


def check_exec_options(
    commands: Sequence[str], cases: Sequence[Case], explore: SearchMode | None, jobs: int, database_name: str | None
) -> None:
    """What ``check`` does not do with commands (``commands``, or a case's ``[exec]``): ``jobs`` processes, a named
    database."""
    if not commands and not any(case.scenario.commands for case in cases):
        return
    from pgrace.drivers.exec import parse_exec

    if commands:
        parse_exec(commands)
    given = [
        name
        for name, value in (
            ("jobs", jobs != 1),
            ("database_name", database_name is not None),
        )
        if value
    ]
    if given:
        raise OptionError(
            "not with commands (given, or a file's [exec]), whose runs go through one proxy over a scratch database of"
            " their own",
            given[0],
        )


def golden_path(path: Path, variant: str) -> Path:
    return path.with_name(f"{path.stem}.{variant}.out")


def prepare(
    paths: Sequence[str],
    golden: bool = False,
    expected: Path | None = None,
    invalid: list[ScenarioError] | None = None,
    params: dict[str, str] | None = None,
    exec_commands: bool = False,
) -> list[Case]:
    """Every case under ``paths``, before anything runs (``params``: each pgrace scenario's, as ``-p`` sets them;
    ``exec_commands``: the cases' sessions are commands, which an isolation spec cannot take).

    An invalid file raises its ScenarioError; with ``invalid`` given, it is added there
    instead and the other files' cases are still returned (one bad file in a directory of
    a team's scenarios must not hide how the others behave).
    """
    files = catalog.find_files(list(paths))
    if not files:
        raise ScenarioError(f"no scenario files (.toml, .spec) under {', '.join(paths)}")
    if expected is not None and len(files) != 1:
        raise OptionError("needs exactly one spec file", "expected")
    cases: list[Case] = []
    for path in files:
        try:
            if exec_commands and path.suffix == ".spec":
                raise ScenarioError("an isolation spec runs its own steps; commands run a scenario (.toml)", str(path))
            cases.extend(_cases_of(path, golden, expected, params))
        except ScenarioError as exc:
            if invalid is None:
                raise
            invalid.append(exc)
    return cases


def _cases_of(path: Path, golden: bool, expected: Path | None, params: dict[str, str] | None) -> list[Case]:
    if path.suffix == ".spec":
        prepared = speccheck.prepare_check(path, expected)
        return [Case(path, prepared.scenario, spec=prepared)]
    scenario = catalog.read_scenario(str(path), params)
    return [
        Case(
            path,
            scenario.variant_named(variant),
            golden_path(path, variant) if golden else None,
            paired=len(scenario.variants) > 1,
        )
        for variant in scenario.variants
    ]


def run_case(
    case: Case,
    server: ServerInfo,
    options: RunOptions | None = None,
    update: bool = False,
    database_name: str | None = None,
    scratch: ReusableScratch | None = None,
    commands: Sequence[str] = (),
) -> CaseVerdict:
    """Run one case on one server and judge it (``database_name``: the scratch database's exact name).

    Specs run in ``scratch`` when given: one database for all of them, as pg_regress does.
    With ``commands`` (``NAME=COMMAND``), they are the case's sessions, through pgrace's proxy,
    and the variant's final checks judge what they did.
    """
    started = time.perf_counter()
    try:
        if case.spec is not None:  # isolationtester prints no row locks: skip reading them
            spec_options = replace(options or RunOptions(), track_row_locks=False)
            checked = speccheck.run_check(case.spec, server, spec_options, database_name, scratch)
            problems = [] if checked.passed else [_first_difference(checked.comparison)]
            return CaseVerdict(
                case, server, checked.passed, checked.seconds, problems, checked.comparison.diff, checked.run
            )
        if commands or case.scenario.commands:
            from pgrace.drivers.exec import run_commands

            step_timeout = (options or RunOptions()).step_timeout
            run = run_commands(case.scenario, commands, server, step_timeout=step_timeout)
        else:
            named = database_name if scratch is None else None  # the specs' shared database holds that name
            run = run_in_scratch(case.scenario, server, options, database_name=named)
    except ScenarioFailed as failed:  # this case could not run to its end on this server: it fails, the others go on
        recorded = failed.run if isinstance(failed.run, Run) else None
        return CaseVerdict(case, server, False, time.perf_counter() - started, [failed.message], run=recorded)
    result = CaseVerdict(case, server, run.ok, 0.0, run=run)
    for check in run.checks:
        if not check.ok:
            where = f"line {check.line}: " if check.line else ""
            result.problems.append(f"{where}{check.description}: expected {check.expected}, got {check.actual}")
    if case.golden is not None:
        _compare_golden(case.golden, render_text(run, GOLDEN_STYLE), result, update)
    result.seconds = time.perf_counter() - started
    return result


def _compare_golden(path: Path, text: str, result: CaseVerdict, update: bool) -> None:
    if update:
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            result.updated = True
        return
    if not path.is_file():
        result.ok = False
        result.problems.append(f"no golden timeline {path} (run with --update to write it)")
        return
    comparison = speccheck.compare_output(text, [path], actual_name=f"{path} (this run)")
    if not comparison.passed:
        result.ok = False
        result.problems.append(f"timeline differs from {path}: {_first_difference(comparison)}")
        result.diff = comparison.diff


def _first_difference(comparison: speccheck.Comparison) -> str:
    difference = comparison.first_difference
    return difference.describe() if difference is not None else f"differs from {comparison.closest}"


def run_explore_case(
    case: Case,
    server: ServerInfo,
    options: RunOptions | None = None,
    search: SearchMode = REDUCED,
    jobs: int = 1,
    on_progress: Callable[[int, int], None] | None = None,
    commands: Sequence[str] = (),
) -> CaseVerdict:
    """`pgrace check --explore`: judge a variant over its interleavings, not only the file's order.

    The variant's claim (:func:`pgrace.model.outcomes.claim_of`) decides. The bug of a bug
    and a fix (or a scenario whose checks are all bug signatures) passes when some
    interleaving reproduces it with no error the scenario does not declare; anything else
    when no interleaving shows the bug (a failed invariant, a held signature) or raises
    such an error. A failure names the class and its example. Specs run as without
    exploring. ``on_progress(done, total)`` follows the interleavings.

    A bounded ``search`` (K and D at most what the case's steps allow, where they mean every
    schedule): the result's ``guarantee`` then says what it covered, and a pass is never a
    proof over every interleaving.

    With ``commands``, the orders searched are those of the statements the commands send
    (:func:`pgrace.drivers.exec.explore_exec`, bounded as asked); a search that could not cover
    them all, or a bound not met, proves no cure, so a claim of no bug then fails with the reason.
    """
    if case.spec is not None:
        return run_case(case, server, options)
    from pgrace.drivers.explore import explore

    started = time.perf_counter()
    step_timeout = (options or RunOptions()).step_timeout
    if commands or case.scenario.commands:
        from pgrace.drivers.exec import commands_for, explore_exec

        searched = explore_exec(
            case.scenario,
            commands_for(case.scenario, commands),
            server,
            step_timeout=step_timeout,
            search=search,
        )
        problems = judged(case, searched)
        bound = searched.bound
        if searched.claim == "bug":
            pass
        elif bound is not None and not bound.met:
            problems.append(f"the search did not meet its bound ({bound.words(searched.space)}): no claim")
        elif not isinstance(search, Sample) and bound is None and not searched.covers_all:
            problems.append(f"the search did not cover every order ({searched.incomplete}): no proof it holds in all")
        elif searched.incomplete is not None:
            problems.append(f"the sample is not of the orders its runs sent ({searched.incomplete}): no claim")
        guarantee = "" if bound is None else bound.words(searched.space)
        return CaseVerdict(case, server, not problems, time.perf_counter() - started, problems, guarantee=guarantee)
    found = explore(
        case.scenario,
        server,
        search=fitted(search, len(case.scenario.steps)),
        jobs=jobs,
        step_timeout=step_timeout,
        on_progress=on_progress,
    )
    guarantee = "" if found.bound is None else found.bound.words(found.space)
    problems = judged(case, found)
    return CaseVerdict(case, server, not problems, time.perf_counter() - started, problems, guarantee=guarantee)


def judged(case: Case, found: Exploration) -> list[str]:
    """What fails the case's claim over the exploration's classes, each with its class and example."""
    from pgrace.render.outcomes import example_text

    explored = f"{found.explored} of {found.space}" if found.explored < found.space else f"{found.space}"
    if found.reduced:  # a class counts runs, one per set of equivalent interleavings
        explored = f"{found.run_count} runs over all {found.space}" if found.covers_all else f"{found.run_count} runs"
    if found.bound is not None:  # the bound's words go on the case's line
        explored = f"{found.run_count} runs of {found.space}"
    problems = []
    classes = found.classes
    if found.claim == "bug":
        if not found.ok:
            tainted = [(n, c) for n, c in enumerate(classes, 1) if c.reproduces]
            number, first = tainted[0] if tainted else (1, classes[0])
            said = "only with an error no step declares" if tainted else "in no interleaving"
            example = example_text(case.scenario, first.example)
            problems.append(
                f"the bug happens {said} ({explored} interleavings, {len(classes)} outcome classes); "
                f"class {number} ({first.count}): {first.summary}; example: {example}"
            )
    else:
        for number, cls in enumerate(classes, 1):
            if cls.breaks:
                problems.append(
                    f"class {number} of {len(classes)} ({cls.count} of {explored} interleavings): {cls.summary}; "
                    f"example: {example_text(case.scenario, cls.example)}"
                )
    return problems
