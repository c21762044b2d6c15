"""Which rows a step's SQL reads and which keys it makes, read with PostgreSQL's parser.

A footprint shows what a transaction locked and changed; what a plain read looked at, and
the keys of the rows an INSERT made, no lock shows. The text says them, when it can be
trusted to say everything: only in a database where no SQL runs that a statement's text
does not show (``closed``: no trigger, rule or function of its own), and only for a
statement of one plain table (no row-level security, no inheritance children) whose every
node is on a short list (no subquery, function call, CTE, join, parameter or cursor).

* A read (SELECT, UPDATE, DELETE, SELECT ... FOR UPDATE without SKIP LOCKED or NOWAIT) is
  narrowed to the keys its WHERE fixes: an equality on every primary key column, ANDed,
  each to a literal (a captured variable or a code run's bound parameter arrives as one)
  or an ``IN`` list of them; an integer key to an integer literal, a text or varchar key
  of a deterministic collation to a string. Anything else reads every row.
* An INSERT of VALUES reads its keys (its unique check) and makes them; its key comes
  from its literals, or from its RETURNING (the rows the server returned); a default key
  not returned is unknown. Where the table has another unique index or an exclusion
  constraint, its unique checks read rows no key names: every row.
* An UPDATE that assigns a primary key column makes keys not known, and reads every row;
  so does one of a table with another unique index.
* A statement outside these (INSERT ... SELECT, a CTE, a function call, a view or a
  partitioned target) reads every row of every table it touches, and may make any key in
  every table its transaction writes.
* Transaction control, settings and LOCK TABLE read no row.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Effect", "Shape", "effect_of", "in_physical_order", "record_text", "shapes"]

#: The most keys a read is narrowed to (an IN list times another): beyond, every row.
MOST_KEYS = 1000


@dataclass(frozen=True)
class Shape:
    """A table as one footprint reading saw it (see :mod:`pgrace.engine.observe.footprints`)."""

    name: str  # schema.table, quoted as the footprint names it
    schema: str
    relname: str
    relkind: str
    narrowable: bool  # no row-level security, no inheritance children
    keyed: bool  # the primary key is its only unique index or exclusion constraint
    key: tuple[tuple[str, str, int], ...]  # (column, int|text|other, position) of the primary key


def shapes(entries: Iterable[str]) -> dict[str, Shape]:
    """The ``table|`` entries of a reading, by table name."""
    out = {}
    for entry in entries:
        if entry.startswith("table|"):
            name, schema, relname, relkind, narrowable, keyed, key = json.loads(entry[6:])
            out[name] = Shape(name, schema, relname, relkind, narrowable, keyed, tuple((c, k, p) for c, k, p in key))
    return out


@dataclass(frozen=True)
class Effect:
    """What a step's text says it read and made, table by table.

    ``quiet``: it reads no row of any table. Otherwise a table of its footprint that is not
    in ``scans`` is read whole. ``made`` gives the keys made in a table (None: not known);
    ``made_anywhere``: it may have made keys not known in every table its transaction writes.
    """

    quiet: bool = False
    scans: Mapping[str, frozenset[str] | None] = field(default_factory=dict)
    made: Mapping[str, frozenset[str] | None] = field(default_factory=dict)
    made_anywhere: bool = False
    writes: bool = True  # it may insert, update or delete rows


UNKNOWN = Effect(made_anywhere=True)
QUIET_STATEMENTS = {"TransactionStmt", "VariableSetStmt", "VariableShowStmt", "LockStmt"}

# Every node a narrowed statement may hold: no subquery, function call, CTE, join, parameter, cursor.
ALLOWED = {
    "SelectStmt",
    "UpdateStmt",
    "DeleteStmt",
    "InsertStmt",
    "RangeVar",
    "Alias",
    "ResTarget",
    "ColumnRef",
    "String",
    "Integer",
    "Float",
    "Boolean",
    "A_Const",
    "A_Expr",
    "BoolExpr",
    "TypeCast",
    "TypeName",
    "A_Star",
    "NullTest",
    "BooleanTest",
    "SortBy",
    "LockingClause",
    "RowExpr",
    "ReturningClause",
    "MultiAssignRef",
    "CoalesceExpr",
    "CaseExpr",
    "CaseWhen",
    "OnConflictClause",
    "InferClause",
    "IndexElem",
}
WRITES = {"InsertStmt", "UpdateStmt", "MergeStmt"}


def record_text(values: Iterable[str]) -> str:
    """``ROW(...)::text`` of these columns' text, as the footprint names a row (record_out's quoting)."""
    out = []
    for value in values:
        if value == "" or any(c in value for c in '"\\(),') or any(c.isspace() for c in value):
            value = '"' + value.replace("\\", "\\\\").replace('"', '""') + '"'
        out.append(value)
    return "(" + ",".join(out) + ")"


def effect_of(
    text: str, tables: Mapping[str, Shape], closed: bool, returned: Any = None, probes: bool = False
) -> Effect:
    """What the step's SQL ``text`` (as sent) reads and makes, given the tables of its footprint.

    ``returned``: its last result (a :class:`~pgrace.model.timeline.ResultSet`), for RETURNING.
    ``probes``: SKIP LOCKED, NOWAIT, ON CONFLICT, MERGE: what it reads is every row.
    """

    try:
        statements = parsed(text)
    except Exception:  # what pglast cannot take says nothing
        return UNKNOWN
    kinds = [type(s).__name__ for s in statements]
    if all(k in QUIET_STATEMENTS for k in kinds):
        return Effect(quiet=True, writes=False)
    if not closed or probes:
        return UNKNOWN
    scans: dict[str, frozenset[str] | None] = {}
    made: dict[str, frozenset[str] | None] = {}
    anywhere = False
    writes = False
    for statement, kind, nodes in zip(statements, kinds, node_kinds(text), strict=True):
        if kind in QUIET_STATEMENTS:
            continue
        writes = writes or bool(nodes & (WRITES | {"DeleteStmt", "FuncCall"}))
        one = _statement(statement, kind, nodes, tables, returned if len(statements) == 1 else None)
        if one is None:
            anywhere = anywhere or bool(nodes & (WRITES | {"FuncCall"}))
            continue
        for name, keys in one.scans.items():
            scans[name] = _union(scans.get(name, frozenset()), keys)
        for name, keys in one.made.items():
            made[name] = _union(made.get(name, frozenset()), keys)
        anywhere = anywhere or one.made_anywhere
    return Effect(False, scans, made, anywhere, writes)


@functools.lru_cache(maxsize=4096)
def parsed(text: str) -> tuple[Any, ...]:
    """The statements of ``text``, parsed once: every run of a search sends the same texts, and
    building pglast's nodes was half of what folding a run into moves cost. Only read, never changed."""
    import pglast

    return tuple(raw.stmt for raw in pglast.parse_sql(text))


