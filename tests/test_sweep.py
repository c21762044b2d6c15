"""pgrace sweep: parameter grids, and Hermitage's PostgreSQL table rebuilt by measurement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pgrace.cli import main
from pgrace.drivers.sweep import combinations, sweep, variants
from pgrace.model.outcomes import OutcomeClass
from pgrace.model.sweep import verdict
from pgrace.servers import ServerInfo

HERMITAGE = Path(__file__).parent.parent / "examples" / "hermitage"
LEVELS = ["read-committed", "repeatable-read", "serializable"]

# Hermitage's published results for PostgreSQL (github.com/ept/hermitage, README table):
# "—" (the anomaly occurs) or "✓" (prevented); RR and SER prevent P4 with a serialization
# failure, RR prevents G-single by its snapshot, only SER prevents G2-item (by SSI, 40001).
PUBLISHED = {
    "lost-update-p4.toml": {"read-committed": "occurs", "repeatable-read": "prevented", "serializable": "prevented"},
    "read-skew-g-single.toml": {
        "read-committed": "occurs",
        "repeatable-read": "prevented",
        "serializable": "prevented",
    },
    "write-skew-g2-item.toml": {"read-committed": "occurs", "repeatable-read": "occurs", "serializable": "prevented"},
}


def test_combinations_are_the_product_in_order() -> None:
    assert combinations({"a": ["1", "2"], "b": ["x", "y"]}) == [
        {"a": "1", "b": "x"},
        {"a": "1", "b": "y"},
        {"a": "2", "b": "x"},
        {"a": "2", "b": "y"},
    ]


def test_verdicts() -> None:
    def cls(
        bug: bool, errors: tuple[str, ...] = (), waits: int = 0, count: int = 1, unexpected: tuple[str, ...] = ()
    ) -> OutcomeClass:  # one final check's rows; ``bug``: they say the bug happened
        return OutcomeClass(True, count, errors, (), (((1,),),), waits, (), unexpected=unexpected, reproduces=bug)

    assert verdict([OutcomeClass(True, 1, (), (), (), 0, ())], True) == "no checks"  # nothing describes a bug
    unchecked = OutcomeClass(True, 2, ("23505",), (), (), 0, (), unexpected=("23505",))
    assert verdict([unchecked, OutcomeClass(True, 1, (), (), (), 0, ())], False) == "unexpected errors in 2/3"

    # signatures: the anomaly occurs where they hold
    assert verdict([cls(True)], True) == "occurs"
    assert verdict([cls(True, count=3), cls(False, count=1)], True) == "occurs in 3/4"
    assert verdict([cls(False, ("40001",), waits=1, unexpected=("40001",))], True) == "prevented by 40001"
    assert verdict([cls(False, waits=1)], True) == "prevented by blocking"
    assert verdict([cls(False)], True) == "prevented"
    tainted = cls(True, ("23505",), unexpected=("23505",))
    assert verdict([tainted, cls(False)], True) == "occurs only with unexpected errors 23505"
    # invariants: the cell fails where one breaks, or where a step raised an error nobody declared
    assert verdict([cls(True), cls(False)], False) == "fails in 1/2"
    assert verdict([cls(False, count=3), cls(False, ("23505",), unexpected=("23505",))], False) == "fails in 1/4"
    assert verdict([cls(False, ("40001",), count=2)], False) == "holds"  # a declared error is the story


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_hermitage_example_matches_the_published_postgresql_results(pgrace_server: ServerInfo, name: str) -> None:
    measured = sweep(variants(str(HERMITAGE / name), {"level": LEVELS}), {"level": LEVELS}, pgrace_server)
    got = {cell.params["level"]: cell.verdict for cell in measured.cells}
    assert {level: v.split(" by ")[0] for level, v in got.items()} == PUBLISHED[name]
    if name.startswith("lost-update"):  # prevented by a serialization failure, after T2 waited for T1
        assert got["repeatable-read"] == got["serializable"] == "prevented by 40001"
        assert all(c.waits for c in measured.cells[1].classes)
    if name.startswith("write-skew"):
        assert got["serializable"] == "prevented by 40001"


def test_sweep_command_explores_and_prints_the_json_contract(pgrace_server: ServerInfo) -> None:
    args = ["sweep", str(HERMITAGE / "write-skew-g2-item.toml"), "-p", "level=repeatable-read,serializable"]
    result = CliRunner().invoke(main, [*args, "--explore", "-f", "json", "--dsn", pgrace_server.dsn])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) == {"scenario", "params", "cells"}
    assert data["params"] == {"level": ["repeatable-read", "serializable"]}
    assert [c["params"] for c in data["cells"]] == [{"level": "repeatable-read"}, {"level": "serializable"}]
    repeatable, serializable = data["cells"]
    assert 0 < sum(c["count"] for c in repeatable["classes"]) <= 70  # runs of the reduced search, of 70
    assert any(c["ok"] for c in repeatable["classes"])  # write skew occurs in some interleaving
    assert not any(c["ok"] for c in serializable["classes"])  # and in none under SERIALIZABLE


def test_sweep_bad_values_exit_2(pgrace_server: ServerInfo) -> None:
    result = CliRunner().invoke(
        main, ["sweep", str(HERMITAGE / "lost-update-p4.toml"), "-p", "level=chaos", "--dsn", pgrace_server.dsn]
    )
    assert result.exit_code == 2
    assert "must be one of" in result.output
