"""Smaller versions of one step's SQL, one change each, read and printed by PostgreSQL's parser (pglast).

What a SQL reducer tries once the statements that matter are known: a select list or a
``RETURNING`` list without one of its columns, an ``UPDATE`` without one of its ``SET``
items, a condition without one of its ``AND`` terms, a literal made plain (a number 0 or
1, a string ''; not in a condition or a ``LIMIT``, where it picks the rows). Whether a
change is kept is the server's answer (the shrink runs it); this module only proposes.
Only ``SELECT``, ``INSERT``, ``UPDATE`` and ``DELETE`` are changed; text the parser cannot
read, or print back, is left as written.

A scenario's ``:variables`` are not SQL: each is read as a parameter (``$N``) and written
back as the author wrote it. A column a step captures is never dropped.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pgrace.model import variables

__all__ = ["Edit", "simpler"]

_FIRST_PARAM = 9000  # variables become $9000, $9001 ...: far above any parameter a step could hold
_PARAM = re.compile(r"\$(9\d{3})(?!\d)")
_CHANGED = ("SelectStmt", "InsertStmt", "UpdateStmt", "DeleteStmt")

Path = tuple[tuple[str, int | None], ...]


@dataclass(frozen=True)
class Edit:
    """One change: what it does, in a few words, and the step's whole text after it."""

    what: str
    sql: str


def simpler(sql: str, captured: frozenset[str] = frozenset()) -> list[Edit]:
    """Each one-change smaller version of ``sql`` (columns, then ``AND`` terms, then literals); none if unreadable.

    ``captured``: the columns the step captures, never dropped.
    """
    from pglast import parse_sql
    from pglast.parser import ParseError

    uses = variables.find(sql)
    if any(u.form == "identifier" for u in uses) or _PARAM.search(sql):
        return []  # a variable standing for a name is no parameter; a $9xxx of the step's own would be confused
    text = sql
    for k, use in reversed(list(enumerate(uses))):
        text = text[: use.start] + f"${_FIRST_PARAM + k}" + text[use.end :]
    try:
        statements = [raw.stmt for raw in parse_sql(text)]
        printed = [_print(s) for s in statements]
    except (ParseError, Exception):  # pglast prints what it parsed; a node it cannot print leaves the text alone
        return []
    edits: list[Edit] = []
    seen = {"; ".join(printed)}
    for kind in ("column", "term", "literal"):
        for index, statement in enumerate(statements):
            if type(statement).__name__ not in _CHANGED:
                continue
            for what, changed in _changes(statement, kind, captured):
                try:
                    again = [*printed[:index], _print(changed), *printed[index + 1 :]]
                except Exception:
                    continue
                joined = "; ".join(again)
                if joined in seen:
                    continue
                seen.add(joined)
                edits.append(Edit(_restore(what, uses), _restore(joined, uses)))
    return edits


def _print(node: Any) -> str:
    from pglast.stream import RawStream

    return str(RawStream()(node))


def _restore(text: str, uses: list[variables.Use]) -> str:
    return _PARAM.sub(lambda m: uses[int(m.group(1)) - _FIRST_PARAM].written, text)


