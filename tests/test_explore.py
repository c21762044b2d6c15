"""pgrace explore and check --explore: every interleaving, classified, on a real server."""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from helpers import steps_scenario

from pgrace.cli import main
from pgrace.drivers import check as regression
from pgrace.drivers.explore import explore
from pgrace.drivers.exploring import choose
from pgrace.drivers.searches import Exhaustive, Sample
from pgrace.drivers.shards import merge_explorations
from pgrace.engine.libpq.runner import run_scenario
from pgrace.engine.options import RunOptions
from pgrace.errors import ScenarioError
from pgrace.frontends import catalog
from pgrace.model.orders.space import Space
from pgrace.model.outcomes import classify, split_run
from pgrace.model.scenario import FinalCheck, PermutationStep, Scenario
from pgrace.model.timeline import StepCancelled
from pgrace.scratch import scratch_database
from pgrace.servers import ServerInfo

HERE = Path(__file__).parent
HALF_CURE = HERE / "explore" / "half-cure.toml"


# -- the space: counted, numbered, constrained (no server) ----------------------------------


def test_space_of_two_sessions_of_four_steps_is_70_and_numbering_round_trips() -> None:
    space = Space(catalog.read_scenario("lost-update"))
    assert space.size == 70 == math.comb(8, 4)
    orders = [space.unrank(i) for i in range(space.size)]
    assert len(set(orders)) == 70
    assert [space.rank(o) for o in orders] == list(range(70))
    for order in orders:  # each session keeps its own order
        for chain in space.chains:
            assert [n for n in order if n in chain] == list(chain)


def test_space_of_three_sessions_is_the_multinomial() -> None:
    scenario = catalog.read_scenario("skip-locked-fanout")  # three workers of three steps
    assert Space(scenario).size == math.factorial(9) // math.factorial(3) ** 3 == 1680


def test_a_step_using_another_sessions_capture_runs_after_it() -> None:
    scenario = steps_scenario(
        [("a1", "a", "SELECT 1 AS x"), ("a2", "a", "SELECT 2"), ("b1", "b", "SELECT :a.v"), ("b2", "b", "SELECT 3")],
        captures={"a1": "v"},
    )
    space = Space(scenario)
    orders = [space.unrank(i) for i in range(space.size)]
    assert all(o.index("a1") < o.index("b1") for o in orders)
    assert space.size == 6 - 3  # of C(4,2)=6, the 3 with b1 before a1 are gone


def test_a_sample_is_seeded_and_shards_partition_it() -> None:
    assert choose(1000, 50, seed=7) == choose(1000, 50, seed=7)
    assert choose(1000, 50, seed=7) != choose(1000, 50, seed=8)
    shards = [choose(1000, 50, seed=7, shard=(k, 3)) for k in (1, 2, 3)]
    assert sorted(i for s in shards for i in s) == choose(1000, 50, seed=7)
    assert choose(10, None, None) == list(range(10))


# -- exploring on the server ------------------------------------------------------------------


def test_lost_update_has_two_classes_by_final_balance(pgrace_server: ServerInfo) -> None:
    scenario = catalog.read_scenario("lost-update")
    found = explore(scenario, pgrace_server, search=Exhaustive())
    assert (found.space, found.explored, found.seed) == (70, 70, None)
    by_balance = {c.final[0][0][0]: c for c in found.classes}
    assert set(by_balance) == {400, 300}
    assert (
        by_balance[400].count == 60 and by_balance[300].count == 10
    )  # 300 only when one reads after the other commits
    lost = by_balance[400]
    assert lost.ok and not by_balance[300].ok  # the bug variant's check is "the balance is 400"
    assert lost.reproduces and by_balance[300].reproduces is False  # and it is the bug's signature
    reads_and_writes = [n for n in lost.example if n.endswith(("-read", "-write"))]
    assert [n.split("-")[1] for n in reads_and_writes] == ["read", "read", "write", "write"]


