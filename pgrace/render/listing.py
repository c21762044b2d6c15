"""``pgrace list`` and ``pgrace show``: the shipped scenarios by topic, and one scenario's story and steps."""

from __future__ import annotations

import json
import textwrap
from typing import TYPE_CHECKING

from pgrace.text import visible, without_controls

if TYPE_CHECKING:
    from pgrace.frontends.catalog import Entry
    from pgrace.model.results import Shown
    from pgrace.render.views import View


def list_text(chosen: list[Entry], view: View | None = None) -> str:
    """By topic, one line a scenario, then the tags to filter them by."""
    from pgrace.frontends import catalog

    lines = []
    for number, (group, members) in enumerate(catalog.by_topic(chosen)):
        lines.append(visible(("\n" if number else "") + group))
        for entry in members:
            lines.append(visible(f"  {entry.name:<28} {entry.title}  [{entry.variants_label}]"))
    shown = sorted({tag for entry in chosen for tag in entry.tags})
    if shown:
        wrapped = textwrap.wrap(
            ", ".join(shown),
            width=100,
            initial_indent="  ",
            subsequent_indent="  ",
            break_on_hyphens=False,
            break_long_words=False,
        )
        lines.append(visible("\ntags (pgrace list --tag TAG):\n" + "\n".join(wrapped)))
    return "".join(line + "\n" for line in lines)


def list_json(chosen: list[Entry], view: View | None = None) -> str:
    return json.dumps([entry.to_dict() for entry in chosen], indent=2, ensure_ascii=False) + "\n"


def render_show(shown: Shown) -> str:
    """A variant of a file told without running it: its story, sessions, steps and checks."""
    from pgrace.frontends import catalog

    file_scenario, chosen = shown.scenario, without_controls(shown.variant)
    lines = [f"{chosen.name} ({chosen.variant}): {chosen.title}", f"source: {chosen.source}"]
    if chosen.topic or chosen.tags:
        lines.append(
            f"topic: {chosen.topic or catalog.OTHER_TOPIC}"
            + (f"; tags: {', '.join(chosen.tags)}" if chosen.tags else "")
        )
    if chosen.narrative:
        lines += ["", chosen.narrative]
    lines.append("")
    if chosen.changes:  # only the variant built over the file's first one has any
        lines.append(f"what the {chosen.variant} changes in the {file_scenario.variant}:")
        lines += [f"  {change}" for change in chosen.changes]
        lines.append("")
    lines.append(f"sessions: {', '.join(chosen.session_names)}")
    for index, permutation in enumerate(chosen.permutations):
        if len(chosen.permutations) > 1:
            lines.append(f"\npermutation {index + 1}: {' '.join(p.step for p in permutation)}")
            continue
        for number, entry in enumerate(permutation, 1):
            step = chosen.step(entry.step)
            lines.append(f"{number:>3}. {step.session:<10} {' '.join(step.sql.split())}")
            if step.note:
                lines.append(f"     {'':<10} » {step.note}")
    lines += [f"check ({'the bug' if c.is_signature else 'must hold'}): {c.description}" for c in chosen.checks]
    if chosen.commands:  # run, explore and check run these instead of the steps
        lines.append("\ncommands ([exec]; run, explore and check run them instead of the steps):")
        lines += [f"  {c.name:<10} {' '.join(c.line.split())}  (in {c.cwd})" for c in chosen.commands]
    if chosen.other:
        flag = "--fix" if chosen.other.variant == "fix" else "--bug"
        lines.append(f"\nother variant: {flag}: {chosen.other.title}")
    return "".join(line + "\n" for line in lines)
