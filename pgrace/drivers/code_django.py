"""Django's ORM on the connection pgrace hands a session.

``session(fn)`` makes a session of a Django function that takes no connection (a view's
body, a service function): in the session's thread, Django's connection for ``alias`` is
a wrapper of the configured PostgreSQL backend whose ``get_new_connection`` returns
pgrace's connection, set up as ``psycopg.connect(**conn_params)`` would have set up a new
one (Django's cursor class, traced; its adapters; its isolation level). So every statement
the ORM sends is a step the scheduler orders, and nothing else connects. Django's own
connection set-up (``SET TIME ZONE`` through ``set_config``, a role) runs untracked before
the function, in every run alike: it is pgrace's set-up, not the application's steps.

``connected(conn)`` does the same inside a session function of your own. The settings'
``NAME`` is not used (pgrace's scratch database is), and a pool in ``OPTIONS`` would open
connections of its own (refused). Django is an optional dependency, imported only here.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from pgrace.engine.threads.session import SessionCode, TracedConnection, TracedCursor
from pgrace.errors import CodeError

__all__ = ["connected", "session"]

_CLASSES_LOCK = threading.Lock()


def session(fn: Callable[[], object], alias: str = "default") -> SessionCode:
    """A session running ``fn()`` with Django's connection ``alias`` on the connection pgrace passes it."""

    @functools.wraps(fn)  # its name and place are fn's, in the timeline and in error messages
    def run(conn: Any) -> object:
        with connected(conn, alias):
            return fn()

    return run


@contextlib.contextmanager
def connected(conn: Any, alias: str = "default") -> Iterator[None]:
    """In this thread, Django's connection ``alias`` is ``conn`` (the one pgrace passed to the session)."""
    if not isinstance(conn, TracedConnection):
        raise CodeError("pgrace.drivers.code_django takes the connection pgrace passes to a session")
    try:
        from django.db import connections
    except ImportError:
        raise CodeError("Django is not installed: pip install 'pgrace-cli[django]'") from None
    saved = (conn.autocommit, conn.cursor_factory, conn.adapters, conn.isolation_level)
    wrapper = _wrapper_class(connections.settings[alias]["ENGINE"])(connections.settings[alias], alias)
    wrapper.pgrace_connection = conn
    connections[alias] = wrapper
    try:
        with conn.untracked():
            wrapper.ensure_connection()  # Django's set-up of a new connection: pgrace's, not a step
        yield
    finally:
        wrapper.connection = None  # detached: Django's close() would have nothing to close
        del connections[alias]
        conn.cursor_factory, conn._adapters = saved[1], saved[2]
        if conn.info.transaction_status == 0:  # idle: the attributes can be set back without a statement
            conn.autocommit, conn.isolation_level = saved[0], saved[3]


def _wrapper_class(engine: str) -> Any:
    """The configured backend's DatabaseWrapper, with pgrace's connection for a new one."""
    from django.db.backends.postgresql.base import DatabaseWrapper as PostgreSQL
    from django.db.backends.postgresql.psycopg_any import is_psycopg3
    from django.db.utils import load_backend

    base = load_backend(engine).DatabaseWrapper
    if not (issubclass(base, PostgreSQL) and is_psycopg3):
        raise CodeError(f"pgrace runs Django's PostgreSQL backend on psycopg 3, not {engine}")
    with _CLASSES_LOCK:
        return _subclass(base)


@functools.cache
def _subclass(base: type) -> type:
    class PgraceDatabaseWrapper(base):  # type: ignore[misc]
        """A new connection is the one pgrace handed the session."""

        pgrace_connection: TracedConnection

        def get_new_connection(self, conn_params: dict[str, Any]) -> TracedConnection:
            from psycopg import IsolationLevel
            from psycopg.adapt import AdaptersMap

            conn = self.pgrace_connection
            level = self.settings_dict["OPTIONS"].get("isolation_level")
            self.isolation_level = IsolationLevel.READ_COMMITTED if level is None else IsolationLevel(level)
            conn.cursor_factory = _traced(conn_params["cursor_factory"])
            conn._adapters = AdaptersMap(conn_params["context"].adapters)  # as psycopg.connect(context=) sets them
            if level is not None:
                conn.isolation_level = self.isolation_level
            return conn

    return PgraceDatabaseWrapper


@functools.cache
def _traced(cursor_class: type) -> type:
    """Django's cursor class whose statements are steps (pgrace's TracedCursor in front of it)."""
    if issubclass(cursor_class, TracedCursor):
        return cursor_class
    return type(f"Traced{cursor_class.__name__}", (TracedCursor, cursor_class), {})