def test_lost_update_fix_has_one_class_every_interleaving_ends_at_300(pgrace_server: ServerInfo) -> None:
    found = explore(catalog.read_scenario("lost-update").variant_named("fix"), pgrace_server, search=Exhaustive())
    assert len(found.classes) == 1
    only = found.classes[0]
    assert (only.count, only.final, only.ok) == (70, (((300,),),), True)
    assert 0 < only.waits < 70  # bob waits unless alice committed before he read (or the other way round)


def test_same_seed_same_classes_and_shards_merge_into_the_whole(pgrace_server: ServerInfo) -> None:
    scenario = catalog.read_scenario("skip-locked-fanout").variant_named("bug")
    first = explore(scenario, pgrace_server, search=Sample(24, 5))
    again = explore(scenario, pgrace_server, search=Sample(24, 5))
    assert first.to_dict() == again.to_dict()
    assert (first.space, first.explored, first.seed) == (140, 24, 5)
    shards = [explore(scenario, pgrace_server, search=Sample(24, 5), shard=(k, 3)) for k in (1, 2, 3)]
    assert [s.explored for s in shards] == [8, 8, 8]
    merged = merge_explorations(shards).to_dict()
    assert merged.pop("shard") == {"n": 3, "held": [1, 2, 3], "missing": []}
    whole = first.to_dict()
    assert whole.pop("shard") == {"n": 1, "held": [1], "missing": []}
    assert merged == whole


def test_jobs_run_in_separate_processes_with_the_same_result(pgrace_server: ServerInfo) -> None:
    """Every interleaving, in two processes or one (the reduced search split: tests/test_reduce_shards.py)."""
    scenario = catalog.read_scenario("lost-update")
    every = explore(scenario, pgrace_server, search=Exhaustive()).to_dict()
    assert explore(scenario, pgrace_server, jobs=2, search=Exhaustive()).to_dict() == every


def test_a_spec_with_its_own_teardown_is_explored(pgrace_server: ServerInfo) -> None:
    scenario = catalog.read_scenario(str(HERE / "specs" / "row-queue.spec"))
    found = explore(scenario, pgrace_server, search=Exhaustive())
    assert found.space == math.factorial(6) // 8 == 90
    assert sum(c.count for c in found.classes) == 90
    assert [c.errors for c in found.classes] == [()]


def test_a_blocked_sessions_next_step_is_deferred_not_waited_for(pgrace_server: ServerInfo) -> None:
    """bob-read waits for alice; bob-write comes next in the order but must wait for bob to be free."""
    fix = catalog.read_scenario("lost-update").variant_named("fix")
    order = ("alice-1", "alice-read", "bob-1", "bob-read", "bob-write", "alice-write", "alice-4", "bob-4")
    one = Scenario(**{**fix.__dict__, "permutations": (tuple(PermutationStep(n) for n in order),), "other": None})
    options = RunOptions(step_timeout=2.0, defer_busy_sessions=True, checks_each_permutation=True)
    with scratch_database(pgrace_server, "defer") as db:
        run = run_scenario(one, db.dsn, row_locks_available=False, options=options)
    assert not any(isinstance(e, StepCancelled) for e in run.events)
    launched = [s.step for s in run.step_runs()]
    assert launched == ["alice-1", "alice-read", "bob-1", "bob-read", "alice-write", "alice-4", "bob-write", "bob-4"]
    observed = classify(split_run(run)[0])
    assert observed.final == (((300,),),) and observed.waited and observed.ok


# -- check --explore ---------------------------------------------------------------------------


@pytest.mark.thorough  # every shipped variant; the tests below check check --explore's verdicts one by one
def test_check_explore_passes_on_the_shipped_scenarios(pgrace_server: ServerInfo) -> None:
    cases = regression.prepare(["scenarios"])
    # a modest seeded sample of each (sleeps make some spaces slow); bench/bench_library.py explores them whole
    results = [regression.run_explore_case(case, pgrace_server, search=Sample(12, 1)) for case in cases]
    assert [(r.case.name, r.problems) for r in results if not r.ok] == []
    assert len(results) == sum(len(catalog.read_scenario(n).variants) for n in catalog.shipped_names())


