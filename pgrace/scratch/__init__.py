"""Where a run's SQL may go: a uniquely named scratch database, or a scratch schema.

Scenarios create and mutate tables freely; giving each run its own database (dropped
afterwards, even on Ctrl-C) keeps runs independent and lets pgrace use a shared server
without touching anybody's data. Without CREATEDB, ``allow_schema`` runs in a throwaway
schema of the DSN's database instead, beside the user's tables. This module is the one
place that decides where SQL runs:

* every connection of a run is opened by :func:`connect`, which lands it in the scratch
  schema (its ``search_path``, merged with whatever options the caller needs) and checks
  that it did before any scenario SQL is sent;
* in schema mode, SQL that cannot be confined to the schema is refused before anything
  is created (:func:`pgrace.scratch.confinement.confine_scenario`).

Liveness is the server's to tell. A scratch object's name carries pgrace's prefix and a
tag derived from the rest of the name, and a run holds a session-level advisory lock
whose key is derived from that name, taken *before* the object is created and held until
it is dropped. So from its first instant an object is recognisable as pgrace's, and it
is abandoned exactly when nobody holds its lock: :func:`sweep_leftovers` removes only
what it can take the lock for, whoever and wherever (host, PID namespace) created it.
"""

from pgrace.scratch.connections import connect
from pgrace.scratch.leftovers import Leftovers, sweep_leftovers
from pgrace.scratch.names import is_scratch_name, lock_key, scratch_name
from pgrace.scratch.reuse import (
    ReusableScratch,
    reaches_other_schemas,
    reusable_scratch_database,
    schema_reset_sql,
    scratch_database_with_schema,
)
from pgrace.scratch.run import ConnectionRoom, ScratchDatabase, connection_room, scratch_database

__all__ = [
    "ConnectionRoom",
    "Leftovers",
    "ReusableScratch",
    "ScratchDatabase",
    "connect",
    "connection_room",
    "is_scratch_name",
    "lock_key",
    "reaches_other_schemas",
    "reusable_scratch_database",
    "schema_reset_sql",
    "scratch_database",
    "scratch_database_with_schema",
    "scratch_name",
    "sweep_leftovers",
]
