"""What schema mode lets through: the statements, objects, functions and names it can keep inside the scratch schema."""

from __future__ import annotations

from pglast.enums import ObjectType

# Schemas a statement may name: the catalogs (read; writes are refused below) and the
# session's own temporary schema.
OPEN_SCHEMAS = frozenset({"pg_catalog", "information_schema", "pg_temp"})

# Statements that act inside the current search_path, once their names are checked.
CONFINABLE = frozenset(
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
COMMANDS = {
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
SCHEMA_OBJECTS = frozenset(
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
ON_A_TABLE = frozenset(
    {
        ObjectType.OBJECT_TRIGGER,
        ObjectType.OBJECT_RULE,
        ObjectType.OBJECT_POLICY,
        ObjectType.OBJECT_COLUMN,
        ObjectType.OBJECT_TABCONSTRAINT,
    }
)

# Functions that act outside the schema: files, large objects, other backends, the server.
OUTSIDE_FUNCTIONS = frozenset(
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
OUTSIDE_PREFIXES = (
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
NAME_ARGUMENTS = frozenset(
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
NAME_TYPES = frozenset(
    {"regclass", "regproc", "regprocedure", "regtype", "regoper", "regoperator", "regcollation", "regconfig"}
)
SCHEMA_FUNCTIONS = frozenset({"to_regnamespace", "has_schema_privilege"})
CHECKABLE_LANGUAGES = frozenset({"sql", "plpgsql"})


class Unconfined(Exception):
    """Raised by the walk at the first statement that cannot be confined."""
