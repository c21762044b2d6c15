"""Renderers of ``pgrace load`` results: a table (text), JSON, a plot (SVG) and an HTML page.

One variant or several side by side (``--compare``): the table has a row per client
count, the plot throughput and lock waiters against clients, a line per variant.
Scenario text and server text are escaped for the medium, as everywhere in pgrace.
"""

from __future__ import annotations

import json
import math
from html import escape as html_escape
from xml.sax.saxutils import escape as xml_escape

from tabulate import tabulate

from pgrace.model.load import MAX_LOG_BYTES, ClientRun, LoadSeries
from pgrace.render.common import ERROR_COLOUR, OK_COLOUR
from pgrace.text import json_safe, visible

COLOURS = {"bug": ERROR_COLOUR, "fix": OK_COLOUR}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _waiters(run: ClientRun) -> str:
    return str(run.lock_waiters_max) + (f" ({run.lock_waits_on})" if run.lock_waits_on else "")


def _waits(run: ClientRun) -> str:
    """Every logged wait of the count; "-" where the server's log could not be read."""
    return "-" if run.lock_waits is None else str(run.lock_waits) + ("+" if run.lock_waits_cut else "")


def _heading(results: list[LoadSeries]) -> str:
    first = results[0]
    variants = " vs ".join(r.variant for r in results)
    line = f"{first.scenario} ({variants}) under load, PostgreSQL {first.server_version}"
    if any(r.interrupted for r in results):
        line += " (interrupted: the runs measured so far)"
    return line


def render_load_text(results: list[LoadSeries]) -> str:
    """The table; with several variants, one row per client count and each variant's columns side by side."""
    lines = [visible(_heading(results)), ""]
    if len(results) == 1:
        rows = [
            [
                r.clients,
                f"{r.tps:.1f}",
                _ms(r.latency_ms["p50"]),
                _ms(r.latency_ms["p95"]),
                _ms(r.latency_ms["p99"]),
                r.failures,
                r.retries,
                _waiters(r),
                _waits(r),
                len(r.violations),
            ]
            for r in results[0].runs
        ]
        headers = [
            *("clients", "tps", "p50 ms", "p95 ms", "p99 ms", "failures", "retries"),
            *("lock waiters", "lock waits", "violations"),
        ]
    else:
        counts = sorted({run.clients for result in results for run in result.runs})
        names = " / ".join(r.variant for r in results)
        headers = [
            "clients",
            *(
                f"{what} ({names})"
                for what in ("tps", "p95 ms", "failures", "lock waiters", "lock waits", "violations")
            ),
        ]
        rows = []
        for count in counts:
            found = [next((r for r in result.runs if r.clients == count), None) for result in results]
            cells = [
                [
                    f"{r.tps:.1f}" if r else "-",
                    _ms(r.latency_ms["p95"]) if r else "-",
                    str(r.failures) if r else "-",
                    _waiters(r) if r else "-",
                    _waits(r) if r else "-",
                    str(len(r.violations)) if r else "-",
                ]
                for r in found
            ]
            rows.append([str(count), *(" / ".join(c[i] for c in cells) for i in range(6))])
    lines.append(visible(tabulate(rows, headers=headers, disable_numparse=True, colalign=("right",) * len(headers))))
    details = [
        f"  {result.variant}, {run.clients} clients: {v.check}: expected {v.expected}, actual {v.actual}"
        for result in results
        for run in result.runs
        for v in run.violations
    ]
    if details:
        lines += ["", "violations:", *(visible(d) for d in details)]
    waited = [
        f"  {result.variant}, {run.clients} clients: {_where(run)}"
        for result in results
        for run in result.runs
        if run.lock_waits
    ]
    if waited:
        lines += ["", "lock waits (every wait of 1 ms or more, from the server's log):", *(visible(w) for w in waited)]
    return "\n".join(lines) + "\n"


def _where(run: ClientRun) -> str:
    """A count's logged waits by what they waited on (the rows, by row version, are in the JSON)."""
    on = ", ".join(f"{n} on {what}" for what, n in run.lock_waits_by)
    text = f"{on}; {run.lock_waited_ms or 0:.1f} ms waited in all"
    if run.lock_waits_cut:
        text += f"; the log was cut after {MAX_LOG_BYTES >> 20} MiB: more waits than counted"
    return text


