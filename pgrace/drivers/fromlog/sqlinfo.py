"""What a logged statement touches, read with PostgreSQL's own parser (pglast).

The scenario writer needs, per statement: its tables, the rows its WHERE names by
equality (the keys to copy or to lock), the columns it uses (to guess a table the log
does not describe), and a statement that takes the same row locks without writing.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Touch", "analyse", "key_parameters", "lock_statement", "quoted"]


def quoted(name: str) -> str:
    """An identifier as SQL text: a table or column name from the log may hold anything ``"a; DROP …"`` does."""
    from pglast.stream import maybe_double_quote_name

    return str(maybe_double_quote_name(name))


@dataclass
class Touch:
    """A statement's target table, WHERE clause, keys (``col = literal``) and the columns it names."""

    kind: str = ""
    table: str | None = None
    where: str | None = None
    keys: list[dict[str, Any]] = field(default_factory=list)
    columns: dict[str, str] = field(default_factory=dict)
    tables: list[str] = field(default_factory=list)
    schema: str | None = None
    """The target table's schema when the statement names one (``hr.salaries``), else None."""
    positional: list[str] = field(default_factory=list)
    """The types of an INSERT's values when it names no columns (``INSERT INTO t VALUES (1, 'x')``)."""

    @property
    def relation(self) -> str | None:
        """The target table as SQL text, with its schema when the statement gave one: ``hr.salaries``."""
        if self.table is None:
            return None
        return f"{quoted(self.schema)}.{quoted(self.table)}" if self.schema else quoted(self.table)


def _const(node: Any) -> tuple[Any, str] | None:
    from pglast import ast

    if isinstance(node, ast.A_Const) and not node.isnull:
        val = node.val
        if isinstance(val, ast.Integer):
            return val.ival, "int"
        if isinstance(val, ast.Float):
            return val.fval, "numeric"
        if isinstance(val, ast.String):
            # A bound parameter is logged quoted ('42' for an int): the text, typed by what it spells.
            return val.sval, _NUMBER.get(_spelled(str(val.sval)), "text")
        if isinstance(val, ast.Boolean):
            return val.boolval, "boolean"
    if isinstance(node, ast.TypeCast):
        return _const(node.arg)
    return None


_NUMBER = {"integer": "int", "decimal": "numeric"}


def _spelled(text: str) -> str:
    """Whether ``text`` spells an integer, a decimal number, or neither."""
    if re.fullmatch(r"-?\d{1,18}", text):
        return "integer"
    if re.fullmatch(r"-?\d+\.\d+", text):
        return "decimal"
    return ""


def _column(node: Any) -> str | None:
    from pglast import ast

    if isinstance(node, ast.ColumnRef) and node.fields and isinstance(node.fields[-1], ast.String):
        return str(node.fields[-1].sval)
    return None


def _keys(where: Any) -> list[dict[str, Any]]:
    """The rows a WHERE names: ``a = 1 AND b = 'x'`` is one key, ``id IN (1, 2)`` two."""
    from pglast import ast
    from pglast.enums import A_Expr_Kind, BoolExprType

    if isinstance(where, ast.BoolExpr) and where.boolop == BoolExprType.AND_EXPR:
        keys: list[dict[str, Any]] = [{}]
        for arg in where.args or ():
            part = _keys(arg)
            if part:
                keys = [{**k, **p} for k in keys for p in part]
        return [k for k in keys if k]
    if isinstance(where, ast.A_Expr) and where.name and getattr(where.name[0], "sval", "") == "=":
        col = _column(where.lexpr)
        if col is None:
            return []
        if where.kind == A_Expr_Kind.AEXPR_OP and (c := _const(where.rexpr)) is not None:
            return [{col: c[0]}]
        if where.kind == A_Expr_Kind.AEXPR_IN and isinstance(where.rexpr, tuple):
            values = [_const(v) for v in where.rexpr]
            return [{col: v[0]} for v in values if v is not None]
    return []


