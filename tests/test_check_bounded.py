"""``check --explore`` and ``sweep --explore`` take ``-p`` and the bounded searches, and say what a pass covered.

A cure that passes on every schedule with at most K preemptions has not been shown to hold
in every interleaving: its line, its JUnit case and the sweep's header say which schedules
were run, and never read as a full proof.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from pgrace.cli import main
from pgrace.servers import ServerInfo

FANOUT = Path(__file__).resolve().parents[1] / "scenarios" / "skip-locked-fanout.toml"
HERMITAGE = Path(__file__).resolve().parents[1] / "examples" / "hermitage"


def test_a_cure_passes_on_a_bounded_search_and_says_so(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    junit = tmp_path / "out.xml"
    args = ["check", "--explore", "-p", "workers=2", "--max-preemptions", "2", str(FANOUT), "--junit", str(junit)]
    result = CliRunner().invoke(main, [*args, "--dsn", pgrace_server.dsn])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    cure = lines.index(next(line for line in lines if line.startswith("PASS  skip-locked-fanout (fix)")))
    assert lines[cure + 1].startswith("      bounded: every schedule with at most 2 preemptions, ")
    assert lines[cure + 1].endswith(" (of 20 interleavings)")  # -p workers=2: two sessions of three steps
    case = ET.parse(junit).getroot().find(".//testcase[@name='skip-locked-fanout (fix)']")
    assert case is not None and case.find("failure") is None
    guarantee = case.find("properties/property[@name='guarantee']")
    assert guarantee is not None and guarantee.get("value", "").startswith("every schedule with at most 2 preemptions")
    assert (case.findtext("system-out") or "").startswith("bounded: every schedule with at most 2 preemptions")


def test_a_full_exploration_claims_no_bound(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    junit = tmp_path / "out.xml"
    args = ["check", "--explore", "-p", "workers=2", str(FANOUT), "--junit", str(junit), "--dsn", pgrace_server.dsn]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "bounded" not in result.output and "guarantee" not in junit.read_text()


def test_a_bounded_sweep_says_which_schedules_each_cell_ran(pgrace_server: ServerInfo) -> None:
    scenario = str(HERMITAGE / "lost-update-p4.toml")
    base = ["sweep", scenario, "-p", "level=read-committed,serializable", "--explore", "--dsn", pgrace_server.dsn]
    text = CliRunner().invoke(main, [*base, "--max-preemptions", "1"])
    assert text.exit_code == 0, text.output
    header = "Sweep (every schedule with at most 1 preemption of each combination, not every interleaving):"
    assert text.output.splitlines()[0] == header
    found = json.loads(CliRunner().invoke(main, [*base, "--pct", "2", "--max", "5", "-f", "json"]).output)
    assert [c["guarantee"]["kind"] for c in found["cells"]] == ["pct", "pct"]
    assert all(c["guarantee"]["depth"] == 2 and c["guarantee"]["draws"] == 5 for c in found["cells"])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["check", "--max-preemptions", "2"], "--max-preemptions bounds an exploration: add --explore"),
        (["check", "--explore", "--max-preemptions", "1", "--pct", "2"], "two searches: choose one"),
        (["check", "--explore", "--pct", "0"], "--pct 0: the depth D is 1 or more"),
        (["check", "--explore", "--max-preemptions", "-1"], "--max-preemptions -1: K is 0 or more"),
        (["check", "--explore", "--max-preemptions", "1", "-j", "2"], "-j cannot split it"),
        (["sweep", "lost-update", "-p", "x=1", "--pct", "2"], "--pct bounds an exploration: add --explore"),
    ],
)
def test_a_bound_without_its_search_is_refused_in_one_line(args: list[str], says: str) -> None:
    result = CliRunner().invoke(main, [*args, str(FANOUT)] if args[0] == "check" else args)
    assert result.exit_code == 2
    assert says in result.output and "Traceback" not in result.output
