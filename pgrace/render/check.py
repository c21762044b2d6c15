"""What `pgrace check` prints: one line per case, its problems, and the server matrix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tabulate import tabulate

from pgrace.errors import ScenarioError
from pgrace.model.cases import CaseVerdict, differs_across_servers
from pgrace.servers import ServerInfo
from pgrace.text import visible

if TYPE_CHECKING:
    from pgrace.model.cases import Checked


def render_results(results: Sequence[CaseVerdict], with_server: bool = False) -> str:
    """``PASS  name  (0.05 s)``, then, for a failure, what was expected against what happened."""
    lines: list[str] = []
    for result in results:
        where = f" on {result.server.label}" if with_server else ""
        mark = "PASS" if result.ok else "FAIL"
        note = " (golden timeline written)" if result.updated else ""
        if result.guarantee:  # a bounded search: what it covered, never every interleaving
            note += f"\n      bounded: {result.guarantee}"
        lines.append(f"{mark}  {result.case.name:<36} {result.case.path}{where}  ({result.seconds:.2f} s){note}")
        for problem in result.problems:
            lines.append(f"      ✘ {problem}")
        if result.diff:  # as diff -U3 prints it, so that patch(1) can apply it
            lines.extend(result.diff.rstrip("\n").splitlines())
    return visible("\n".join(lines) + "\n") if lines else ""  # names, paths, diffs: any text


def render_invalid(error: ScenarioError) -> str:
    """``INVALID  file:line: message``: a file ``check`` could not read; the others still run."""
    return visible(f"INVALID  {' '.join(str(error).split())}\n")


def render_matrix(results: Sequence[CaseVerdict], servers: Sequence[ServerInfo]) -> str:
    """One row per case, one column per server (its version in the header); ≠ where they differ."""
    by_case: dict[tuple[str, str], dict[str, CaseVerdict]] = {}
    for result in results:
        by_case.setdefault((str(result.case.path), result.case.name), {})[result.server.label] = result
    rows = []
    for (_, name), per_server in by_case.items():
        cells = [("PASS" if r.ok else "FAIL") if (r := per_server.get(s.label)) else "-" for s in servers]
        differs = differs_across_servers(list(per_server.values()))
        rows.append([name, *cells, "≠ differs" if differs else ""])
    headers = ["scenario", *(_header(s) for s in servers), ""]
    return visible("\n" + tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True) + "\n\n")


def _header(server: ServerInfo) -> str:
    """The server's name with its version, which a connection string alone does not show."""
    return server.label if server.version in server.label else f"PostgreSQL {server.version} at {server.label}"


def render_total(checked: Checked, update: bool = False) -> str:
    """``12 checks: 11 passed, 1 failed``, the files not run, and (``update``) the golden timelines written."""
    results, failed = checked.verdicts, checked.failed
    total = f"{len(results)} checks: {len(results) - failed} passed, {failed} failed"
    if checked.invalid:
        total += f"; {len(checked.invalid)} invalid file{'s' if len(checked.invalid) != 1 else ''} not run"
    if update:
        updated = sum(1 for r in results if r.updated)
        total += f"; {updated} golden timeline{'s' if updated != 1 else ''} written"
    return total


def render_summary(checked: Checked, update: bool = False) -> str:
    """The end of a check: the server matrix when there were several servers, then the total."""
    matrix = render_matrix(checked.verdicts, checked.servers) if len(checked.servers) > 1 else ""
    return f"{matrix}{render_total(checked, update)}\n"