def _walk_columns(node: Any, out: dict[str, str]) -> None:
    """Every column named in an expression, typed by a literal it is compared or combined with."""
    from pglast import ast

    if isinstance(node, ast.A_Expr):
        col = _column(node.lexpr) or _column(node.rexpr)
        other = node.rexpr if _column(node.lexpr) else node.lexpr
        lit = _const(other) if not isinstance(other, tuple) else (_const(other[0]) if other else None)
        if col is not None:
            out.setdefault(col, lit[1] if lit else "int")
        _walk_columns(node.lexpr, out)
        _walk_columns(node.rexpr, out)
    elif isinstance(node, ast.BoolExpr):
        for arg in node.args or ():
            _walk_columns(arg, out)
    elif isinstance(node, tuple):
        for item in node:
            _walk_columns(item, out)
    elif (col := _column(node)) is not None:
        out.setdefault(col, "int")


@functools.lru_cache(maxsize=4096)
def analyse(sql: str) -> Touch:
    """What ``sql`` touches; an empty :class:`Touch` when pglast cannot parse it (a cut statement)."""
    import pglast
    from pglast import ast
    from pglast.stream import RawStream

    touch = Touch()
    try:
        parsed = pglast.parse_sql(sql)
    except pglast.parser.ParseError:
        return touch
    if len(parsed) != 1:
        return touch
    stmt = parsed[0].stmt
    touch.kind = type(stmt).__name__
    where = None
    if isinstance(stmt, (ast.UpdateStmt, ast.DeleteStmt, ast.InsertStmt)) and stmt.relation is not None:
        touch.table, touch.schema = stmt.relation.relname, stmt.relation.schemaname
        where = getattr(stmt, "whereClause", None)
    elif isinstance(stmt, ast.SelectStmt) and stmt.fromClause and len(stmt.fromClause) == 1:
        if isinstance(stmt.fromClause[0], ast.RangeVar):
            touch.table, touch.schema = stmt.fromClause[0].relname, stmt.fromClause[0].schemaname
        where = stmt.whereClause
    if touch.table:
        touch.tables.append(touch.table)
    if where is not None:
        touch.where = RawStream()(where)
        touch.keys = _keys(where)
        _walk_columns(where, touch.columns)
    if isinstance(stmt, ast.UpdateStmt):
        for target in stmt.targetList or ():
            if isinstance(target, ast.ResTarget) and target.name:
                found: dict[str, str] = {}
                _walk_columns(target.val, found)
                lit = _const(target.val)
                touch.columns.setdefault(target.name, lit[1] if lit else next(iter(found.values()), "int"))
    rows = getattr(stmt.selectStmt, "valuesLists", None) or () if isinstance(stmt, ast.InsertStmt) else ()
    first = rows[0] if rows else ()
    if isinstance(stmt, ast.InsertStmt) and not stmt.cols:  # INSERT INTO t VALUES (...): by position
        touch.positional = [(c or (None, "text"))[1] for c in map(_const, first)]
    if isinstance(stmt, ast.InsertStmt) and stmt.cols:
        for i, target in enumerate(stmt.cols):
            lit = _const(first[i]) if i < len(first) else None
            touch.columns.setdefault(target.name, lit[1] if lit else "text")
    return touch


def lock_statement(sql: str) -> str | None:
    """A statement that locks the rows ``sql`` writes (its table, its WHERE) without writing them."""
    touch = analyse(sql)
    if touch.table is None or touch.kind not in ("UpdateStmt", "DeleteStmt", "SelectStmt"):
        return None
    where = f" WHERE {touch.where}" if touch.where else ""
    return f"SELECT 1 FROM {touch.relation}{where} FOR UPDATE"


def key_parameters(sql: str) -> set[int]:
    """The ``$N`` a statement's WHERE compares a column with by equality (``id = $2``): the row's key."""
    import pglast
    from pglast import ast
    from pglast.enums import BoolExprType

    try:
        parsed = pglast.parse_sql(sql)
    except pglast.parser.ParseError:
        return set()
    if len(parsed) != 1:
        return set()
    found: set[int] = set()

    def walk(node: Any) -> None:
        if isinstance(node, ast.BoolExpr) and node.boolop == BoolExprType.AND_EXPR:
            for arg in node.args or ():
                walk(arg)
        elif isinstance(node, ast.A_Expr) and node.name and getattr(node.name[0], "sval", "") == "=":
            values = node.rexpr if isinstance(node.rexpr, tuple) else (node.rexpr,)
            if _column(node.lexpr) is not None:
                found.update(int(v.number or 0) for v in values if isinstance(v, ast.ParamRef))

    walk(getattr(parsed[0].stmt, "whereClause", None))
    return found