@functools.lru_cache(maxsize=4096)
def node_kinds(text: str) -> tuple[frozenset[str], ...]:
    """The kinds of node in each statement of ``text``, walked once: most of what is asked of a statement at every
    run of a search is whether some kind of node is in it."""
    return tuple(frozenset(type(n).__name__ for n in _walk(statement)) for statement in parsed(text))


def in_physical_order(text: str, tables: Mapping[str, Shape]) -> bool:
    """Whether a final check's rows may come in the order they lie on disk (which the order of
    writes to different rows changes): anything but SELECTs (subqueries too) each ordered by
    ORDER BY, of no table, or of order-blind aggregates alone (an ORDER BY's ties are taken
    as broken by its columns)."""

    try:
        statements = parsed(text)
    except Exception:
        return True
    if any(type(s).__name__ != "SelectStmt" for s in statements):
        return True
    nodes = [n for s in statements for n in _walk(s)]
    inner = {id(n.subselect) for n in nodes if type(n).__name__ == "SubLink"}  # one value, or a set
    for select in (n for n in nodes if type(n).__name__ == "SelectStmt"):
        if int(select.op) != 0:
            return True
        if id(select) in inner:
            calls = (f for t in select.targetList or () for f in _walk(t.val) if type(f).__name__ == "FuncCall")
            if not all(_order_blind(f) for f in calls):
                return True
            continue
        if select.sortClause or not select.fromClause or _one_row(select, tables):
            continue
        if select.groupClause or not all(_aggregated(t.val) for t in select.targetList or ()):
            return True
    return False


def _one_row(select: Any, tables: Mapping[str, Shape]) -> bool:
    """A SELECT of one table whose WHERE fixes its primary key to one value."""
    if len(select.fromClause) != 1 or type(select.fromClause[0]).__name__ != "RangeVar":
        return False
    shape = _resolve(select.fromClause[0], tables)
    if shape is None:
        return False
    keys = _keys_of(select.whereClause, shape, select.fromClause[0])
    return keys is not None and len(keys) <= 1


