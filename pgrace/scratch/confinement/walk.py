"""The walk over PostgreSQL's parse tree (pglast) that stops at the first statement schema mode cannot confine.

It goes into the bodies of SQL and PL/pgSQL functions and ``DO`` blocks, whose statements are
checked as the statements around them.
"""

from __future__ import annotations

import re
from typing import Any

import pglast
from pglast import ast
from pglast.enums import GrantTargetType, ObjectType, ReindexObjectType, TransactionStmtKind, VariableSetKind

from pgrace.scratch.confinement.rules import (
    CHECKABLE_LANGUAGES,
    COMMANDS,
    CONFINABLE,
    NAME_ARGUMENTS,
    NAME_TYPES,
    ON_A_TABLE,
    OPEN_SCHEMAS,
    OUTSIDE_FUNCTIONS,
    OUTSIDE_PREFIXES,
    SCHEMA_FUNCTIONS,
    SCHEMA_OBJECTS,
    Unconfined,
)


def check_text(text: str, prepared: frozenset[str], quote: bool = True) -> None:
    """``quote``: say which statement (a function body's statements are told by their function)."""
    try:
        statements = pglast.parse_sql(text)
    except pglast.parser.ParseError as exc:
        raise Unconfined(f"cannot be parsed, so it cannot be checked ({exc}): {_excerpt(text)}") from None
    encoded = text.encode()
    for raw in statements:
        start = raw.stmt_location or 0
        end = start + raw.stmt_len if raw.stmt_len else len(encoded)
        source = encoded[start:end].decode(errors="replace").strip()
        try:
            if raw.stmt is not None:
                _check_statement(raw.stmt, source, prepared)
        except Unconfined as exc:
            if not quote:
                raise
            raise Unconfined(f"{_excerpt(source)} {exc}") from None


def _excerpt(source: str) -> str:
    flat = " ".join(source.split())
    return f"`{flat if len(flat) <= 80 else flat[:77] + '...'}`"


def _command(stmt: ast.Node, source: str) -> str:
    name = type(stmt).__name__
    if name in COMMANDS:
        return COMMANDS[name]
    words = source.upper().split()
    return " ".join(words[:2]) if words else name


def _object_word(kind: Any) -> str:
    return ObjectType(kind).name.removeprefix("OBJECT_").replace("_", " ")


def _check_statement(stmt: ast.Node, source: str, prepared: frozenset[str]) -> None:
    """Statement-level rules first, then every name anywhere inside it."""
    kind = type(stmt).__name__
    if kind not in CONFINABLE:
        raise Unconfined(f"is {_command(stmt, source)}, which acts outside the scratch schema")
    if isinstance(stmt, ast.DropStmt) and stmt.removeType not in SCHEMA_OBJECTS:
        raise Unconfined(f"is DROP {_object_word(stmt.removeType)}, which acts outside the scratch schema")
    if isinstance(stmt, ast.CommentStmt) and stmt.objtype not in SCHEMA_OBJECTS:
        raise Unconfined(f"is COMMENT ON {_object_word(stmt.objtype)}, which acts outside the scratch schema")
    if isinstance(stmt, ast.RenameStmt) and stmt.renameType not in SCHEMA_OBJECTS:
        raise Unconfined(f"is ALTER {_object_word(stmt.renameType)}, which acts outside the scratch schema")
    if isinstance(stmt, ast.GrantStmt):
        if stmt.targtype == GrantTargetType.ACL_TARGET_ALL_IN_SCHEMA:
            schemas = ", ".join(str(s.sval) for s in stmt.objects or ())
            raise Unconfined(f"grants on every object IN SCHEMA {schemas}, outside the scratch schema")
        if stmt.objtype not in SCHEMA_OBJECTS:
            raise Unconfined(f"grants on a {_object_word(stmt.objtype)}, which is outside the scratch schema")
    ends_prepared = (TransactionStmtKind.TRANS_STMT_COMMIT_PREPARED, TransactionStmtKind.TRANS_STMT_ROLLBACK_PREPARED)
    if isinstance(stmt, ast.TransactionStmt) and stmt.kind in ends_prepared and stmt.gid not in prepared:
        raise Unconfined(f"ends the prepared transaction '{stmt.gid}', which this scenario does not prepare")
    if isinstance(stmt, ast.CopyStmt) and (stmt.is_program or stmt.filename is not None):
        where = "a PROGRAM" if stmt.is_program else "a server file"
        raise Unconfined(f"copies {'from' if stmt.is_from else 'to'} {where}, outside the database")
    if isinstance(stmt, ast.VacuumStmt | ast.ClusterStmt) and not _targets(stmt):
        raise Unconfined("names no table, so it would work on every table of the database")
    if isinstance(stmt, ast.ReindexStmt) and stmt.kind not in (
        ReindexObjectType.REINDEX_OBJECT_INDEX,
        ReindexObjectType.REINDEX_OBJECT_TABLE,
    ):
        raise Unconfined("is REINDEX of a whole schema, database or system, outside the scratch schema")
    if isinstance(stmt, ast.CreateFunctionStmt):
        _check_function(stmt, source, prepared)
    if isinstance(stmt, ast.DoStmt):
        _check_do(stmt, prepared)
    _check_written(stmt)
    _walk(stmt, prepared)


