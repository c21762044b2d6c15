"""Outcome renderers on hand-built data: every format, hostile text made harmless."""

from __future__ import annotations

import json

from pgrace.model.exploration import Exploration
from pgrace.model.matrix import Matrix, MatrixTable, ModePair
from pgrace.model.outcomes import OutcomeClass
from pgrace.model.scenario import PermutationStep, Scenario, Session, Step
from pgrace.model.sweep import Grid, GridPoint
from pgrace.render import outcomes as render

HOSTILE = "<b>x</b> | \x1b[2J"


def _scenario() -> Scenario:
    steps = (Step("a-1", "a", "BEGIN"), Step(f"a-{HOSTILE}", "a", "SELECT 1"), Step("b-1", "b", "COMMIT"))
    return Scenario(
        name="s",
        title="t",
        source="s.toml",
        sessions=(Session("a"), Session("b")),
        steps=steps,
        permutations=(tuple(PermutationStep(s.name) for s in steps),),
    )


def _exploration() -> Exploration:
    classes = [
        OutcomeClass(True, 3, (), (), (((1,),),), 1, ("a-1", f"a-{HOSTILE}", "b-1"), summary=f"final (1) {HOSTILE}"),
        OutcomeClass(False, 1, ("40001",), ("check",), (((2,),),), 0, ("b-1", "a-1", f"a-{HOSTILE}"), summary="bad"),
    ]
    return Exploration("s", "bug", 3, 4, 7, classes)


def test_exploration_in_every_format_shows_hostile_text_harmlessly() -> None:
    exploration, scenario = _exploration(), _scenario()
    text = render.render_exploration_text(exploration, scenario)
    assert text.startswith("s (bug): 4 of 3 interleavings (seed 7): 2 outcome classes\n")
    assert "a: BEGIN → a-<b>x</b> | ␛[2J → b: COMMIT" in text and "\x1b" not in text
    markdown = render.render_exploration_markdown(exploration, scenario)
    assert "\\|" in markdown and "\x1b" not in markdown
    page = render.render_exploration_html(exploration, scenario, {1: f"timeline {HOSTILE}"})
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page and "\x1b" not in page
    assert page.count("<details") == 1  # only class 1 was given a timeline
    data = json.loads(render.render_exploration_json(exploration))
    assert data["classes"][0]["summary"] == f"final (1) {HOSTILE}"  # JSON keeps the data, escaped
    assert data["seed"] == 7 and data["classes"][1]["errors"] == ["40001"]


def test_matrix_marks_a_cell_that_differs_from_the_manual() -> None:
    row = MatrixTable(("A", "B"), [ModePair(h, r, h == r, h == r) for h in "AB" for r in "AB"])
    table = MatrixTable(("A", "B"), [ModePair(h, r, True, h == r, seen="waits") for h in "AB" for r in "AB"])
    matrix = Matrix("18.1", "server", row, table)
    text = render.render_matrix_text(matrix)
    assert "agrees with the documented table in all 4 cells" in text
    assert "DIFFERS from the documented table in 2 of 4 cells: A × B: blocks (documented: compatible)" in text
    assert "blocks ≠doc" in render.render_matrix_markdown(matrix)
    assert 'class="fail differs"' in render.render_matrix_html(matrix)
    assert json.loads(render.render_matrix_json(matrix))["table"]["cells"][1] == {
        "held": "A",
        "requested": "B",
        "blocks": True,
        "documented_blocks": False,
    }


def test_sweep_grid_in_every_format() -> None:
    occurs = OutcomeClass(True, 1, (), (), (((1,),),), 0, ("a-1",), summary="s", reproduces=True)
    prevented = OutcomeClass(False, 1, ("40001",), ("c",), ((),), 1, ("a-1",), summary="p", reproduces=False)
    sweep = Grid(
        "s",
        "bug",
        {"level": ["rc", "ser"]},
        [GridPoint({"level": "rc"}, [occurs], "bug", True), GridPoint({"level": "ser"}, [prevented], "bug", True)],
    )
    assert "occurs" in render.render_sweep_text([sweep]) and "prevented by 40001" in render.render_sweep_text([sweep])
    assert "| s (bug) | occurs | prevented by 40001 |" in render.render_sweep_markdown([sweep])
    page = render.render_sweep_html([sweep], {(0, 1, 0): "the timeline"})
    assert '<td class="fail"><a href="#cell-0-0">occurs</a></td>' in page and "the timeline" in page
    assert json.loads(render.render_sweep_json([sweep]))["cells"][1] == {
        "params": {"level": "ser"},
        "verdict": "prevented by 40001",
        "classes": [prevented.to_dict("bug")],
    }
