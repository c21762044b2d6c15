"""Outcome tables: explore's classes, sweep's grid, matrix's lock tables; text, markdown, HTML, JSON.

Pure functions of the data the drivers return; they print nothing and run nothing.
Scenario and server text goes through :mod:`pgrace.text` at each entry. The
HTML page is self-contained: each class (or grid cell) opens its example's timeline,
rendered beforehand by the caller and passed in as text.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tabulate import tabulate

from pgrace.model.outcomes import verdict_of
from pgrace.model.scenario import Scenario
from pgrace.render.common import ERROR_COLOUR, OK_COLOUR, one_line, shorten
from pgrace.text import json_safe, visible, without_controls

if TYPE_CHECKING:
    from pgrace.model.exploration import Exploration
    from pgrace.model.matrix import Matrix, MatrixTable, ModePair
    from pgrace.model.outcomes import OutcomeClass
    from pgrace.model.sweep import Grid


def step_label(scenario: Scenario, name: str) -> str:
    """A step as a reader knows it: its name, or ``session: SQL`` for a step the file did not name."""
    try:
        step = scenario.step(name)
    except KeyError:
        return name
    if re.fullmatch(re.escape(step.session) + r"-\d+", name):
        return f"{step.session}: {shorten(one_line(step.sql), 24)}"
    return name


def example_text(scenario: Scenario, example: Sequence[str]) -> str:
    return " → ".join(step_label(scenario, name) for name in example)


def _space_line(exploration: Exploration) -> str:
    space = exploration.space
    noun = "interleaving" if space == 1 else "interleavings"
    said: list[str] = []
    if exploration.bound is not None:
        text = exploration.bound.words(space)
    elif exploration.reduced and exploration.covers_all:
        runs = exploration.run_count
        text = f"all {space:,} {noun}, {runs:,} run{'s' if runs != 1 else ''}"
    elif exploration.reduced and exploration.complete and exploration.shard[1] > 1 and exploration.held is None:
        # a shard's share, covered
        runs = exploration.run_count
        text = f"{exploration.explored:,} of {space:,} {noun}, {runs:,} run{'s' if runs != 1 else ''}"
    elif exploration.reduced and exploration.seed is not None:  # a sample of an application's orders
        runs = exploration.run_count
        text = f"{exploration.explored:,} of {space:,} {noun}, {runs:,} run{'s' if runs != 1 else ''}"
        said.append(f"seed {exploration.seed}")
        if exploration.incomplete:
            said.append(exploration.incomplete)
    elif exploration.reduced:
        text = f"{exploration.run_count:,} runs of {space:,} {noun}, not all covered"
    elif exploration.explored == space and not exploration.missing:
        text = f"all {space} {noun}"
    else:
        text = f"{exploration.explored} of {space} {noun}"
        if exploration.seed is not None:
            said.append(f"seed {exploration.seed}")
    if exploration.repeats:
        again = "repeats another" if exploration.repeats == 1 else "repeat others"
        said.append(f"{exploration.repeats} {again}: they differ only where unsent retry steps stood")
    if said:
        text += f" ({'; '.join(said)})"
    k, n = exploration.shard
    if exploration.held is not None and exploration.missing:  # a merge of some of the shards
        text += f", {_shards(exploration.held, n)} merged, {_shards(exploration.missing, n)} missing"
    elif exploration.held is None and n > 1:
        text += f", shard {k}/{n}"
    count = len(exploration.classes)
    return f"{text}: {count} outcome class{'es' if count != 1 else ''}"


def _numbers(numbers: Sequence[int]) -> str:
    listed = [str(n) for n in numbers]
    return listed[0] if len(listed) == 1 else ", ".join(listed[:-1]) + " and " + listed[-1]


def exploration_verdict(exploration: Exploration, scenario: Scenario) -> tuple[str, bool]:
    """The exploration's verdict in one sentence, and whether it passed (its exit code says the same).

    What passes is the variant's claim (``Exploration.claim``): the bug shown cleanly in some
    class, or no class that shows it or raises an error no step declares.
    """
    classes = exploration.classes
    if exploration.claim == "bug":
        clean = [n for n, c in enumerate(classes, 1) if c.shows_bug]
        if clean:
            return f"{_classes(clean)} {'shows' if len(clean) == 1 else 'show'} the bug", True
        tainted = [n for n, c in enumerate(classes, 1) if c.reproduces]
        said = "with an error no step declares" if tainted else "in no class"
        if exploration.shard[1] > 1:
            return f"this shard shows the bug {said}: the merge of all shards decides", True
        return f"the bug happens {said}" + (f" ({_classes(tainted)})" if tainted else ""), False
    showing = [n for n, c in enumerate(classes, 1) if c.reproduces]
    raising = [n for n, c in enumerate(classes, 1) if c.unexpected]
    if not showing and not raising:
        said = "no class shows the bug, none raises" if scenario.checks else "no class raises"
        return f"{said} an error no step declares", True
    parts = []
    if showing:
        parts.append(f"{_classes(showing)} {'shows' if len(showing) == 1 else 'show'} the bug")
    if raising:
        codes = sorted({code for n in raising for code in classes[n - 1].unexpected})
        verb = "raises" if len(raising) == 1 else "raise"
        parts.append(f"{_classes(raising)} {verb} an error no step declares ({', '.join(codes)})")
    return "; ".join(parts), False


def _classes(numbers: Sequence[int]) -> str:
    return f"{'class' if len(numbers) == 1 else 'classes'} {_numbers(numbers)}"


def _shards(numbers: Sequence[int], n: int) -> str:
    return f"shard{'s' if len(numbers) > 1 else ''} {', '.join(str(k) for k in numbers)} of {n}"


def retried_text(cls: OutcomeClass) -> str:
    """How many of a class's runs went through a retry loop, and on which SQLSTATEs: ``6 (40001)``."""
    return f"{cls.retries} ({', '.join(cls.retried_on)})" if cls.retries else "0"


