"""``pgrace minimize``: the shipped races, padded, shrink back and still fail the same way; the exports are verified."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from pgrace.cli import main
from pgrace.drivers.minimize import Kept, failure_of, minimize
from pgrace.drivers.minimize.export import ExportError, isolationtester, verified_spec
from pgrace.drivers.minimize.statements import split_block
from pgrace.frontends import catalog
from pgrace.model.minimized import Failure, Minimized
from pgrace.scratch import scratch_database
from pgrace.servers import ServerInfo
from tools.padded import padded

#: One shipped race of each shape of failure (a check, a deadlock, an error raised at once, a wait, a
#: serialization failure); bench/bench_minimize.py minimizes every shipped race.
RACES = ["lost-update", "deadlock-transfer", "nowait", "head-of-line-blocking", "write-skew"]


#: A race's padded bug, minimized once on PostgreSQL 18: the spec export of it is checked on each server.
_MINIMIZED: dict[str, Minimized] = {}


def minimized_padded(name: str, server: ServerInfo) -> Minimized:
    if name not in _MINIMIZED:
        scenario = padded(catalog.read_scenario(name).variant_named("bug"))
        _MINIMIZED[name] = minimize(scenario, server, tuple(p.step for p in scenario.permutations[0]))
    return _MINIMIZED[name]


@pytest.mark.parametrize("name", RACES)
def test_a_padded_race_shrinks_back_and_fails_the_same_way(name: str, pgrace_server: ServerInfo) -> None:
    shipped = catalog.read_scenario(name).variant_named("bug")
    scenario = padded(shipped)
    found = minimized_padded(name, pgrace_server)
    assert found.locally_minimal
    assert found.after["sessions"] <= len(shipped.sessions)
    assert found.after["steps"] <= len(shipped.steps)
    assert not any(n.startswith("pad-") for n in found.order)
    assert "pgrace_pad" not in "".join(found.scenario.setup)
    assert found.failure.fails(scenario)
    assert found.timeline is not None  # the minimized scenario, run again fully observed: the same failure
    assert found.failure.kept_by(failure_of(found.timeline))
    kinds = {(t.kind, t.removed) for t in found.trials}
    assert ("session", True) in kinds  # the bystander went, and the report says so
    assert found.runs > sum(t.runs for t in found.trials)  # and the original's, the order's, the final count


#: What a spec cannot say, by race: the others export, verified by the real isolationtester.
CANNOT_SAY = {
    "lost-update": "step alice-write reads the captured variable :balance: a spec cannot capture",
    "nowait": "reads the captured variable :id: a spec cannot capture",
    "head-of-line-blocking": "a spec cannot capture",
}


@pytest.mark.parametrize("name", RACES)
def test_a_minimized_race_exports_a_spec_the_real_isolationtester_reproduces_on_18_and_15(
    name: str, pgrace_server: ServerInfo, each_server: ServerInfo, tmp_path: Path
) -> None:
    """The spec's expected output is pgrace's run of it on that server, written only when the tester of
    that server's own version prints the same."""
    found = minimized_padded(name, pgrace_server)
    assert isolationtester(each_server.bindir) is not None
    if name in CANNOT_SAY:
        with pytest.raises(ExportError, match=CANNOT_SAY[name]):
            verified_spec(found, each_server, name, tmp_path)
        return
    text, expected = verified_spec(found, each_server, name, tmp_path)
    assert "permutation" in text
    assert any(word in expected for word in ("ERROR:", "<waiting ...>"))
    # A deadlock's victim is reported waiting at once ("(*)"): when the tester's first look comes after the
    # victim's deadlock_timeout (a loaded machine), it would print the step finished instead, and the test flap.
    victims = [step for step, code in found.failure.errors if code == "40P01"]
    permutation = text.splitlines()[-1]
    assert (permutation.count("(*)"), len(victims)) == ((1, 1) if name == "deadlock-transfer" else (0, 0)), permutation
    assert all(f"{victim}: <... completed>" in expected for victim in victims)


def test_a_candidate_that_fails_differently_is_never_kept() -> None:
    original = Failure(True, (), (("b-credit", "40P01"),), ("a-credit", "b-credit"))
    assert original.kept_by(Failure(True, (), (("b-credit", "40P01"),), ("a-credit", "b-credit", "c")))
    assert not original.kept_by(Failure(True, (), (("b-credit", "55P03"),), ("a-credit", "b-credit")))  # SQLSTATE
    assert not original.kept_by(Failure(True, (), (("a-credit", "40P01"),), ("a-credit", "b-credit")))  # step
    assert not original.kept_by(Failure(True, ("sum",), (("b-credit", "40P01"),), ("a-credit", "b-credit")))  # check
    assert not original.kept_by(Failure(True, (), (("b-credit", "40P01"),), ("b-credit",)))  # a wait gone
    assert "55P03 on b-credit instead of 40P01 on b-credit" in original.difference(
        Failure(True, (), (("b-credit", "55P03"),), ())
    )


