"""The output formats, by what they draw and their name: ``(kind, name) -> "module:function"``.

A format is one entry here and one module with the function. The function takes the
result and a :class:`View` and returns the text. The CLI's ``--format`` choices and help
are read from this table; the modules are imported only when their format is asked for,
so that importing the CLI stays cheap (nothing but this table is loaded).

Kinds: ``list`` (the shipped scenarios' catalogue entries), ``run`` (a
:class:`~pgrace.model.timeline.Run`), ``compare`` (the bug's and the fix's runs), ``explore``,
``sweep``, ``matrix`` and ``load`` (what :mod:`pgrace.api`'s functions of those names
return).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: this module is imported with the CLI, and typing costs
if TYPE_CHECKING:
    from typing import Any

    from pgrace.render.views import View

FORMATS: dict[tuple[str, str], str] = {
    ("list", "text"): "pgrace.render.listing:list_text",
    ("list", "json"): "pgrace.render.listing:list_json",
    ("run", "text"): "pgrace.render.views:run_text",
    ("run", "json"): "pgrace.render.views:run_json",
    ("run", "isolation"): "pgrace.render.views:run_isolation",
    ("run", "html"): "pgrace.render.views:run_html",
    ("run", "svg"): "pgrace.render.views:run_svg",
    ("run", "mermaid"): "pgrace.render.views:run_mermaid",
    ("run", "markdown"): "pgrace.render.views:run_markdown",
    ("compare", "text"): "pgrace.render.views:compare_text",
    ("compare", "html"): "pgrace.render.views:compare_html",
    ("compare", "svg"): "pgrace.render.views:compare_svg",
    ("compare", "markdown"): "pgrace.render.views:compare_markdown",
    ("explore", "text"): "pgrace.render.views:explore_text",
    ("explore", "json"): "pgrace.render.views:explore_json",
    ("explore", "markdown"): "pgrace.render.views:explore_markdown",
    ("explore", "html"): "pgrace.render.views:explore_html",
    ("minimize", "text"): "pgrace.render.views:minimize_text",
    ("minimize", "json"): "pgrace.render.views:minimize_json",
    ("sweep", "text"): "pgrace.render.views:sweep_text",
    ("sweep", "json"): "pgrace.render.views:sweep_json",
    ("sweep", "markdown"): "pgrace.render.views:sweep_markdown",
    ("sweep", "html"): "pgrace.render.views:sweep_html",
    ("matrix", "text"): "pgrace.render.views:matrix_text",
    ("matrix", "json"): "pgrace.render.views:matrix_json",
    ("matrix", "markdown"): "pgrace.render.views:matrix_markdown",
    ("matrix", "html"): "pgrace.render.views:matrix_html",
    ("load", "text"): "pgrace.render.views:load_text",
    ("load", "json"): "pgrace.render.views:load_json",
    ("load", "svg"): "pgrace.render.views:load_svg",
    ("load", "html"): "pgrace.render.views:load_html",
}


def names(kind: str) -> tuple[str, ...]:
    """The format names of ``kind``, in the table's order (the first is the default)."""
    return tuple(name for k, name in FORMATS if k == kind)


def render(kind: str, fmt: str, result: Any, view: View | None = None) -> str:
    """``result`` drawn in format ``fmt`` (one of :func:`names` of ``kind``)."""
    import importlib

    from pgrace.render.views import View

    module, _, function = FORMATS[(kind, fmt)].partition(":")
    text: str = getattr(importlib.import_module(module), function)(result, view or View())
    return text