def _retrying(classes: Sequence[OutcomeClass]) -> bool:
    """Whether to show retries: a column that would say 0 in every row is left out."""
    return any(c.retries for c in classes)


def render_exploration_text(exploration: Exploration, scenario: Scenario) -> str:
    exploration, scenario = without_controls(exploration), without_controls(scenario)
    retrying = _retrying(exploration.classes)
    rows = [
        [
            number,
            c.count,
            verdict_of(c, scenario)[0],
            c.waits,
            *([retried_text(c)] if retrying else []),
            c.summary,
        ]
        for number, c in enumerate(exploration.classes, 1)
    ]
    lines = [f"{exploration.scenario} ({exploration.variant}): {_space_line(exploration)}", ""]
    headers = ["class", "count", "checks", "waited", *(["retried"] if retrying else []), "outcome"]
    table = tabulate(rows, headers=headers, tablefmt="simple")
    lines.extend(table.splitlines())
    lines.append("")
    for number, c in enumerate(exploration.classes, 1):
        lines.append(f"class {number} example: {example_text(scenario, c.example)}")
        if c.retries and c.retry_example != c.example:
            lines.append(f"class {number} retried, e.g.: {example_text(scenario, c.retry_example)}")
    said, passed = exploration_verdict(exploration, scenario)
    lines += ["", f"verdict: {'✔' if passed else '✘'} {said}"]
    if exploration.classes:
        lines.append("")
        lines.append("`--show N` prints class N's example as a timeline (any --format).")
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def render_exploration_markdown(exploration: Exploration, scenario: Scenario) -> str:
    exploration, scenario = without_controls(exploration), without_controls(scenario)
    retrying = _retrying(exploration.classes)
    lines = [
        f"### {_md(exploration.scenario)} ({_md(exploration.variant)}): {_md(_space_line(exploration))}",
        "",
        "| class | count | checks | waited | "
        + ("retried | " if retrying else "")
        + "outcome | example (launch order) |"
        + (" retried, e.g. |" if retrying else ""),
        "|---:|---:|:---|---:|" + ("---:|" if retrying else "") + ":---|:---|" + (":---|" if retrying else ""),
    ]
    for number, c in enumerate(exploration.classes, 1):
        said, bad = verdict_of(c, scenario)
        retried = f" {retried_text(c)} |" if retrying else ""
        retry_example = f" {_md(example_text(scenario, c.retry_example))} |" if retrying else ""
        lines.append(
            f"| {number} | {c.count} | {f'**{said}**' if bad else said} | {c.waits} |{retried} {_md(c.summary)} "
            f"| {_md(example_text(scenario, c.example))} |{retry_example}"
        )
    said, passed = exploration_verdict(exploration, scenario)
    lines += ["", f"**verdict:** {'✔' if passed else '✘'} {_md(said)}"]
    return "\n".join(lines) + "\n"