def _nodes(node: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    from pglast import ast

    yield path, node
    for attr in node.__slots__:
        value = getattr(node, attr, None)
        if isinstance(value, ast.Node):
            yield from _nodes(value, (*path, (attr, None)))
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                if isinstance(item, ast.Node):
                    yield from _nodes(item, (*path, (attr, i)))


def _at(root: Any, path: Path) -> Any:
    node = root
    for attr, index in path:
        node = getattr(node, attr) if index is None else getattr(node, attr)[index]
    return node


def _with(root: Any, path: Path, value: Any) -> Any:
    """A copy of ``root`` with the node at ``path`` replaced by ``value`` (``None`` in a list: removed)."""
    changed = copy.deepcopy(root)
    *up, (attr, index) = path
    parent = _at(changed, tuple(up))
    if index is None:
        setattr(parent, attr, value)
    else:
        items = list(getattr(parent, attr))
        if value is None:
            del items[index]
        else:
            items[index] = value
        setattr(parent, attr, tuple(items))
    return changed


def _name(target: Any) -> str | None:
    """The column a select-list or RETURNING item is read back as (its alias, or the column it names)."""
    from pglast import ast

    if target.name:
        return str(target.name)
    value = target.val
    if isinstance(value, ast.ColumnRef) and value.fields and isinstance(value.fields[-1], ast.String):
        return str(value.fields[-1].sval)
    return None


def _short(node: Any) -> str:
    try:
        text = _print(node)
    except Exception:
        text = type(node).__name__
    return text if len(text) <= 50 else text[:49] + "…"


#: Where a literal says which rows a statement touches: changed, it touches others (or none) and the
#: candidate mostly hangs until its step timeout; dropping the whole term is tried instead.
_CONDITIONS = ("whereClause", "havingClause", "quals", "limitCount", "limitOffset")


def _picks_rows(path: Path) -> bool:
    return not path or any(attr in _CONDITIONS for attr, _ in path)


def _changes(statement: Any, kind: str, captured: frozenset[str]) -> Iterator[tuple[str, Any]]:
    making = {"column": _columns, "term": _terms, "literal": _literals}[kind]
    for path, node in _nodes(statement):
        yield from making(statement, path, node, captured)


def _columns(statement: Any, path: Path, node: Any, captured: frozenset[str]) -> Iterator[tuple[str, Any]]:
    """A select list, a ``RETURNING`` list or an ``UPDATE``'s ``SET`` list without one of its items."""
    from pglast import ast

    lists: list[tuple[str, str]] = []
    if isinstance(node, ast.SelectStmt) and node.valuesLists is None:
        lists.append(("targetList", "column"))
    if isinstance(node, ast.UpdateStmt):
        lists.append(("targetList", "SET item"))
    if isinstance(node, ast.ReturningClause):
        lists.append(("exprs", "RETURNING item"))
    for attr, words in lists:
        items = getattr(node, attr) or ()
        if len(items) < 2:
            continue
        for i, item in enumerate(items):
            if words != "SET item" and isinstance(item, ast.ResTarget) and _name(item) in captured:
                continue
            shown = item.name if words == "SET item" else _short(item.val)
            yield f"drop the {words} {shown}", _with(statement, (*path, (attr, i)), None)


def _terms(statement: Any, path: Path, node: Any, captured: frozenset[str]) -> Iterator[tuple[str, Any]]:
    """A condition without one of its ``AND`` terms."""
    from pglast import ast
    from pglast.enums import BoolExprType

    if not (isinstance(node, ast.BoolExpr) and node.boolop == BoolExprType.AND_EXPR and path):
        return
    args = tuple(node.args or ())
    for i, term in enumerate(args):
        rest = args[:i] + args[i + 1 :]
        smaller = rest[0] if len(rest) == 1 else ast.BoolExpr(boolop=BoolExprType.AND_EXPR, args=rest)
        yield f"drop the AND term {_short(term)}", _with(statement, path, smaller)


def _literals(statement: Any, path: Path, node: Any, captured: frozenset[str]) -> Iterator[tuple[str, Any]]:
    """A literal made plain: a number 0, then 1; a string ''."""
    from pglast import ast

    if not isinstance(node, ast.A_Const) or node.isnull or _picks_rows(path):
        return
    value = node.val
    plain: list[Any] = []
    if (isinstance(value, ast.Integer) and value.ival not in (0, 1)) or isinstance(value, ast.Float):
        plain = [ast.Integer(ival=0), ast.Integer(ival=1)]
    elif isinstance(value, ast.String) and value.sval:
        plain = [ast.String(sval="")]
    for simple in plain:
        before, after = _short(node), _short(ast.A_Const(val=simple))
        yield f"the literal {before} as {after}", _with(statement, path, ast.A_Const(val=simple))
