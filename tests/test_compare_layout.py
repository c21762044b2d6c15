"""``--compare`` lines up both variants step by step, and never puts a step under another session.

A ``[fix.step.NAME]`` changes a step in place: step N is the same session's in both
variants, so one session column serves both. A ``[[fix.step]]`` list of its own may send
step N from another session (here the fix's second step is r2's, the bug's is r1's):
then each cell names its own session. Before, the text and Markdown tables put the
fix's r2 step in an r1 row, where it read "r1 … waits for r1".
"""

from __future__ import annotations

import pytest
from fix_recorded import Recorded

from pgrace.model.timeline import Run
from pgrace.render.compare import render_text_compare
from pgrace.render.markdown import render_markdown_compare
from pgrace.render.text import Style


@pytest.fixture
def runs(recorded: Recorded) -> list[Run]:
    """tests/recorded/counter.toml, whose fix sends r2's step second where the bug sends r1's."""
    return [recorded("counter", variant) for variant in ("bug", "fix")]


def test_text_compare_names_each_cells_own_session(runs: list[Run]) -> None:
    text = render_text_compare(runs, Style(colour=False, width=160))
    [header] = [line for line in text.splitlines() if line.lstrip().startswith("#")]
    assert header.split() == ["#", "bug", "fix"], "one session column cannot serve two step lists"
    [row2] = [line for line in text.splitlines() if line.lstrip().startswith("2 ")]
    assert "r1: SELECT n FROM counter" in row2 and "r2: UPDATE counter SET n = n + 1" in row2
    assert "waits for r1" in text
    assert not any("r1:" in line.split("waits")[0] and "waits for r1" in line for line in text.splitlines())


def test_markdown_compare_names_each_cells_own_session(runs: list[Run]) -> None:
    md = render_markdown_compare(runs)
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert table[0] == "| # | bug | fix |"
    row2 = table[2 + 1]
    bug_cell, fix_cell = row2.split(" | ")[1:3]
    assert " r1: " in bug_cell and "SELECT n FROM counter" in bug_cell
    assert " r2: " in fix_cell and "UPDATE counter SET n = n + 1" in fix_cell and "waits for r1" in fix_cell


def test_a_fix_that_changes_steps_in_place_keeps_the_session_column(recorded: Recorded) -> None:
    runs = [recorded("lost-update", variant) for variant in ("bug", "fix")]
    text = render_text_compare(runs, Style(colour=False, width=160))
    assert next(line for line in text.splitlines() if line.lstrip().startswith("#")).split() == [
        "#",
        "session",
        "bug",
        "fix",
    ]
    assert render_markdown_compare(runs).count("| # | session | bug | fix |") == 1


def test_the_files_own_steps_make_the_rows(runs: list[Run]) -> None:
    """Six bug steps and three fix steps: six rows, the fix's cells empty after its third."""
    md = render_markdown_compare(runs)
    table = [line for line in md.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [line.split(" | ")[0] for line in table] == [f"| {n}" for n in range(1, 7)]
    assert all(line.rstrip().endswith("|  |") for line in table[3:])