def _targets(stmt: ast.VacuumStmt | ast.ClusterStmt) -> bool:
    if isinstance(stmt, ast.VacuumStmt):
        return bool(stmt.rels)
    return stmt.relation is not None


def _walk(node: Any, prepared: frozenset[str]) -> None:
    """Every node below ``node``: qualified names, search_path, functions that act outside."""
    if isinstance(node, tuple | list):
        for item in node:
            _walk(item, prepared)
        return
    if not isinstance(node, ast.Node):
        return
    if isinstance(node, ast.RangeVar):
        _check_qualified([node.catalogname, node.schemaname, node.relname])
    elif isinstance(node, ast.FuncCall):
        _check_call(node)
    elif isinstance(node, ast.TypeName):
        _check_names(node.names, 1)
    elif isinstance(node, ast.ObjectWithArgs):
        _check_names(node.objname, 1)
    elif isinstance(node, ast.ColumnRef):
        _check_names(node.fields, 2)
    elif isinstance(node, ast.A_Expr) and node.name:
        _check_names(node.name, 1)
    elif isinstance(node, ast.CollateClause):
        _check_names(node.collname, 1)
    elif isinstance(node, ast.TypeCast):
        _check_cast(node)
    elif isinstance(node, ast.VariableSetStmt):
        _check_set(node)
    elif isinstance(node, ast.DefElem) and node.defname == "owned_by":
        _check_names(node.arg, 2)
    elif isinstance(node, ast.DropStmt | ast.CommentStmt | ast.RenameStmt):
        _check_object_names(node)
    elif isinstance(node, ast.CreateFunctionStmt | ast.AlterFunctionStmt):
        _check_names(getattr(node, "funcname", None), 1)
    elif isinstance(node, ast.CreateTrigStmt):
        _check_names(node.funcname, 1)
    elif isinstance(node, ast.DefineStmt | ast.CreateStatsStmt):
        _check_names(node.defnames, 1)
    elif isinstance(node, ast.CreateDomainStmt):
        _check_names(node.domainname, 1)
    elif isinstance(node, ast.CreateEnumStmt | ast.CreateRangeStmt | ast.AlterEnumStmt | ast.AlterDomainStmt):
        _check_names(node.typeName, 1)
    for attribute in node:
        _walk(getattr(node, attribute), prepared)


def _strings(names: Any) -> list[str] | None:
    """A name list (``schema.object``) as text, or None when it holds something else."""
    if names is None:
        return None
    if isinstance(names, ast.String):
        return [str(names.sval)]
    if not isinstance(names, tuple | list):
        return None
    out = []
    for item in names:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, ast.String):
            out.append(str(item.sval))
        elif isinstance(item, ast.A_Star):
            out.append("*")
        else:
            return None
    return out


def _check_names(names: Any, depth: int) -> None:
    """``depth`` names follow the schema (1: ``schema.object``; 2: ``schema.table.column``)."""
    parts = _strings(names)
    if parts is None or len(parts) <= depth:
        return
    head = parts[: len(parts) - depth + 1]
    _check_qualified([None] * (3 - len(head)) + head)


def _check_qualified(parts: list[str | None]) -> None:
    """``[catalog, schema, name]``, any of the first two None."""
    catalog, schema, name = parts[-3], parts[-2], parts[-1]
    if catalog is not None:
        raise Unconfined(f"names {catalog}.{schema}.{name}: another database")
    if schema is not None and schema not in OPEN_SCHEMAS:
        raise Unconfined(f"names {schema}.{name}, outside the scratch schema")