def test_check_explore_fails_a_cure_that_locks_one_read_naming_class_and_example(
    pgrace_server: ServerInfo, tmp_path: Path
) -> None:
    cli = CliRunner()
    plain = cli.invoke(main, ["check", str(HALF_CURE), "--dsn", pgrace_server.dsn])
    assert plain.exit_code == 0, plain.output  # the file's own order hides the race
    junit = tmp_path / "junit.xml"
    result = cli.invoke(main, ["check", "--explore", str(HALF_CURE), "--dsn", pgrace_server.dsn, "--junit", str(junit)])
    assert result.exit_code == 1, result.output
    assert re.search(
        r"class [12] of 2 \(\d+ of \d+ runs over all 70 interleavings\): final \(400\) · fails", result.output
    )
    assert "example: alice: BEGIN → alice-read → alice-write → bob: BEGIN" in result.output
    xml = junit.read_text()
    assert 'failures="1"' in xml and re.search("class [12] of 2", xml) and "example: alice: BEGIN" in xml


# -- the command -------------------------------------------------------------------------------


def test_explore_command_text_json_show_and_merge(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    cli = CliRunner()
    dsn = ["--dsn", pgrace_server.dsn]
    text = cli.invoke(main, ["explore", "lost-update", "--no-reduce", *dsn])
    assert text.exit_code == 0, text.output
    assert text.output.startswith("lost-update (bug): all 70 interleavings: 2 outcome classes\n")
    # A bug variant's checks describe the bug: where they hold, the bug happened (and is the bad news).
    assert "reproduces the bug        40  final (400) · the bug: the balance is 400, not 300" in text.output
    assert "does not reproduce         0  final (300) · no bug: «the balance is 400" in text.output
    assert "holds" not in text.output and "FAILS" not in text.output

    whole = json.loads(cli.invoke(main, ["explore", "lost-update", "--no-reduce", "-f", "json", *dsn]).output)
    assert set(whole) == {
        *("scenario", "variant", "space", "explored", "runs", "complete", "guarantee", "repeats", "seed", "classes"),
        *("claim", "passed"),
        *("search", "shard"),
    }
    assert (whole["claim"], whole["passed"]) == ("bug", True)
    assert (whole["space"], whole["explored"], whole["runs"], whole["complete"]) == (70, 70, 70, True)
    assert whole["guarantee"] == {"kind": "complete"}
    assert [(c["ok"], c["reproduces"]) for c in whole["classes"]] == [(True, True), (False, False)]
    assert set(whole["classes"][0]) == {
        "ok",
        "reproduces",
        "count",
        "summary",
        "errors",
        "unexpected_errors",
        "failed_checks",
        "final",
        "waits",
        "example",
        "retries",
        "retried_on",
        "retry_example",
    }
    files = []
    for k in (1, 2):
        out = tmp_path / f"shard{k}.json"
        args = ["explore", "lost-update", "--no-reduce", "--shard", f"{k}/2", "-f", "json", "-o", str(out), *dsn]
        done = cli.invoke(main, args)
        assert done.exit_code == 0, done.output
        files += ["--merge", str(out)]
    merged = json.loads(cli.invoke(main, ["explore", "lost-update", "-f", "json", *files]).output)
    assert merged.pop("shard") == {"n": 2, "held": [1, 2], "missing": []}
    assert merged == {k: v for k, v in whole.items() if k != "shard"}

    shown = cli.invoke(main, ["explore", "lost-update", "--show", "2", "-f", "json", *dsn])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["final"][0]["rows"] == [[300]]

    html = cli.invoke(main, ["explore", "lost-update", "-f", "html", *dsn])
    assert html.output.startswith("<!DOCTYPE html>") and html.output.count("<details") == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shard", "3/2"], "K/N"),
        (["--shard", "x"], "K/N"),
        (["--show", "9"], "there are 2 classes"),
        (["-f", "svg"], "--show N prints any format"),
    ],
)
def test_explore_bad_options_exit_2_in_one_line(pgrace_server: ServerInfo, args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["explore", "lost-update", *args, "--dsn", pgrace_server.dsn])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_a_step_using_a_blocked_steps_capture_waits_for_its_value(pgrace_server: ServerInfo) -> None:
    """b1 uses what a1 captures; a1 is blocked by c: b1 is deferred until c commits and a1 has its row."""
    scenario = steps_scenario(
        [
            ("c1", "c", "BEGIN; SELECT id FROM t FOR UPDATE"),
            ("a1", "a", "SELECT id AS x FROM t FOR UPDATE"),
            ("b1", "b", "SELECT :a.v AS seen"),
            ("c2", "c", "COMMIT"),
        ],
        captures={"a1": "v"},
    )
    scenario = Scenario(**{**scenario.__dict__, "setup": ("CREATE TABLE t (id int); INSERT INTO t VALUES (7)",)})
    options = RunOptions(step_timeout=5.0, defer_busy_sessions=True, checks_each_permutation=True)
    with scratch_database(pgrace_server, "capture") as db:
        run = run_scenario(scenario, db.dsn, row_locks_available=False, options=options)
    steps = {s.step: s for s in run.step_runs()}
    assert [s.step for s in run.step_runs()] == ["c1", "a1", "c2", "b1"]
    b1 = steps["b1"].outcome
    assert b1 is not None and b1.last_rows is not None and b1.last_rows.rows == ((7,),)
    assert not any(isinstance(e, StepCancelled) for e in run.events)


