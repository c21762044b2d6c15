"""Import cycles in pgrace, at module and package level, lazy imports included.

A function-level import is a dependency as real as a top-level one: it only
moves the moment the cycle bites. So every `import` and `from ... import` in a
module's AST counts, wherever it sits. Between packages, `if TYPE_CHECKING:`
blocks count too, as import-linter's layers count them (pyproject.toml): a type
a package names is one its readers must know. Between modules they are left out:
a module may name for the type checker a type of the module that imports it (a
mixin its host's types, a session protocol the steps it runs), and that never runs.

Package level: each child of pgrace/ is one unit, a subpackage (``pgrace.render``)
or a module (``pgrace.errors``). The flat modules are layers of their own, so lumping
them into one ``pgrace`` node would hide every cycle among them behind one that
always exists; ``--folders`` shows that coarser graph too.

    python -m tools.import_graph            # print cycles, exit 1 if any
    python -m tools.import_graph --edges    # also print every edge between units
    python -m tools.import_graph --folders  # also the cycles between folders
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "pgrace"

Graph = dict[str, set[str]]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, type_checking: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if not type_checking and isinstance(node, ast.If) and _type_checking_only(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _resolve(name: str, known: set[str]) -> str | None:
    """The longest known module that `name` names (a.b.c may be a.b's attribute c)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def build(root: Path = ROOT, package: str = PACKAGE, type_checking: bool = True) -> Graph:
    """Who imports whom; ``type_checking``: the imports for the type checker alone too."""
    files = sorted((root / package).rglob("*.py"))
    known = {module_name(f, root) for f in files}
    graph: Graph = {m: set() for m in known}
    for f in files:
        me = module_name(f, root)
        here = me if is_package(f) else me.rpartition(".")[0]
        for node in _imports(ast.parse(f.read_text(), str(f)), type_checking):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" for a in node.names] or [base]
            for t in targets:
                dep = _resolve(t, known)
                if dep is not None and dep != me:
                    graph[me].add(dep)
    return graph


def unit_of(module: str, graph: Graph) -> str:
    """The child of the top package that holds ``module``: ``pgrace.render.text`` -> ``pgrace.render``."""
    return ".".join(module.split(".")[:2])


def folder_of(module: str, graph: Graph) -> str:
    """The folder a module lies in: itself for a package's __init__, else its parent."""
    is_pkg = any(other.startswith(module + ".") for other in graph)
    return module if is_pkg else module.rpartition(".")[0] or module


def collapse(graph: Graph, key: Callable[[str, Graph], str]) -> Graph:
    """The graph between groups of modules, ``key`` naming each module's group."""
    groups: Graph = {}
    for mod, deps in graph.items():
        src = key(mod, graph)
        groups.setdefault(src, set())
        for d in deps:
            dst = key(d, graph)
            if dst != src:
                groups[src].add(dst)
    return groups


def cycles(graph: Graph) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def witness(graph: Graph, component: Iterable[str]) -> list[str]:
    """One shortest closed path through the component's first node, to show how it closes."""
    members = set(component)
    start = min(members)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph.get(v, set()) & members):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    return [start]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", action="store_true", help="print every edge between units")
    parser.add_argument("--folders", action="store_true", help="also print the cycles between folders")
    args = parser.parse_args(argv)
    graph = build()
    running = build(type_checking=False)  # between modules: what runs (see the module's docstring)
    if args.edges:
        for mod in sorted(graph):
            for dep in sorted(graph[mod]):
                if unit_of(dep, graph) != unit_of(mod, graph):
                    print(f"{mod} -> {dep}")
    bad = 0
    for level, g in (("module", running), ("package", collapse(graph, unit_of))):
        for component in cycles(g):
            bad += 1
            print(f"{level} cycle of {len(component)}: {' '.join(component)}")
            print(f"  e.g. {' -> '.join(witness(g, component))}")
    if not bad:
        print("no import cycle at module or package level")
    if args.folders:
        folders = collapse(graph, folder_of)
        for component in cycles(folders):
            print(f"folder cycle of {len(component)}: {' '.join(component)}")
            print(f"  e.g. {' -> '.join(witness(folders, component))}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
