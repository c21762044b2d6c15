"""``pgrace load``: a scenario's ``[load]`` transaction, driven by PostgreSQL's own pgbench.

pgrace writes the pgbench script, and for each client count: creates a fresh scratch
database, runs the scenario's setup and the load setup, runs pgbench (its clients tagged
with an ``application_name`` of their own), samples ``pg_locks`` every ~50 ms on an
observer connection to see how many of those clients wait on a lock at once and on what,
reads pgbench's per-transaction log for the latency percentiles, then runs the load
checks (the invariants) and drops the database. A Python thread pool is not a load
generator; pgbench is.

Variables: scenario params are composed into the script by :mod:`pgrace.model.variables`
(psycopg's ``sql``); captured values (``\\gset``) and drawn values (``\\set``) stay pgbench
variables, sent by pgbench as bound parameters (``-M extended``), never pasted into SQL.
"""

from pgrace.drivers.load.measure import check_invariants
from pgrace.drivers.load.run import (
    APP_PREFIX,
    DEFAULT_CONNECTIONS,
    WORK_PREFIX,
    check_machine,
    check_room,
    connections_for,
    find_pgbench,
    pgbench_argv,
    pgbench_major,
    run_load,
    sweep_work_dirs,
    threads_for,
)
from pgrace.drivers.load.script import compose_sql, emit, pgbench_script, setup_sql
from pgrace.model.load import ClientRun, LoadOptions, LoadSeries, NoPgbench, Violation

__all__ = [
    "APP_PREFIX",
    "DEFAULT_CONNECTIONS",
    "WORK_PREFIX",
    "ClientRun",
    "LoadOptions",
    "LoadSeries",
    "NoPgbench",
    "Violation",
    "check_invariants",
    "check_machine",
    "check_room",
    "compose_sql",
    "connections_for",
    "emit",
    "find_pgbench",
    "pgbench_argv",
    "pgbench_major",
    "pgbench_script",
    "run_load",
    "setup_sql",
    "sweep_work_dirs",
    "threads_for",
]