def _check_object_names(node: Any) -> None:
    kind = getattr(node, "removeType", None) or getattr(node, "objtype", None) or getattr(node, "renameType", None)
    depth = 2 if kind in ON_A_TABLE else 1
    objects = getattr(node, "objects", None)
    if objects is None and getattr(node, "object", None) is not None:
        objects = (node.object,)
    for item in objects or ():
        parts = _strings(item)
        if parts is not None:
            _check_names(parts, depth)
            if isinstance(node, ast.DropStmt) and kind in (ObjectType.OBJECT_TABLE, ObjectType.OBJECT_INDEX):
                _check_catalog_target(parts[-2] if len(parts) > 1 else None, parts[-1])


def _function_name(call: ast.FuncCall) -> tuple[str | None, str]:
    parts = _strings(call.funcname) or []
    return (parts[-2] if len(parts) > 1 else None, parts[-1] if parts else "")


def _check_call(call: ast.FuncCall) -> None:
    schema, name = _function_name(call)
    _check_names(call.funcname, 1)
    if schema not in (None, "pg_catalog"):
        return
    if name in OUTSIDE_FUNCTIONS or name.startswith(OUTSIDE_PREFIXES):
        raise Unconfined(f"calls {name}, which acts outside the scratch schema")
    args = list(call.args or ())
    if name == "set_config":
        setting = _string_constant(args[0]) if args else None
        if setting is None:
            raise Unconfined("calls set_config with a setting name pgrace cannot read before the run")
        if setting.strip().lower() == "search_path":
            raise Unconfined("sets search_path, which would leave the scratch schema")
    if name in NAME_ARGUMENTS:
        for arg in args[:1]:
            _check_string_name(_string_constant(arg))
    if name in SCHEMA_FUNCTIONS:
        for arg in args:
            _check_string_schema(_string_constant(arg))


def _check_cast(cast: ast.TypeCast) -> None:
    parts = _strings(cast.typeName.names if cast.typeName else None) or []
    if not parts:
        return
    if parts[-1] in NAME_TYPES:
        _check_string_name(_string_constant(cast.arg))
    elif parts[-1] == "regnamespace":
        _check_string_schema(_string_constant(cast.arg))


def _string_constant(node: Any) -> str | None:
    if isinstance(node, ast.A_Const) and isinstance(node.val, ast.String):
        return str(node.val.sval)
    if isinstance(node, ast.TypeCast):
        return _string_constant(node.arg)
    return None


_IDENTIFIER = re.compile(r'\s*("(?:[^"]|"")*"|[^."\s(]+)\s*')


def _split_name(text: str) -> list[str]:
    """A name as PostgreSQL reads it from a string (``"My Schema".t``): its dotted parts."""
    parts: list[str] = []
    rest = text
    while True:
        match = _IDENTIFIER.match(rest)
        if match is None:
            return parts
        token = match.group(1)
        parts.append(token[1:-1].replace('""', '"') if token.startswith('"') else token.lower())
        rest = rest[match.end() :]
        if not rest.startswith("."):
            return parts
        rest = rest[1:]


def _check_string_name(text: str | None) -> None:
    if text is not None:
        parts = _split_name(text)
        if len(parts) > 1:
            _check_names(parts[-3:] if len(parts) > 2 else parts, 1)


def _check_string_schema(text: str | None) -> None:
    if text is not None:
        parts = _split_name(text)
        if parts and parts[0] not in OPEN_SCHEMAS:
            raise Unconfined(f"names schema {parts[0]}, outside the scratch schema")


def _check_set(stmt: ast.VariableSetStmt) -> None:
    if (stmt.name or "").lower() == "search_path" and stmt.kind not in (
        VariableSetKind.VAR_RESET,
        VariableSetKind.VAR_RESET_ALL,
    ):
        raise Unconfined("sets search_path, which would leave the scratch schema")