def _aggregated(node: Any) -> bool:
    """Every column it reads is inside an order-blind aggregate: one value, whatever the rows' order."""
    from pglast import ast

    if type(node).__name__ == "FuncCall" and _order_blind(node):
        return True
    if type(node).__name__ in ("ColumnRef", "FuncCall"):
        return type(node).__name__ == "FuncCall" and all(_aggregated(a) for a in node.args or ())
    if type(node).__name__ == "SubLink":
        return True  # its SELECT is looked at on its own
    if isinstance(node, ast.Node):
        return all(_aggregated(getattr(node, name, None)) for name in getattr(type(node), "__slots__", ()))
    if isinstance(node, list | tuple):
        return all(_aggregated(item) for item in node)
    return True


ORDER_BLIND = {"count", "sum", "min", "max", "avg", "bool_and", "bool_or", "every"}


def _order_blind(node: Any) -> bool:
    """An aggregate whose value does not hang on the order of its rows."""
    if type(node).__name__ != "FuncCall" or node.over is not None:
        return False
    name = getattr(node.funcname[-1], "sval", "")
    return name in ORDER_BLIND or bool(node.agg_order)


def _union(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
    return None if a is None or b is None else a | b


def _walk(node: Any) -> Iterator[Any]:
    from pglast import ast

    if isinstance(node, ast.Node):
        yield node
        for name in getattr(type(node), "__slots__", ()):
            yield from _walk(getattr(node, name, None))
    elif isinstance(node, list | tuple):
        for item in node:
            yield from _walk(item)


def _resolve(rv: Any, tables: Mapping[str, Shape]) -> Shape | None:
    """The one plain, narrowable table of the footprint a RangeVar names (None: not exactly one)."""
    if rv is None or getattr(rv, "catalogname", None):
        return None
    found = [
        s for s in tables.values() if s.relname == rv.relname and (rv.schemaname is None or s.schema == rv.schemaname)
    ]
    if len(found) != 1 or found[0].relkind != "r" or not found[0].narrowable:
        return None
    return found[0]


def _statement(
    statement: Any, kind: str, nodes: frozenset[str], tables: Mapping[str, Shape], returned: Any
) -> Effect | None:
    """One statement's effect (``nodes``: the kinds of node in it), or None when it is not one this module narrows."""
    if not nodes <= ALLOWED:
        return None
    if getattr(statement, "withClause", None) is not None:
        return None
    if kind == "SelectStmt":
        if statement.intoClause is not None or len(statement.fromClause or ()) != 1:
            return None
        if any(int(lc.waitPolicy) != 0 for lc in statement.lockingClause or ()):
            return None  # SKIP LOCKED, NOWAIT
        shape = _resolve(statement.fromClause[0], tables)
        if shape is None:
            return None
        return Effect(scans={shape.name: _keys_of(statement.whereClause, shape, statement.fromClause[0])})
    if kind == "DeleteStmt":
        shape = _resolve(statement.relation, tables)
        if shape is None or statement.usingClause:
            return None
        return Effect(scans={shape.name: _keys_of(statement.whereClause, shape, statement.relation)})
    if kind == "UpdateStmt":
        shape = _resolve(statement.relation, tables)
        if shape is None or statement.fromClause:
            return None
        assigned = {t.name for t in statement.targetList or ()}
        if assigned & {c for c, _, _ in shape.key} or not shape.keyed:
            return Effect(scans={shape.name: None}, made={shape.name: None})
        return Effect(scans={shape.name: _keys_of(statement.whereClause, shape, statement.relation)})
    if kind == "InsertStmt":
        return _insert(statement, tables, returned)
    return None


def _insert(statement: Any, tables: Mapping[str, Shape], returned: Any) -> Effect | None:
    shape = _resolve(statement.relation, tables)
    values = statement.selectStmt
    if shape is None or values is None or not values.valuesLists or values.fromClause:
        return None
    conflict = statement.onConflictClause
    if conflict is not None and {t.name for t in conflict.targetList or ()} & {c for c, _, _ in shape.key}:
        return Effect(scans={shape.name: None}, made={shape.name: None})
    columns = [t.name for t in statement.cols] if statement.cols else None
    keys: set[str] | None = set()
    for row in values.valuesLists:
        texts = []
        for column, sort, position in shape.key:
            index = columns.index(column) if columns is not None and column in columns else None
            if columns is None:
                index = position - 1
            value = _constant(row[index], sort) if index is not None and index < len(row) else None
            if value is None:
                keys = None
                break
            texts.append(value)
        if keys is None:
            break
        keys.add(record_text(texts))
    if keys is None:
        keys = _returned_keys(statement, shape, returned)
    made = None if keys is None else frozenset(keys)
    return Effect(scans={shape.name: made if shape.keyed else None}, made={shape.name: made})


def _returned_keys(statement: Any, shape: Shape, returned: Any) -> set[str] | None:
    """The keys the server returned, when RETURNING names every key column plainly (or ``*``)."""
    clause = statement.returningClause
    if returned is None or clause is None:
        return None
    star = False
    plain = set()
    for target in clause.exprs or ():
        fields = getattr(target.val, "fields", None)
        if not fields or len(fields) != 1:
            continue
        if type(fields[0]).__name__ == "A_Star":
            star = True
        elif target.name is None or target.name == fields[0].sval:
            plain.add(fields[0].sval)
    columns = list(returned.columns)
    positions = []
    for column, _, _ in shape.key:
        if not (star or column in plain) or columns.count(column) != 1:
            return None
        positions.append(columns.index(column))
    out = set()
    for row in returned.text_rows:
        cells = [row[p] for p in positions]
        if any(c is None for c in cells):
            return None
        out.add(record_text(c for c in cells if c is not None))
    return out


def _constant(node: Any, sort: str) -> str | None:
    """A key column's value as its text output, from a literal; None: not one that is known."""
    if type(node).__name__ != "A_Const" or node.isnull:
        return None
    value = node.val
    kind = type(value).__name__
    if sort == "int":
        if kind == "Integer":
            return str(int(value.ival))
        raw = value.fval if kind == "Float" else value.sval if kind == "String" else None
        if raw is not None and re.fullmatch(r"\s*[+-]?[0-9]+\s*", raw):
            return str(int(raw))
        return None
    if sort == "text" and kind == "String":
        return str(value.sval)
    return None


def _keys_of(where: Any, shape: Shape, rv: Any) -> frozenset[str] | None:
    """The keys an ANDed WHERE fixes every primary key column to (None: any row)."""
    if not shape.key or where is None:
        return None
    alias = rv.alias.aliasname if rv.alias is not None else rv.relname
    sorts = {c: s for c, s, _ in shape.key}
    fixed: dict[str, set[str]] = {}
    conjuncts = list(where.args) if type(where).__name__ == "BoolExpr" and int(where.boolop) == 0 else [where]
    for conjunct in conjuncts:
        for column, values in _equalities(conjunct, sorts, alias):
            fixed[column] = fixed[column] & values if column in fixed else values
    if set(fixed) != set(sorts):
        return None
    columns = [c for c, _, _ in shape.key]
    if any(not fixed[c] for c in columns):
        return frozenset()
    count = 1
    for c in columns:
        count *= len(fixed[c])
    if count > MOST_KEYS:
        return None
    return frozenset(record_text(p) for p in itertools.product(*(sorted(fixed[c]) for c in columns)))


def _column(node: Any, sorts: Mapping[str, str], alias: str) -> str | None:
    if type(node).__name__ != "ColumnRef":
        return None
    names = [getattr(f, "sval", None) for f in node.fields]
    if len(names) == 2 and names[0] == alias:
        names = names[1:]
    return names[0] if len(names) == 1 and names[0] in sorts else None


def _equalities(node: Any, sorts: Mapping[str, str], alias: str) -> Iterator[tuple[str, set[str]]]:
    """``column = literal``, ``literal = column``, ``column IN (literals)``, ``(a, b) = (x, y)``."""
    if type(node).__name__ != "A_Expr" or [getattr(n, "sval", None) for n in node.name or ()] != ["="]:
        return
    kind = int(node.kind)
    if kind == 6:  # AEXPR_IN ('=' : IN, not NOT IN)
        column = _column(node.lexpr, sorts, alias)
        if column is not None:
            values = [_constant(v, sorts[column]) for v in node.rexpr]
            if all(v is not None for v in values):
                yield column, {v for v in values if v is not None}
        return
    if kind != 0:
        return
    left, right = node.lexpr, node.rexpr
    if type(left).__name__ == "RowExpr" and type(right).__name__ == "RowExpr" and len(left.args) == len(right.args):
        pairs = list(zip(left.args, right.args, strict=True))
    else:
        pairs = [(left, right)]
    for a, b in pairs:
        for col_node, const_node in ((a, b), (b, a)):
            column = _column(col_node, sorts, alias)
            if column is not None:
                value = _constant(const_node, sorts[column])
                if value is not None:
                    yield column, {value}
