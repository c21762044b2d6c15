"""Which SQL can be kept inside a scratch schema: decided before any of it runs.

In schema mode (``--allow-scratch-schema``) a run lives in a throwaway schema of the
user's own database, next to the user's tables. Every connection of the run has only
that schema on its ``search_path`` (see :mod:`pgrace.scratch`), so an unqualified name
resolves there, in ``pg_temp`` or in ``pg_catalog``, never in ``public``. What that
cannot confine is refused here, up front, with the reason: names qualified with another
schema, changing ``search_path``, statements that act on the database, roles, the server
or files, dynamic SQL that cannot be read before it runs, and writes to the catalogs.

The check uses PostgreSQL's own parser (pglast) and walks every statement, including the
bodies of SQL and PL/pgSQL functions and ``DO`` blocks. Its limits, said plainly: a name
hidden in a string is only seen where PostgreSQL turns a string into a name (casts to
``regclass`` and friends, ``nextval`` and the other functions in ``_NAME_ARGUMENTS``);
functions installed into ``pg_catalog`` by the user's extensions run as their authors
wrote them; ``NOTIFY`` and advisory locks are shared by the whole database.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import pglast
from pglast import ast
from pglast.enums import GrantTargetType, ObjectType, ReindexObjectType, TransactionStmtKind, VariableSetKind

from pgrace.errors import ScenarioError
from pgrace.model import Scenario

__all__ = ["confine_scenario", "refusal", "sql_texts"]

# Schemas a statement may name: the catalogs (read; writes are refused below) and the
# session's own temporary schema.
_OPEN_SCHEMAS = frozenset({"pg_catalog", "information_schema", "pg_temp"})

# Statements that act inside the current search_path, once their names are checked.
_CONFINABLE = frozenset(
    {
        "SelectStmt",
        "InsertStmt",
        "UpdateStmt",
        "DeleteStmt",
        "MergeStmt",
        "TransactionStmt",
        "CreateStmt",
        "CreateTableAsStmt",
        "ViewStmt",
        "IndexStmt",
        "AlterTableStmt",
        "DropStmt",
        "TruncateStmt",
        "LockStmt",
        "VariableSetStmt",
        "VariableShowStmt",
        "CreateSeqStmt",
        "AlterSeqStmt",
        "CreateFunctionStmt",
        "AlterFunctionStmt",
        "DoStmt",
        "CallStmt",
        "CreateTrigStmt",
        "CreateDomainStmt",
        "AlterDomainStmt",
        "CompositeTypeStmt",
        "CreateEnumStmt",
        "AlterEnumStmt",
        "CreateRangeStmt",
        "DefineStmt",
        "RuleStmt",
        "CreatePolicyStmt",
        "AlterPolicyStmt",
        "CreateStatsStmt",
        "CommentStmt",
        "RenameStmt",
        "GrantStmt",
        "ExplainStmt",
        "PrepareStmt",
        "ExecuteStmt",
        "DeallocateStmt",
        "DeclareCursorStmt",
        "FetchStmt",
        "ClosePortalStmt",
        "ListenStmt",
        "UnlistenStmt",
        "NotifyStmt",
        "CopyStmt",
        "VacuumStmt",
        "ClusterStmt",
        "ReindexStmt",
        "RefreshMatViewStmt",
        "DiscardStmt",
        "ConstraintsSetStmt",
    }
)

# What the refused statements are called in SQL, for the message.
_COMMANDS = {
    "CreatedbStmt": "CREATE DATABASE",
    "DropdbStmt": "DROP DATABASE",
    "AlterDatabaseStmt": "ALTER DATABASE",
    "AlterDatabaseSetStmt": "ALTER DATABASE",
    "AlterDatabaseRefreshCollStmt": "ALTER DATABASE",
    "CreateRoleStmt": "CREATE ROLE",
    "AlterRoleStmt": "ALTER ROLE",
    "AlterRoleSetStmt": "ALTER ROLE",
    "DropRoleStmt": "DROP ROLE",
    "GrantRoleStmt": "GRANT or REVOKE of a role",
    "AlterSystemStmt": "ALTER SYSTEM",
    "CreateSchemaStmt": "CREATE SCHEMA",
    "CreateExtensionStmt": "CREATE EXTENSION",
    "AlterExtensionStmt": "ALTER EXTENSION",
    "AlterExtensionContentsStmt": "ALTER EXTENSION",
    "DropOwnedStmt": "DROP OWNED",
    "ReassignOwnedStmt": "REASSIGN OWNED",
    "AlterDefaultPrivilegesStmt": "ALTER DEFAULT PRIVILEGES",
    "CreateEventTrigStmt": "CREATE EVENT TRIGGER",
    "AlterEventTrigStmt": "ALTER EVENT TRIGGER",
    "CreateTableSpaceStmt": "CREATE TABLESPACE",
    "DropTableSpaceStmt": "DROP TABLESPACE",
    "AlterTableSpaceOptionsStmt": "ALTER TABLESPACE",
    "AlterTableMoveAllStmt": "ALTER TABLE ALL IN TABLESPACE",
    "AlterObjectSchemaStmt": "SET SCHEMA",
    "AlterOwnerStmt": "OWNER TO",
    "LoadStmt": "LOAD",
    "CheckPointStmt": "CHECKPOINT",
    "CreatePublicationStmt": "CREATE PUBLICATION",
    "CreateSubscriptionStmt": "CREATE SUBSCRIPTION",
    "CreateForeignServerStmt": "CREATE SERVER",
    "CreateFdwStmt": "CREATE FOREIGN DATA WRAPPER",
    "CreateUserMappingStmt": "CREATE USER MAPPING",
    "ImportForeignSchemaStmt": "IMPORT FOREIGN SCHEMA",
    "CreatePLangStmt": "CREATE LANGUAGE",
    "CreateCastStmt": "CREATE CAST",
    "CreateTransformStmt": "CREATE TRANSFORM",
    "CreateAmStmt": "CREATE ACCESS METHOD",
    "SecLabelStmt": "SECURITY LABEL",
}

# Objects that live in a schema (the scratch one, once their names are checked).
_SCHEMA_OBJECTS = frozenset(
    {
        ObjectType.OBJECT_TABLE,
        ObjectType.OBJECT_VIEW,
        ObjectType.OBJECT_MATVIEW,
        ObjectType.OBJECT_INDEX,
        ObjectType.OBJECT_SEQUENCE,
        ObjectType.OBJECT_FUNCTION,
        ObjectType.OBJECT_PROCEDURE,
        ObjectType.OBJECT_ROUTINE,
        ObjectType.OBJECT_AGGREGATE,
        ObjectType.OBJECT_TYPE,
        ObjectType.OBJECT_DOMAIN,
        ObjectType.OBJECT_TRIGGER,
        ObjectType.OBJECT_RULE,
        ObjectType.OBJECT_POLICY,
        ObjectType.OBJECT_STATISTIC_EXT,
        ObjectType.OBJECT_COLUMN,
        ObjectType.OBJECT_TABCONSTRAINT,
        ObjectType.OBJECT_DOMCONSTRAINT,
        ObjectType.OBJECT_ATTRIBUTE,
    }
)
# Objects named by their table first (``trigger ON table``): the schema comes one name earlier.
_ON_A_TABLE = frozenset(
    {
        ObjectType.OBJECT_TRIGGER,
        ObjectType.OBJECT_RULE,
        ObjectType.OBJECT_POLICY,
        ObjectType.OBJECT_COLUMN,
        ObjectType.OBJECT_TABCONSTRAINT,
    }
)

# Functions that act outside the schema: files, large objects, other backends, the server.
_OUTSIDE_FUNCTIONS = frozenset(
    {
        "pg_terminate_backend",
        "pg_cancel_backend",
        "pg_reload_conf",
        "pg_rotate_logfile",
        "pg_promote",
        "pg_switch_wal",
        "pg_log_backend_memory_contexts",
        "pg_import_system_collations",
        "pg_stat_file",
        "loread",
        "lowrite",
    }
)
_OUTSIDE_PREFIXES = (
    "lo_",
    "pg_read_",
    "pg_ls_",
    "pg_file_",
    "pg_stat_reset",
    "pg_create_",
    "pg_drop_replication",
    "pg_replication_origin",
    "pg_backup_",
    "dblink",
)
# Functions and casts that turn a string into an object name (the string is checked as a name).
_NAME_ARGUMENTS = frozenset(
    {
        "nextval",
        "setval",
        "currval",
        "pg_get_serial_sequence",
        "pg_relation_size",
        "pg_total_relation_size",
        "pg_table_size",
        "pg_indexes_size",
        "pg_relation_filepath",
        "pg_relation_filenode",
        "pg_get_viewdef",
        "pgrowlocks",
        "has_table_privilege",
        "has_sequence_privilege",
        "has_column_privilege",
        "has_function_privilege",
        "to_regclass",
        "to_regproc",
        "to_regprocedure",
        "to_regtype",
        "to_regoper",
        "to_regoperator",
        "to_regcollation",
    }
)
_NAME_TYPES = frozenset(
    {"regclass", "regproc", "regprocedure", "regtype", "regoper", "regoperator", "regcollation", "regconfig"}
)
_SCHEMA_FUNCTIONS = frozenset({"to_regnamespace", "has_schema_privilege"})
_CHECKABLE_LANGUAGES = frozenset({"sql", "plpgsql"})


class _Refused(Exception):
    """Raised by the walk at the first statement that cannot be confined."""


def refusal(text: str, prepared: Iterable[str] = ()) -> str | None:
    """Why ``text`` cannot be confined to a scratch schema, or None when it can.

    ``prepared`` holds the two-phase transaction names that the same scenario prepares
    itself: only those may be committed or rolled back.
    """
    try:
        _check_text(text, frozenset(prepared) | frozenset(_prepared_in(text)))
    except _Refused as exc:
        return str(exc)
    return None


def confine_scenario(scenario: Scenario) -> None:
    """Raise :class:`ScenarioError` (``file:line``) at the first SQL of ``scenario`` that schema mode refuses."""
    texts = list(sql_texts(scenario))
    prepared = frozenset(gid for text, _ in texts for gid in _prepared_in(text))
    for text, line in texts:
        reason = refusal(text, prepared)
        if reason is not None:
            raise ScenarioError(
                f"refused in a scratch schema (--allow-scratch-schema): {reason}", scenario.source, line
            )


def sql_texts(scenario: Scenario) -> Iterator[tuple[str, int | None]]:
    """Every SQL text the scenario would run, with the line it comes from, its variables filled in.

    Parameters are known; what steps capture is not yet: a captured value stands in as
    NULL, and as an identifier as ``pgrace_variable`` (so ``:"v".t`` is seen qualified).
    """
    from pgrace.variables import Value, find, param_values, substitute

    params = param_values(scenario)

    def filled(text: str) -> str:
        if scenario.format != "pgrace":
            return text
        values = {
            use.key: params.get(use.key) or Value("pgrace_variable" if use.form == "identifier" else None)
            for use in find(text)
        }
        return substitute(text, values)

    for text in scenario.setup:
        yield filled(text), scenario.setup_line
    for session in scenario.sessions:
        for block in (session.setup, session.teardown):
            if block is not None:
                yield filled(block), session.line
    for step in scenario.steps:
        if step.sleep is None and step.crash is None:  # those are pgrace's own actions, not SQL
            yield filled(step.sql), step.line
    for check in scenario.checks:
        yield filled(check.sql), check.line
    for text in scenario.teardown:
        yield filled(text), scenario.setup_line


def _prepared_in(text: str) -> Iterator[str]:
    try:
        statements = pglast.parse_sql(text)
    except pglast.parser.ParseError:
        return
    for raw in statements:
        stmt = raw.stmt
        if isinstance(stmt, ast.TransactionStmt) and stmt.kind == TransactionStmtKind.TRANS_STMT_PREPARE:
            yield str(stmt.gid)


def _check_text(text: str, prepared: frozenset[str], quote: bool = True) -> None:
    """``quote``: say which statement (a function body's statements are told by their function)."""
    try:
        statements = pglast.parse_sql(text)
    except pglast.parser.ParseError as exc:
        raise _Refused(f"cannot be parsed, so it cannot be checked ({exc}): {_excerpt(text)}") from None
    encoded = text.encode()
    for raw in statements:
        start = raw.stmt_location or 0
        end = start + raw.stmt_len if raw.stmt_len else len(encoded)
        source = encoded[start:end].decode(errors="replace").strip()
        try:
            if raw.stmt is not None:
                _check_statement(raw.stmt, source, prepared)
        except _Refused as exc:
            if not quote:
                raise
            raise _Refused(f"{_excerpt(source)} {exc}") from None


def _excerpt(source: str) -> str:
    flat = " ".join(source.split())
    return f"`{flat if len(flat) <= 80 else flat[:77] + '...'}`"


def _command(stmt: ast.Node, source: str) -> str:
    name = type(stmt).__name__
    if name in _COMMANDS:
        return _COMMANDS[name]
    words = source.upper().split()
    return " ".join(words[:2]) if words else name


def _object_word(kind: Any) -> str:
    return ObjectType(kind).name.removeprefix("OBJECT_").replace("_", " ")


def _check_statement(stmt: ast.Node, source: str, prepared: frozenset[str]) -> None:
    """Statement-level rules first, then every name anywhere inside it."""
    kind = type(stmt).__name__
    if kind not in _CONFINABLE:
        raise _Refused(f"is {_command(stmt, source)}, which acts outside the scratch schema")
    if isinstance(stmt, ast.DropStmt) and stmt.removeType not in _SCHEMA_OBJECTS:
        raise _Refused(f"is DROP {_object_word(stmt.removeType)}, which acts outside the scratch schema")
    if isinstance(stmt, ast.CommentStmt) and stmt.objtype not in _SCHEMA_OBJECTS:
        raise _Refused(f"is COMMENT ON {_object_word(stmt.objtype)}, which acts outside the scratch schema")
    if isinstance(stmt, ast.RenameStmt) and stmt.renameType not in _SCHEMA_OBJECTS:
        raise _Refused(f"is ALTER {_object_word(stmt.renameType)}, which acts outside the scratch schema")
    if isinstance(stmt, ast.GrantStmt):
        if stmt.targtype == GrantTargetType.ACL_TARGET_ALL_IN_SCHEMA:
            schemas = ", ".join(str(s.sval) for s in stmt.objects or ())
            raise _Refused(f"grants on every object IN SCHEMA {schemas}, outside the scratch schema")
        if stmt.objtype not in _SCHEMA_OBJECTS:
            raise _Refused(f"grants on a {_object_word(stmt.objtype)}, which is outside the scratch schema")
    ends_prepared = (TransactionStmtKind.TRANS_STMT_COMMIT_PREPARED, TransactionStmtKind.TRANS_STMT_ROLLBACK_PREPARED)
    if isinstance(stmt, ast.TransactionStmt) and stmt.kind in ends_prepared and stmt.gid not in prepared:
        raise _Refused(f"ends the prepared transaction '{stmt.gid}', which this scenario does not prepare")
    if isinstance(stmt, ast.CopyStmt) and (stmt.is_program or stmt.filename is not None):
        where = "a PROGRAM" if stmt.is_program else "a server file"
        raise _Refused(f"copies {'from' if stmt.is_from else 'to'} {where}, outside the database")
    if isinstance(stmt, ast.VacuumStmt | ast.ClusterStmt) and not _targets(stmt):
        raise _Refused("names no table, so it would work on every table of the database")
    if isinstance(stmt, ast.ReindexStmt) and stmt.kind not in (
        ReindexObjectType.REINDEX_OBJECT_INDEX,
        ReindexObjectType.REINDEX_OBJECT_TABLE,
    ):
        raise _Refused("is REINDEX of a whole schema, database or system, outside the scratch schema")
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
        raise _Refused(f"names {catalog}.{schema}.{name}: another database")
    if schema is not None and schema not in _OPEN_SCHEMAS:
        raise _Refused(f"names {schema}.{name}, outside the scratch schema")


def _check_object_names(node: Any) -> None:
    kind = getattr(node, "removeType", None) or getattr(node, "objtype", None) or getattr(node, "renameType", None)
    depth = 2 if kind in _ON_A_TABLE else 1
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
    if name in _OUTSIDE_FUNCTIONS or name.startswith(_OUTSIDE_PREFIXES):
        raise _Refused(f"calls {name}, which acts outside the scratch schema")
    args = list(call.args or ())
    if name == "set_config":
        setting = _string_constant(args[0]) if args else None
        if setting is None:
            raise _Refused("calls set_config with a setting name pgrace cannot read before the run")
        if setting.strip().lower() == "search_path":
            raise _Refused("sets search_path, which would leave the scratch schema")
    if name in _NAME_ARGUMENTS:
        for arg in args[:1]:
            _check_string_name(_string_constant(arg))
    if name in _SCHEMA_FUNCTIONS:
        for arg in args:
            _check_string_schema(_string_constant(arg))


def _check_cast(cast: ast.TypeCast) -> None:
    parts = _strings(cast.typeName.names if cast.typeName else None) or []
    if not parts:
        return
    if parts[-1] in _NAME_TYPES:
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
        if parts and parts[0] not in _OPEN_SCHEMAS:
            raise _Refused(f"names schema {parts[0]}, outside the scratch schema")


def _check_set(stmt: ast.VariableSetStmt) -> None:
    if (stmt.name or "").lower() == "search_path" and stmt.kind not in (
        VariableSetKind.VAR_RESET,
        VariableSetKind.VAR_RESET_ALL,
    ):
        raise _Refused("sets search_path, which would leave the scratch schema")


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
        raise _Refused(f"writes to or locks the system catalog {qualified}")


# -- function bodies ---------------------------------------------------------------------


def _options(options: Any) -> dict[str, Any]:
    return {str(o.defname): o.arg for o in options or () if isinstance(o, ast.DefElem)}


def _check_function(stmt: ast.CreateFunctionStmt, source: str, prepared: frozenset[str]) -> None:
    options = _options(stmt.options)
    language = _strings(options.get("language")) or ["sql"]
    lang = language[0].lower()
    if lang not in _CHECKABLE_LANGUAGES:
        raise _Refused(f"is written in LANGUAGE {lang}, whose body pgrace cannot check")
    body = _strings(options.get("as"))
    if body is None:
        return  # BEGIN ATOMIC: its statements are walked with the rest
    if lang == "sql":
        for text in body:
            _check_text(text, prepared, quote=False)
    else:
        _check_plpgsql(source, prepared)


def _check_do(stmt: ast.DoStmt, prepared: frozenset[str]) -> None:
    options = _options(stmt.args)
    lang = (_strings(options.get("language")) or ["plpgsql"])[0].lower()
    if lang != "plpgsql":
        raise _Refused(f"is a DO block in LANGUAGE {lang}, whose body pgrace cannot check")
    body = "".join(_strings(options.get("as")) or [])
    tag = "$pgrace_do$"
    while tag in body:
        tag = tag[:-1] + "_$"
    _check_plpgsql(f"CREATE FUNCTION pgrace_do() RETURNS void LANGUAGE plpgsql AS {tag}{body}{tag}", prepared)


def _check_plpgsql(source: str, prepared: frozenset[str]) -> None:
    try:
        tree = pglast.parse_plpgsql(source)
    except pglast.parser.ParseError as exc:
        raise _Refused(f"has a PL/pgSQL body that cannot be parsed, so it cannot be checked ({exc})") from None
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
            raise _Refused("runs dynamic SQL (EXECUTE), which pgrace cannot check before it runs")
        if key == "PLpgSQL_expr":
            _check_plpgsql_expression(str(value.get("query", "")), int(value.get("parseMode", 0)), prepared)
            continue
        _walk_plpgsql(value, prepared)


def _check_plpgsql_expression(query: str, mode: int, prepared: frozenset[str]) -> None:
    """PL/pgSQL keeps each embedded query as text, with how PostgreSQL will parse it."""
    if mode == 0:  # a whole statement
        _check_text(query, prepared, quote=False)
        return
    if mode >= 3:  # an assignment, ``target := expression``
        _, sep, value = query.partition(":=")
        query = value if sep else query.partition("=")[2]
    _check_text(f"SELECT {query}", prepared, quote=False)