def render_exploration_json(exploration: Exploration) -> str:
    return json_safe(json.dumps(exploration.to_dict(), indent=2, ensure_ascii=False)) + "\n"


_STYLE = f"""
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #1f2937; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border: 1px solid #d1d5db; padding: .35em .6em; text-align: left; vertical-align: top; }}
p.verdict.ok {{ color: {OK_COLOUR}; font-weight: bold; }}
p.verdict.fail {{ color: {ERROR_COLOUR}; font-weight: bold; }}
tr.ok td.verdict, td.ok {{ background: #dcfce7; color: {OK_COLOUR}; }}
tr.fail td.verdict, td.fail {{ background: #fee2e2; color: {ERROR_COLOUR}; font-weight: bold; }}
td.differs {{ outline: 3px solid {ERROR_COLOUR}; }}
pre {{ background: #f9fafb; padding: 1em; overflow-x: auto; }}
details {{ margin: .5em 0; }}
"""


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n"
    )


def _classes_html(
    classes: Sequence[OutcomeClass], scenario: Scenario, timelines: Mapping[int, str], anchor: str
) -> list[str]:
    retrying = _retrying(classes)
    parts = [
        "<table>",
        "<tr><th>class</th><th>count</th><th>checks</th><th>waited</th>"
        + ("<th>retried</th>" if retrying else "")
        + "<th>outcome</th><th>example</th>"
        + ("<th>retried, e.g.</th>" if retrying else "")
        + "</tr>",
    ]
    for number, c in enumerate(classes, 1):
        link = f"{anchor}-{number}"
        said, bad = verdict_of(c, scenario)
        retried = f"<td>{html.escape(retried_text(c))}</td>" if retrying else ""
        retry_example = f"<td>{html.escape(example_text(scenario, c.retry_example))}</td>" if retrying else ""
        parts.append(
            f'<tr class="{"fail" if bad else "ok"}"><td><a href="#{link}">{number}</a></td><td>{c.count}</td>'
            f'<td class="verdict">{said}</td><td>{c.waits}</td>{retried}'
            f"<td>{html.escape(c.summary)}</td><td>{html.escape(example_text(scenario, c.example))}</td>"
            f"{retry_example}</tr>"
        )
    parts.append("</table>")
    for number, c in enumerate(classes, 1):
        timeline = timelines.get(number)
        if timeline is None:
            continue
        parts.append(
            f'<details id="{anchor}-{number}"><summary>class {number}: {html.escape(c.summary)}</summary>'
            f"<pre>{html.escape(visible(timeline))}</pre></details>"
        )
    return parts


def render_exploration_html(exploration: Exploration, scenario: Scenario, timelines: Mapping[int, str]) -> str:
    """``timelines``: class number → its example's text timeline (already made visible)."""
    exploration, scenario = without_controls(exploration), without_controls(scenario)
    title = f"{exploration.scenario} ({exploration.variant})"
    body = [f"<h1>{html.escape(title)}</h1>", f"<p>{html.escape(_space_line(exploration))}</p>"]
    said, passed = exploration_verdict(exploration, scenario)
    body.append(f'<p class="verdict {"ok" if passed else "fail"}">verdict: {html.escape(said)}</p>')
    body.extend(_classes_html(exploration.classes, scenario, timelines, "class"))
    return _page(f"pgrace explore {title}", "\n".join(body) + "\n")


def jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


# -- matrix ------------------------------------------------------------------------------------


def _abbreviation(mode: str) -> str:
    """A table-lock mode by its initials: SHARE UPDATE EXCLUSIVE is SUE."""
    return "".join(word[0] for word in mode.split())


def _matrix_cell(cell: ModePair) -> str:
    return ("blocks" if cell.blocks else "·") + ("" if cell.agrees else " ≠doc")


def _agreement(table: MatrixTable) -> str:
    wrong = table.disagreements
    if not wrong:
        return f"agrees with the documented table in all {len(table.cells)} cells"
    listed = "; ".join(
        f"{c.held} × {c.requested}: {'blocks' if c.blocks else 'compatible'}"
        f" (documented: {'blocks' if c.documented_blocks else 'compatible'})"
        for c in wrong
    )
    return f"DIFFERS from the documented table in {len(wrong)} of {len(table.cells)} cells: {listed}"


def _matrix_rows(table: MatrixTable) -> list[list[str]]:
    return [[held, *(_matrix_cell(table.cell(held, requested)) for requested in table.modes)] for held in table.modes]


def render_matrix_text(matrix: Matrix) -> str:
    matrix = without_controls(matrix)
    server = matrix.server_label
    if matrix.server_version not in server:
        server += f" (PostgreSQL {matrix.server_version})"
    lines = [f"Lock conflicts measured on {server}", ""]
    lines.append("Row locks: a session holds the row (rows); another requests it (columns).")
    lines.append(tabulate(_matrix_rows(matrix.row), headers=["held \\ requested", *matrix.row.modes]))
    lines.append(_agreement(matrix.row))
    lines.append("")
    lines.append("Table locks (LOCK TABLE ... IN mode MODE): held (rows) × requested (columns).")
    headers = [_abbreviation(m) for m in matrix.table.modes]
    rows = _matrix_rows(matrix.table)
    lines.append(tabulate(rows, headers=["held \\ requested", *headers]))
    lines.append(_agreement(matrix.table))
    lines.append("   ".join(f"{_abbreviation(mode)} = {mode}" for mode in matrix.table.modes))
    return "\n".join(lines) + "\n"


def render_matrix_markdown(matrix: Matrix) -> str:
    matrix = without_controls(matrix)
    lines = [f"### Lock conflicts on PostgreSQL {_md(matrix.server_version)}", ""]
    for title, table in (("Row locks", matrix.row), ("Table locks", matrix.table)):
        lines += [f"**{title}** (held × requested): {_md(_agreement(table))}", ""]
        lines.append("| held \\ requested | " + " | ".join(_md(m) for m in table.modes) + " |")
        lines.append("|---" * (len(table.modes) + 1) + "|")
        for row in _matrix_rows(table):
            lines.append("| " + " | ".join(_md(cell) for cell in row) + " |")
        lines.append("")
    return "\n".join(lines)


def render_matrix_html(matrix: Matrix) -> str:
    matrix = without_controls(matrix)
    body = [f"<h1>Lock conflicts on PostgreSQL {html.escape(matrix.server_version)}</h1>"]
    for title, table in (("Row locks", matrix.row), ("Table locks", matrix.table)):
        body.append(f"<h2>{title}</h2><p>{html.escape(_agreement(table))}</p><table>")
        body.append(
            "<tr><th>held \\ requested</th>" + "".join(f"<th>{html.escape(m)}</th>" for m in table.modes) + "</tr>"
        )
        for held in table.modes:
            cells = []
            for requested in table.modes:
                c = table.cell(held, requested)
                classes = ("fail" if c.blocks else "ok") + ("" if c.agrees else " differs")
                shown = html.escape(_matrix_cell(c))
                cells.append(f'<td class="{classes}" title="{html.escape(c.seen)}">{shown}</td>')
            body.append(f"<tr><th>{html.escape(held)}</th>{''.join(cells)}</tr>")
        body.append("</table>")
    return _page(f"pgrace matrix: PostgreSQL {matrix.server_version}", "\n".join(body) + "\n")


