"""What ``pgrace from-log`` tells on stderr: the incidents, what the log did not say, the verdict.

Log text is hostile (any client can put ESC in a statement or an application_name): every
line is made visible before it reaches a terminal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pgrace.text import visible

if TYPE_CHECKING:
    from pgrace.model.fromlog import FromLog

__all__ = ["incident_list", "report_lines"]


def incident_list(result: FromLog) -> list[str]:
    """One line per incident, numbered as ``--incident`` takes them."""
    return [visible(f"{n}. {incident.summary}") for n, incident in enumerate(result.incidents, 1)]


def report_lines(result: FromLog) -> list[str]:
    """The stderr report: which incident was written, what the log did not say, and whether it came back."""
    out = []
    total = len(result.incidents)
    if result.chosen is not None and result.incident is not None:
        out.append(f"pgrace: from-log: incident {result.chosen} of {total}: {result.incident.summary}")
    if result.skipped:
        out.append(f"pgrace: from-log: {result.skipped} line(s) skipped: not log records of the file's format")
    out += [f"pgrace: from-log: {u}" for u in result.unreadable]
    if result.written is not None:
        out.append("pgrace: from-log: what the log did not say:")
        out += [f"pgrace:   - {u}" for u in result.written.unsaid]
        if result.written.copied:
            out.append("pgrace: from-log: copied from the database --dsn names (review them before sharing the file):")
            out += [f"pgrace:   - {c}" for c in result.written.copied]
    verified = result.verified
    if verified is not None and verified.reproduced:
        if verified.order is None:
            out.append("pgrace: from-log: reproduced: the scenario's run showed the incident's waits and outcome:")
        else:
            out.append(
                f"pgrace: from-log: reproduced in another order, found among {verified.explored} interleavings "
                f"({', '.join(verified.order)}); the file has that order:"
            )
        out += [f"pgrace:   ✔ {check.description}" for check in verified.run.checks] if verified.run else []
    elif result.not_checked is not None:
        out.append(f"pgrace: from-log: not checked (the scenario is written): {result.not_checked}")
    elif verified is not None:
        out.append("pgrace: from-log: NOT reproduced: " + "; ".join(verified.failures[:3]))
        if verified.out_of_time is not None:
            out.append(
                f"pgrace: from-log: verification stopped at its {verified.out_of_time:g} s limit, "
                f"after {verified.explored} other interleaving(s)"
            )
    if result.minimized is not None:
        from pgrace.render.minimize import render_minimized_text

        out.append("pgrace: from-log: minimized (the scenario written):")
        out += [
            f"pgrace:   {line}" if line else "pgrace:"
            for line in render_minimized_text(result.minimized, timeline=False).splitlines()
        ]
    elif result.not_minimized is not None:
        out.append(f"pgrace: from-log: not minimized: {result.not_minimized}")
    return [visible(line) for line in out]