def test_deadlock_keeps_its_seed_rows_and_its_order(pgrace_server: ServerInfo) -> None:
    """Each seed row is tried alone; the deadlock needs both, and the order that makes the cycle."""
    scenario = catalog.read_scenario("deadlock-transfer").variant_named("bug")
    found = minimize(scenario, pgrace_server, tuple(p.step for p in scenario.permutations[0]))
    rows = [t for t in found.trials if t.kind == "row"]
    assert len(rows) >= 2 and not any(t.removed for t in rows)
    assert found.after["seed_rows"] == 2
    assert ("bob-credit", "40P01") in found.failure.errors
    assert found.race


def test_a_capture_goes_with_its_reader(pgrace_server: ServerInfo) -> None:
    scenario = catalog.read_scenario("lost-update").variant_named("bug")
    found = minimize(scenario, pgrace_server, tuple(p.step for p in scenario.permutations[0]))
    assert any(t.what == "alice-read (with its reader alice-write)" for t in found.trials)
    assert found.order == ("alice-read", "bob-read", "alice-write", "bob-write")  # no BEGIN/COMMIT needed
    assert found.race


def test_setup_statements_and_rows_split() -> None:
    block = "CREATE TABLE a (id int, t text);\nINSERT INTO a VALUES (1, 'x, y'), (2, f(1, 2)) ON CONFLICT DO NOTHING;"
    first, second = split_block(0, block)
    assert first.text == "CREATE TABLE a (id int, t text)"
    assert second.rows == ("(1, 'x, y')", "(2, f(1, 2))")
    assert second.without_row(0).text == "INSERT INTO a VALUES (2, f(1, 2)) ON CONFLICT DO NOTHING"
    é = split_block(1, "INSERT INTO a VALUES ('é', 1), ('ü', 2)")[0]  # the scanner counts characters, not bytes
    assert é.rows == ("('é', 1)", "('ü', 2)")
    assert Kept(("s",), ("x",), (first, second)).rows == 2


def test_the_exports_are_written_verified(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    out = tmp_path / "dt.toml"
    spec = tmp_path / "dt.spec"
    test = tmp_path / "test_dt.py"
    result = CliRunner().invoke(
        main,
        ["minimize", "deadlock-transfer", "-o", str(out), "--spec", str(spec), "--pytest", str(test), "-f", "json"],
        env={"PGRACE_DSN": pgrace_server.dsn},
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [w["kind"] for w in report["written"]] == ["scenario", "isolation spec", "expected output", "pytest test"]
    assert report["locally_minimal"] is True
    assert all({"kind", "what", "removed", "reason", "runs"} <= t.keys() for t in report["trials"])
    # The scenario, read back: its expectations (the failure) all hold.
    rerun = CliRunner().invoke(main, ["run", str(out), "--dsn", pgrace_server.dsn])
    assert rerun.exit_code == 0, rerun.output
    assert "40P01" in out.read_text()
    # The spec's .out is what the real isolationtester prints.
    binary = isolationtester()
    assert binary is not None
    with scratch_database(pgrace_server, "dt") as db:
        done = subprocess.run(
            [str(binary), db.dsn],
            input=spec.read_bytes(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PGAPPNAME": "isolation/dt", "LC_MESSAGES": "C", "PGTZ": "America/Los_Angeles"},
            timeout=60,
            check=False,
        )
    assert done.stdout.decode() == spec.with_suffix(".out").read_text()
    assert "ERROR:  deadlock detected" in done.stdout.decode()
    assert "def test_deadlock_transfer_does_not_fail_again(pgrace_run):" in test.read_text()


def test_a_spec_cannot_capture_and_says_which_step(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    spec = tmp_path / "lu.spec"
    result = CliRunner().invoke(main, ["minimize", "lost-update", "--spec", str(spec), "--dsn", pgrace_server.dsn])
    assert result.exit_code == 2
    assert result.stderr == "pgrace: step alice-write reads the captured variable :balance: a spec cannot capture\n"
    assert not spec.exists() and not spec.with_suffix(".out").exists()


def test_a_run_that_does_not_fail_is_refused(pgrace_server: ServerInfo) -> None:
    result = CliRunner().invoke(main, ["minimize", "lost-update", "--fix", "--dsn", pgrace_server.dsn])
    assert result.exit_code == 2
    assert "does not fail in this order: nothing to minimize" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_a_class_out_of_range_is_refused(pgrace_server: ServerInfo) -> None:
    result = CliRunner().invoke(main, ["minimize", "nowait", "--class", "9", "--dsn", pgrace_server.dsn])
    assert result.exit_code == 2
    assert "--class" in result.stderr and "classes" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_an_unknown_step_in_order_is_refused(pgrace_server: ServerInfo) -> None:
    result = CliRunner().invoke(main, ["minimize", "lost-update", "--order", "alice-reed", "--dsn", pgrace_server.dsn])
    assert result.exit_code == 2
    assert "alice-reed" in result.stderr and "alice-read" in result.stderr


def test_a_class_of_the_exploration_is_a_starting_point(pgrace_server: ServerInfo) -> None:
    from pgrace import api
    from pgrace.drivers.explore import explore

    scenario = catalog.read_scenario("lost-update").variant_named("bug")
    classes = explore(scenario, pgrace_server).classes
    bug = next(i for i, c in enumerate(classes, 1) if c.reproduces)  # the class where the bug happened
    found = api.minimize(scenario, server=pgrace_server, cls=bug)
    assert found.failure.fails(scenario)
    assert found.after["steps"] == 4