def render_load_json(results: list[LoadSeries]) -> str:
    """The load's JSON: one object, or with --compare a list of one per variant."""
    data = [r.to_json() for r in results]
    return json_safe(json.dumps(data[0] if len(data) == 1 else data, indent=2, ensure_ascii=False)) + "\n"


def render_load_svg(results: list[LoadSeries]) -> str:
    """Two panels: throughput against clients, and the most clients waiting on a lock at once."""
    width, panel_h, left, right, top = 760, 260, 70, 24, 56
    counts = sorted({run.clients for result in results for run in result.runs}) or [1]
    panels = [("throughput (transactions per second)", "tps"), ("clients waiting on a lock (most at once)", "waits")]
    height = top + len(panels) * (panel_h + 70) + 10
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif" role="img">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{left}" y="26" font-size="17" font-weight="bold" fill="#111827">'
        f"{xml_escape(visible(_heading(results)))}</text>",
    ]
    legend_x = left
    for result in results:
        colour = COLOURS.get(result.variant, "#2563eb")
        out.append(f'<rect x="{legend_x}" y="36" width="22" height="4" fill="{colour}"/>')
        name = xml_escape(visible(result.variant))
        out.append(f'<text x="{legend_x + 28}" y="42" font-size="13" fill="#374151">{name}</text>')
        legend_x += 90
    plot_w = width - left - right

    def x_of(count: int) -> float:
        if len(counts) == 1:
            return left + plot_w / 2
        return left + plot_w * counts.index(count) / (len(counts) - 1)

    for index, (title, key) in enumerate(panels):
        y0 = top + index * (panel_h + 70) + 24
        values = [
            (run.tps if key == "tps" else float(run.lock_waiters_max)) for result in results for run in result.runs
        ]
        high = max([*values, 1.0]) * 1.1
        if key == "waits":  # whole clients: a scale of 4 ticks that are whole numbers
            high = 4.0 * math.ceil(high / 4)
        out.append(f'<text x="{left}" y="{y0 - 8}" font-size="14" fill="#111827">{xml_escape(title)}</text>')
        out.append(f'<rect x="{left}" y="{y0}" width="{plot_w}" height="{panel_h}" fill="none" stroke="#d1d5db"/>')
        for tick in range(5):
            value = high * tick / 4
            y = y0 + panel_h - panel_h * tick / 4
            out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#f3f4f6"/>')
            label = f"{value:.0f}" if high >= 10 or key == "waits" else f"{value:.1f}"
            out.append(
                f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" fill="#4b5563">{label}</text>'
            )
        for count in counts:
            x = x_of(count)
            out.append(
                f'<text x="{x:.1f}" y="{y0 + panel_h + 16}" font-size="11" text-anchor="middle" fill="#4b5563">'
                f"{count}</text>"
            )
        out.append(
            f'<text x="{left + plot_w / 2:.1f}" y="{y0 + panel_h + 34}" font-size="12" text-anchor="middle" '
            'fill="#374151">clients</text>'
        )
        for result in results:
            colour = COLOURS.get(result.variant, "#2563eb")
            points = []
            for run in result.runs:
                value = run.tps if key == "tps" else float(run.lock_waiters_max)
                points.append((x_of(run.clients), y0 + panel_h - panel_h * value / high))
            if len(points) > 1:
                path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
                out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2.5"/>')
            for x, y in points:
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def render_load_html(results: list[LoadSeries]) -> str:
    """A self-contained page: the plot, the table and every violation."""
    heading = html_escape(visible(_heading(results)))
    body = [f"<h1>{heading}</h1>", f"<figure>{render_load_svg(results)}</figure>"]
    body.append(f"<pre>{html_escape(render_load_text(results))}</pre>")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{heading}</title>\n"
        "<style>body{font:16px/1.5 'DejaVu Sans',Arial,sans-serif;margin:24px 32px;color:#111827}"
        "pre{font:13px/1.4 'DejaVu Sans Mono',Menlo,monospace}svg{max-width:100%;height:auto}</style>\n"
        "</head>\n<body>\n" + "\n".join(body) + "\n</body>\n</html>\n"
    )