def test_a_huge_space_is_stated_and_needs_a_sample(pgrace_server: ServerInfo) -> None:
    steps = [(f"{s}{i}", s, "SELECT 1") for s in "abc" for i in range(12)]
    scenario = steps_scenario(steps)
    size = math.factorial(36) // math.factorial(12) ** 3
    assert Space(scenario).size == size
    with pytest.raises(ScenarioError, match=f"{size:,} interleavings are too many"):
        explore(scenario, pgrace_server)
    sampled = explore(scenario, pgrace_server, search=Sample(3, 9))
    assert (sampled.space, sampled.explored, sampled.seed) == (size, 3, 9)


def _explore_databases(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'pgrace_explore_skip%'").fetchall()
    return [name for (name,) in rows]


def test_sigterm_during_jobs_drops_every_workers_scratch_database(pgrace_server: ServerInfo) -> None:
    assert _explore_databases(pgrace_server.dsn) == []
    # 50,000 interleavings of 4 workers × 3 steps: minutes of work, unless the workers stop at once.
    args = ["explore", "skip-locked-fanout", "-p", "workers=4", "--max", "50000", "-j", "2"]
    child = subprocess.Popen(
        [sys.executable, "-m", "pgrace", *args, "--dsn", pgrace_server.dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len(_explore_databases(pgrace_server.dsn)) < 2:  # both workers are exploring
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.02)  # polling for another process's progress, not a stand-in for lock detection
        child.send_signal(signal.SIGTERM)
        _, stderr = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    long_job = "pgrace: skip-locked-fanout (fix): 50,000 interleavings to run in 2 processes\n"  # said before it starts
    assert (child.returncode, stderr) == (143, long_job + "pgrace: terminated; cleaned up\n")
    assert _explore_databases(pgrace_server.dsn) == []


def test_merge_refuses_what_is_not_an_explorations_json(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"scenario": "lost-update"')
    result = CliRunner().invoke(main, ["explore", "lost-update", "--merge", str(bad)])
    assert result.exit_code == 2 and f"{bad}:1: not JSON" in result.output
    bad.write_text('{"scenario": "lost-update"}')
    result = CliRunner().invoke(main, ["explore", "lost-update", "--merge", str(bad)])
    assert result.exit_code == 2 and "not an exploration's JSON" in result.output


def test_nothing_of_one_interleaving_reaches_the_next_session_state_included(pgrace_server: ServerInfo) -> None:
    """A session-level advisory lock outlives COMMIT; each interleaving must start without it."""
    scenario = steps_scenario(
        [
            ("a1", "a", "INSERT INTO t VALUES ('a', pg_try_advisory_lock(42))"),
            ("b1", "b", "INSERT INTO t VALUES ('b', pg_try_advisory_lock(42))"),
        ]
    )
    check = FinalCheck("who got the lock", "SELECT string_agg(who, ',') FROM t WHERE got", (("a",),))
    scenario = Scenario(**{**scenario.__dict__, "setup": ("CREATE TABLE t (who text, got bool)",), "checks": (check,)})
    found = explore(scenario, pgrace_server, search=Exhaustive())
    assert sorted((c.final, c.count) for c in found.classes) == [(((("a",),),), 1), (((("b",),),), 1)]


def test_a_57014_class_is_not_called_a_step_timeout() -> None:
    """57014 is any canceled query: ddl-lock-queue's statement_timeout is not pgrace's --step-timeout."""
    from pgrace.model.outcomes import OutcomeClass, summarize

    scenario = catalog.read_scenario("ddl-lock-queue")
    summary = summarize(OutcomeClass(False, 1, ("57014",), (), (), 0, ()), scenario)
    assert "57014 (query canceled" in summary and "step timeout" not in summary


def test_sessions_left_in_a_failed_or_open_transaction_start_the_next_interleaving_clean(
    pgrace_server: ServerInfo,
) -> None:
    """Session a ends in a failed transaction holding a session advisory lock, a temp table and a
    setting; b ends inside an open one. Each interleaving must find none of it: a leftover would
    fail a step (the temp table exists, the setting is set, the transaction is aborted or still
    open: now() is not this statement's time) or the setup (the lock is held)."""
    scenario = steps_scenario(
        [
            ("a1", "a", "CREATE TEMP TABLE pad (i int)"),
            ("a2", "a", "SELECT 1 / (coalesce(current_setting('pgrace_test.mark', true), '') = '')::int"),
            ("a3", "a", "SELECT pg_advisory_lock(42), set_config('pgrace_test.mark', 'left', false)"),
            ("a4", "a", "BEGIN"),
            ("a5", "a", "SELECT 1 / 0"),
            ("b1", "b", "SELECT 1 / (now() = statement_timestamp())::int"),
            ("b2", "b", "BEGIN"),
            ("b3", "b", "SELECT 2"),
        ]
    )
    lock_free = "SELECT 1 / pg_try_advisory_lock(42)::int; SELECT pg_advisory_unlock(42)"
    scenario = Scenario(**{**scenario.__dict__, "setup": (lock_free,)})
    found = explore(scenario, pgrace_server, search=Exhaustive())
    assert [(c.errors, c.count) for c in found.classes] == [(("22012",), 56)]  # a5's division alone, everywhere


def test_explores_working_schema_is_the_run_roles_and_first_on_its_path_pgrowlocks_outside_it(
    pgrace_server: ServerInfo,
) -> None:
    """The teardown drops the working schema with all in it: pgrowlocks must not be made there."""
    from pgrace.drivers.exploring import EXPLORE_SCHEMA
    from pgrace.scratch import scratch_database_with_schema

    with (
        scratch_database_with_schema(pgrace_server, "schema_owner", EXPLORE_SCHEMA) as db,
        psycopg.connect(db.dsn, autocommit=True) as conn,
    ):
        row = conn.execute(
            "SELECT current_user, current_schema(),"
            " (SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = current_schema()),"
            " (SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
            "  WHERE e.extname = 'pgrowlocks')"
        ).fetchone()
    assert row is not None
    assert row == (db.role or row[0], EXPLORE_SCHEMA, row[0], "public" if db.has_pgrowlocks else None)