def render_matrix_json(matrix: Matrix) -> str:
    return json_safe(json.dumps(matrix.to_dict(), indent=2, ensure_ascii=False)) + "\n"


# -- sweep -------------------------------------------------------------------------------------


def _combination_label(params: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


def _sweep_rows(grids: Sequence[Grid]) -> tuple[list[str], list[list[str]]]:
    headers = ["scenario", *(_combination_label(c.params) for c in grids[0].cells)]
    rows = [[f"{s.scenario} ({s.variant})", *(c.verdict for c in s.cells)] for s in grids]
    return headers, rows


def render_sweep_text(grids: Sequence[Grid]) -> str:
    grids = without_controls(list(grids))
    if not grids:
        return ""
    headers, rows = _sweep_rows(grids)
    how = "every interleaving of each combination" if grids[0].explored else "the file's order, once per combination"
    if grids[0].bound:  # never every interleaving: say which schedules
        how = f"{grids[0].bound} of each combination, not every interleaving"
    lines = [f"Sweep ({how}):", "", tabulate(rows, headers=headers, disable_numparse=True), ""]
    for s in grids:
        for cell in s.cells:
            for c in cell.classes:
                retried = f" · retried: {retried_text(c)}" if c.retries else ""
                lines.append(f"{s.scenario} [{_combination_label(cell.params)}] ×{c.count}: {c.summary}{retried}")
    return "\n".join(lines) + "\n"


def render_sweep_markdown(grids: Sequence[Grid]) -> str:
    grids = without_controls(list(grids))
    if not grids:
        return ""
    headers, rows = _sweep_rows(grids)
    lines = ["| " + " | ".join(_md(h) for h in headers) + " |", "|---" * len(headers) + "|"]
    lines += ["| " + " | ".join(_md(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def render_sweep_html(grids: Sequence[Grid], timelines: Mapping[tuple[int, int, int], str]) -> str:
    """``timelines``: (sweep, cell, class) numbers from 0 → that class's example timeline."""
    grids = without_controls(list(grids))
    if not grids:
        return _page("pgrace sweep", "")
    headers, _ = _sweep_rows(grids)
    body = [
        "<h1>pgrace sweep</h1>",
        "<table>",
        "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in headers) + "</tr>",
    ]
    for i, s in enumerate(grids):
        cells = []
        for j, cell in enumerate(s.cells):
            ok = cell.verdict in ("holds",) or cell.verdict.startswith("prevented")
            cells.append(
                f'<td class="{"ok" if ok else "fail"}"><a href="#cell-{i}-{j}">{html.escape(cell.verdict)}</a></td>'
            )
        body.append(f"<tr><th>{html.escape(f'{s.scenario} ({s.variant})')}</th>{''.join(cells)}</tr>")
    body.append("</table>")
    for i, s in enumerate(grids):
        for j, cell in enumerate(s.cells):
            body.append(
                f'<details id="cell-{i}-{j}"><summary>{html.escape(s.scenario)} '
                f"[{html.escape(_combination_label(cell.params))}]: {html.escape(cell.verdict)}</summary>"
            )
            for k, c in enumerate(cell.classes):
                body.append(f"<p>×{c.count}: {html.escape(c.summary)}</p>")
                timeline = timelines.get((i, j, k))
                if timeline is not None:
                    body.append(f"<pre>{html.escape(visible(timeline))}</pre>")
            body.append("</details>")
    return _page("pgrace sweep", "\n".join(body) + "\n")


def render_sweep_json(grids: Sequence[Grid]) -> str:
    data: Any = grids[0].to_dict() if len(grids) == 1 else [s.to_dict() for s in grids]
    return json_safe(json.dumps(data, indent=2, ensure_ascii=False)) + "\n"
