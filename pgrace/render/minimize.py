"""A shrink's report: what it kept and why, each removal tried with its verdict, and the final timeline."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pgrace.text import visible

if TYPE_CHECKING:
    from pgrace.model.minimized import Minimized


def _sizes(counts: dict[str, int]) -> str:
    return (
        f"{counts['sessions']} sessions, {counts['steps']} steps, {counts['setup_statements']} setup statements,"
        f" {counts['seed_rows']} seed rows"
    )


def render_minimized_text(found: Minimized, timeline: bool = True) -> str:
    original = found.original
    lines = [
        f"minimize {original.name} ({original.variant}): {visible(found.failure.describe(original.variant))}",
        f"  from {_sizes(found.before)}",
        f"  to   {_sizes(found.after)}",
    ]
    minimal = (
        "locally minimal: no single removal fails the same way"
        if found.locally_minimal
        else "stopped before it was locally minimal (the run limit)"
    )
    lines.append(f"  {found.runs} runs; {minimal}")
    if found.repeats > 1:
        lines.append(
            f"  timing or chance: {found.repeats} runs per candidate; the original failed so in"
            f" {found.failed_before} of {found.repeats}, the result in {found.failed_after} of {found.repeats}"
        )
    if found.race:
        lines.append("  a race: it fails the same way in this order, not with its sessions one after another")
    if found.orders_total:
        lines.append(
            f"  order: {found.orders_kept} of {found.orders_total} cross-session orders kept"
            " (the others commute); " + " ".join(found.order)
        )
    lines += ["", "removals tried:"]
    width = max((len(t.kind) for t in found.trials), default=0)
    for trial in found.trials:
        verdict = ("changed" if trial.kind in ("sql", "order") else "removed") if trial.removed else "kept   "
        lines.append(f"  {verdict}  {trial.kind:<{width}}  {visible(trial.what)}: {visible(trial.reason)}")
    if found.written:
        lines.append("")
    lines += [f"wrote {kind} (verified): {visible(path)}" for kind, path in found.written]
    if timeline and found.timeline is not None:
        from pgrace.render.text import render_text

        lines += ["", "the minimized run:", "", render_text(found.timeline).rstrip("\n")]
    return "\n".join(lines) + "\n"


def render_minimized_json(found: Minimized) -> str:
    return json.dumps(minimized_to_dict(found), indent=2, default=str) + "\n"


def minimized_to_dict(found: Minimized) -> dict[str, Any]:
    """The documented JSON shape (docs/reference/json.md): the result's, then the minimized run's timeline."""
    from pgrace.render.json import run_to_dict

    return {**found.to_dict(), "timeline": run_to_dict(found.timeline) if found.timeline is not None else None}
