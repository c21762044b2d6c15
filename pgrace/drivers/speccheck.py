"""Check a scenario file's output against an expected file, as ``pg_regress`` does.

Shared by ``pgrace check`` and ``bench/conformance.py`` so both find expected files,
accept alternatives and report differences the same way:

* the expected file of ``dir/NAME.spec`` is ``dir/NAME.out`` or, as PostgreSQL's tree
  lays them out, ``dir/../expected/NAME.out`` (or a file given explicitly);
* ``NAME_0.out`` … ``NAME_9.out`` are alternatives: matching any one of them passes;
* the comparison is byte for byte (trailing spaces count); on a mismatch the unified
  diff is against the alternative with the fewest differing lines.

Checking is split in two so that invalid input (a malformed file, a missing expected
file) is reported before any server is started: :func:`prepare_check`, then
:func:`run_check`.
"""

from __future__ import annotations

import contextlib
import difflib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pgrace.drivers.one_run import run_in
from pgrace.engine.options import RunOptions
from pgrace.errors import ScenarioError, SetupFailed
from pgrace.model.cases import PreparedCheck
from pgrace.model.timeline import Run
from pgrace.scratch import ReusableScratch, scratch_database
from pgrace.servers import ServerInfo

ALTERNATIVES = 10  # pg_regress tries NAME_0 … NAME_9
DIFF_CONTEXT = 3  # pg_regress's pretty diff is ``diff -U3``


# -- expected files ----------------------------------------------------------------------


def alternatives(primary: Path) -> list[Path]:
    """``NAME.out`` then ``NAME_0.out`` … ``NAME_9.out`` (the suffix goes before the last dot)."""
    return [primary] + [primary.with_name(f"{primary.stem}_{i}{primary.suffix}") for i in range(ALTERNATIVES)]


def expected_files(source: Path, expected: Path | None = None, suffix: str = ".out") -> tuple[Path, ...]:
    """The existing expected files for ``source``, the primary one first.

    Without ``expected``: next to the source, else in ``../expected/`` (PostgreSQL's
    layout). Raises :class:`ScenarioError` when neither place has any candidate.
    """
    if expected is not None:
        candidates = [alternatives(expected)]
    else:
        name = source.stem + suffix
        candidates = [alternatives(source.parent / name), alternatives(source.parent.parent / "expected" / name)]
    for group in candidates:
        found = tuple(path for path in group if path.is_file())
        if found:
            return found
    looked = " or ".join(str(group[0]) for group in candidates)
    raise ScenarioError(f"no expected output file (looked for {looked})", str(source))


# -- comparison --------------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    """The first line that differs (1-based); None on a side means that side had ended."""

    line: int
    expected: str | None
    actual: str | None

    def describe(self) -> str:
        def show(text: str | None) -> str:
            return "end of file" if text is None else repr(text)

        return f"line {self.line}: expected {show(self.expected)}, got {show(self.actual)}"


@dataclass(frozen=True)
class Comparison:
    """The verdict against a set of alternatives; ``diff`` is empty when one matched."""

    matched: Path | None
    closest: Path
    diff: str = ""
    first_difference: Difference | None = None

    @property
    def passed(self) -> bool:
        return self.matched is not None


def _lines(data: bytes) -> list[str]:
    return data.decode("utf-8", "replace").splitlines(keepends=True)


def first_difference(expected: bytes, actual: bytes) -> Difference | None:
    """Where two outputs part ways, line by line (None when they are equal)."""
    if expected == actual:
        return None
    want, got = _lines(expected), _lines(actual)
    for index in range(max(len(want), len(got))):
        a = want[index] if index < len(want) else None
        b = got[index] if index < len(got) else None
        if a != b:
            if _chomp(a) == _chomp(b):  # only the final newline differs: show it
                return Difference(index + 1, a, b)
            return Difference(index + 1, _chomp(a), _chomp(b))
    return Difference(len(want) + 1, None, None)  # unreachable unless decoding merged bytes


def _chomp(line: str | None) -> str | None:
    return None if line is None else line.removesuffix("\n")


def unified_diff(expected: bytes, actual: bytes, expected_name: str, actual_name: str) -> str:
    """``diff -U3 expected actual``; a last line without a newline is marked as diff does."""
    lines = difflib.unified_diff(_lines(expected), _lines(actual), expected_name, actual_name, n=DIFF_CONTEXT)
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def compare_output(actual: str, files: Sequence[Path], actual_name: str = "actual") -> Comparison:
    """Byte-exact comparison with each alternative, in order; diff against the closest."""
    if not files:
        raise ValueError("no expected files to compare with")
    got = actual.encode("utf-8")
    best: tuple[int, Path, str, bytes] | None = None
    for path in files:
        want = path.read_bytes()
        if want == got:
            return Comparison(matched=path, closest=path)
        diff = unified_diff(want, got, str(path), actual_name)
        size = diff.count("\n")
        if best is None or size < best[0]:
            best = (size, path, diff, want)
    assert best is not None
    _, path, diff, want = best
    return Comparison(matched=None, closest=path, diff=diff, first_difference=first_difference(want, got))


# -- checking a file ---------------------------------------------------------------------


@dataclass(frozen=True)
class CheckedFile:
    """The outcome of one check: the run, what it rendered, the verdict, the wall time."""

    prepared: PreparedCheck
    run: Run
    output: str
    comparison: Comparison
    seconds: float

    @property
    def passed(self) -> bool:
        return self.comparison.passed


def _prepare_spec(path: Path, expected: Path | None) -> PreparedCheck:
    from pgrace.frontends.catalog import read_scenario
    from pgrace.render.isolation import render_isolation

    scenario = read_scenario(str(path))
    return PreparedCheck(path, scenario, expected_files(path, expected), render_isolation)


# One preparer per file kind that is checked against an expected output file. pgrace's
# own .toml scenarios carry their expectations inside (see pgrace.drivers.check).
PREPARERS: dict[str, Callable[[Path, Path | None], PreparedCheck]] = {
    ".spec": _prepare_spec,
}


def prepare_check(path: Path, expected: Path | None = None) -> PreparedCheck:
    """Parse ``path`` and find its expected output; invalid input raises ScenarioError."""
    preparer = PREPARERS.get(path.suffix)
    if preparer is None:
        kinds = ", ".join(sorted(PREPARERS))
        raise ScenarioError(f"cannot check a {path.suffix or 'suffix-less'} file (known: {kinds})", str(path))
    if not path.is_file():
        raise ScenarioError("no such file", str(path))
    return preparer(path, expected)


def run_check(
    prepared: PreparedCheck,
    server: ServerInfo,
    options: RunOptions | None = None,
    database_name: str | None = None,
    scratch: ReusableScratch | None = None,
) -> CheckedFile:
    """Run the scenario in a fresh scratch database, render it, compare with the expected files.

    With ``scratch``, run in that database instead (as pg_regress runs every spec in one),
    and reset it afterwards if the run left anything behind.
    """
    started = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            if scratch is not None:
                stack.callback(scratch.reset_if_dirty)
                db = scratch.database
            else:
                db = stack.enter_context(scratch_database(server, prepared.name, database_name=database_name))
            run = run_in(prepared.scenario, server, db, options)
    except SetupFailed as exc:  # isolationtester prints the run up to the failure: that is the output to compare
        if not isinstance(exc.run, Run):
            raise
        run = exc.run
    output = prepared.render(run)
    seconds = time.perf_counter() - started
    comparison = compare_output(output, prepared.expected, actual_name=f"{prepared.path} (pgrace)")
    return CheckedFile(prepared, run, output, comparison, seconds)