def _check_written(stmt: ast.Node) -> None:
    """Writing to (or locking) a catalog table reaches every schema at once."""
    targets: list[Any] = []
    if isinstance(
        stmt,
        ast.InsertStmt
        | ast.UpdateStmt
        | ast.DeleteStmt
        | ast.MergeStmt
        | ast.AlterTableStmt
        | ast.IndexStmt
        | ast.CreateTrigStmt
        | ast.RuleStmt
        | ast.ClusterStmt
        | ast.RefreshMatViewStmt
        | ast.RenameStmt,
    ):
        targets.append(getattr(stmt, "relation", None))
    elif isinstance(stmt, ast.CreatePolicyStmt | ast.AlterPolicyStmt):
        targets.append(stmt.table)
    elif isinstance(stmt, ast.TruncateStmt | ast.LockStmt):
        targets.extend(stmt.relations or ())
    elif isinstance(stmt, ast.VacuumStmt):
        targets.extend(rel.relation for rel in stmt.rels or ())
    elif isinstance(stmt, ast.CopyStmt) and stmt.is_from:
        targets.append(stmt.relation)
    for target in targets:
        if isinstance(target, ast.RangeVar):
            _check_catalog_target(target.schemaname, str(target.relname))


def _check_catalog_target(schema: str | None, name: str) -> None:
    if schema in ("pg_catalog", "information_schema") or (schema is None and name.startswith("pg_")):
        qualified = f"{schema}.{name}" if schema else name
        raise Unconfined(f"writes to or locks the system catalog {qualified}")


# -- function bodies ---------------------------------------------------------------------


def _options(options: Any) -> dict[str, Any]:
    return {str(o.defname): o.arg for o in options or () if isinstance(o, ast.DefElem)}


def _check_function(stmt: ast.CreateFunctionStmt, source: str, prepared: frozenset[str]) -> None:
    options = _options(stmt.options)
    language = _strings(options.get("language")) or ["sql"]
    lang = language[0].lower()
    if lang not in CHECKABLE_LANGUAGES:
        raise Unconfined(f"is written in LANGUAGE {lang}, whose body pgrace cannot check")
    body = _strings(options.get("as"))
    if body is None:
        return  # BEGIN ATOMIC: its statements are walked with the rest
    if lang == "sql":
        for text in body:
            check_text(text, prepared, quote=False)
    else:
        _check_plpgsql(source, prepared)


def _check_do(stmt: ast.DoStmt, prepared: frozenset[str]) -> None:
    options = _options(stmt.args)
    lang = (_strings(options.get("language")) or ["plpgsql"])[0].lower()
    if lang != "plpgsql":
        raise Unconfined(f"is a DO block in LANGUAGE {lang}, whose body pgrace cannot check")
    body = "".join(_strings(options.get("as")) or [])
    tag = "$pgrace_do$"
    while tag in body:
        tag = tag[:-1] + "_$"
    _check_plpgsql(f"CREATE FUNCTION pgrace_do() RETURNS void LANGUAGE plpgsql AS {tag}{body}{tag}", prepared)


def _check_plpgsql(source: str, prepared: frozenset[str]) -> None:
    try:
        tree = pglast.parse_plpgsql(source)
    except pglast.parser.ParseError as exc:
        raise Unconfined(f"has a PL/pgSQL body that cannot be parsed, so it cannot be checked ({exc})") from None
    _walk_plpgsql(tree, prepared)


_DYNAMIC = ("PLpgSQL_stmt_dynexecute", "PLpgSQL_stmt_dynfors")


def _walk_plpgsql(node: Any, prepared: frozenset[str]) -> None:
    if isinstance(node, list):
        for item in node:
            _walk_plpgsql(item, prepared)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key in _DYNAMIC or key == "dynquery":
            raise Unconfined("runs dynamic SQL (EXECUTE), which pgrace cannot check before it runs")
        if key == "PLpgSQL_expr":
            _check_plpgsql_expression(str(value.get("query", "")), int(value.get("parseMode", 0)), prepared)
            continue
        _walk_plpgsql(value, prepared)


def _check_plpgsql_expression(query: str, mode: int, prepared: frozenset[str]) -> None:
    """PL/pgSQL keeps each embedded query as text, with how PostgreSQL will parse it."""
    if mode == 0:  # a whole statement
        check_text(query, prepared, quote=False)
        return
    if mode >= 3:  # an assignment, ``target := expression``
        _, sep, value = query.partition(":=")
        query = value if sep else query.partition("=")[2]
    check_text(f"SELECT {query}", prepared, quote=False)
