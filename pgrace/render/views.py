"""The formats of :mod:`pgrace.render.formats`: each takes a result and a :class:`View`.

Most only hand the result to its renderer; the example timelines of an exploration or a
sweep's page are drawn here, as text, from the runs the driver replayed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pgrace.model.exploration import Exploration
    from pgrace.model.load import LoadSeries
    from pgrace.model.matrix import Matrix
    from pgrace.model.minimized import Minimized
    from pgrace.model.scenario import Scenario
    from pgrace.model.sweep import Sweep
    from pgrace.model.timeline import Run
    from pgrace.render.text import Style


@dataclass(frozen=True)
class View:
    """What a format may use besides the result: the text style, and the run's other variant."""

    style: Style | None = None
    counterpart: Scenario | None = None


def _timeline(run: Run) -> str:
    from pgrace.render.text import Style, render_text

    return render_text(run, Style(colour=False, width=120))


# -- one run --------------------------------------------------------------------------------


def run_text(run: Run, view: View) -> str:
    from pgrace.render.text import Style, render_text

    return render_text(run, view.style or Style())


def run_json(run: Run, view: View) -> str:
    from pgrace.render.json import render_json

    return render_json(run)


def run_isolation(run: Run, view: View) -> str:
    from pgrace.render.isolation import render_isolation

    return render_isolation(run)


def run_html(run: Run, view: View) -> str:
    from pgrace.render.html import render_html

    return render_html(run, view.counterpart)


def run_svg(run: Run, view: View) -> str:
    from pgrace.render.svg import render_svg

    return render_svg(run)


def run_mermaid(run: Run, view: View) -> str:
    from pgrace.render.mermaid import render_mermaid

    return render_mermaid(run)


def run_markdown(run: Run, view: View) -> str:
    from pgrace.render.markdown import render_markdown

    return render_markdown(run, counterpart=view.counterpart)


# -- the bug and the fix side by side -------------------------------------------------------


def compare_text(runs: list[Run], view: View) -> str:
    from pgrace.render.compare import render_text_compare
    from pgrace.render.text import Style

    return render_text_compare(runs, view.style or Style())


def compare_html(runs: list[Run], view: View) -> str:
    from pgrace.render.html import render_html_compare

    return render_html_compare(runs)


def compare_svg(runs: list[Run], view: View) -> str:
    from pgrace.render.svg import render_svg_compare

    return render_svg_compare(runs)


def compare_markdown(runs: list[Run], view: View) -> str:
    from pgrace.render.markdown import render_markdown_compare

    return render_markdown_compare(runs)


# -- explore, sweep, matrix -----------------------------------------------------------------


def _explored(found: Exploration) -> Scenario:
    """The scenario variant explored: its checks and steps name what the classes show."""
    if found.subject is None:
        raise ValueError(f"an exploration of {found.scenario} without its scenario: code's explorations are not drawn")
    return found.subject


def explore_text(found: Exploration, view: View) -> str:
    from pgrace.render.outcomes import render_exploration_text

    text = render_exploration_text(found, _explored(found))
    if found.minimized is not None:
        from pgrace.render.minimize import render_minimized_text

        head = f"class {found.minimized_class}'s example, minimized:"
        text += "\n" + head + "\n\n" + render_minimized_text(found.minimized)
    elif found.asked_to_minimize:
        text += "\nnothing to minimize: no class fails\n"
    return text


def explore_json(found: Exploration, view: View) -> str:
    from pgrace.render.outcomes import render_exploration_json

    if not found.asked_to_minimize:
        return render_exploration_json(found)
    import json

    from pgrace.text import json_safe

    shown = found.to_dict()
    from pgrace.render.minimize import minimized_to_dict

    shown["minimized"] = None if found.minimized is None else minimized_to_dict(found.minimized)
    shown["minimized_class"] = found.minimized_class
    return json_safe(json.dumps(shown, indent=2, ensure_ascii=False, default=str)) + "\n"


def explore_markdown(found: Exploration, view: View) -> str:
    from pgrace.render.outcomes import render_exploration_markdown

    return render_exploration_markdown(found, _explored(found))


def explore_html(found: Exploration, view: View) -> str:
    from pgrace.render.outcomes import render_exploration_html

    timelines = {n: _timeline(run) for n, run in found.examples.items()}
    return render_exploration_html(found, _explored(found), timelines)


def sweep_text(swept: Sweep, view: View) -> str:
    from pgrace.render.outcomes import render_sweep_text

    return render_sweep_text(swept.grids)


def sweep_json(swept: Sweep, view: View) -> str:
    from pgrace.render.outcomes import render_sweep_json

    return render_sweep_json(swept.grids)


def sweep_markdown(swept: Sweep, view: View) -> str:
    from pgrace.render.outcomes import render_sweep_markdown

    return render_sweep_markdown(swept.grids)


def sweep_html(swept: Sweep, view: View) -> str:
    from pgrace.render.outcomes import render_sweep_html

    return render_sweep_html(swept.grids, {key: _timeline(run) for key, run in swept.examples.items()})


def matrix_text(matrix: Matrix, view: View) -> str:
    from pgrace.render.outcomes import render_matrix_text

    return render_matrix_text(matrix)


def matrix_json(matrix: Matrix, view: View) -> str:
    from pgrace.render.outcomes import render_matrix_json

    return render_matrix_json(matrix)


def matrix_markdown(matrix: Matrix, view: View) -> str:
    from pgrace.render.outcomes import render_matrix_markdown

    return render_matrix_markdown(matrix)


def matrix_html(matrix: Matrix, view: View) -> str:
    from pgrace.render.outcomes import render_matrix_html

    return render_matrix_html(matrix)


# -- load -----------------------------------------------------------------------------------


def load_text(results: list[LoadSeries], view: View) -> str:
    from pgrace.render.load import render_load_text

    return render_load_text(results)


def load_json(results: list[LoadSeries], view: View) -> str:
    from pgrace.render.load import render_load_json

    return render_load_json(results)


def load_svg(results: list[LoadSeries], view: View) -> str:
    from pgrace.render.load import render_load_svg

    return render_load_svg(results)


def load_html(results: list[LoadSeries], view: View) -> str:
    from pgrace.render.load import render_load_html

    return render_load_html(results)


# -- minimize ---------------------------------------------------------------------------------


def minimize_text(found: Minimized, view: View) -> str:
    from pgrace.render.minimize import render_minimized_text

    return render_minimized_text(found)


def minimize_json(found: Minimized, view: View) -> str:
    from pgrace.render.minimize import render_minimized_json

    return render_minimized_json(found)
