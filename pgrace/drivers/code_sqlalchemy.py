"""SQLAlchemy 2 (Core and ORM) on the connection pgrace hands a session.

``engine(conn)`` gives an :class:`~sqlalchemy.engine.Engine` on the ``postgresql+psycopg``
dialect whose pool hands out that one connection, so every statement SQLAlchemy sends is
a step the scheduler orders. The dialect's own first-connect queries (server version,
``standard_conforming_strings``, hstore lookup) are pgrace's set-up, not the application's
steps: they run untracked, once per connection (the engine is kept on the connection and
reused by the next run of an exploration).

SQLAlchemy is an optional dependency, imported only here.
"""

from __future__ import annotations

from typing import Any

from pgrace.engine.threads.session import TracedConnection
from pgrace.errors import CodeError

__all__ = ["engine"]


def engine(conn: Any, **kwargs: Any) -> Any:
    """An Engine whose only connection is ``conn`` (the one pgrace passed to the session)."""
    if not isinstance(conn, TracedConnection):
        raise CodeError("pgrace.drivers.code_sqlalchemy.engine() takes the connection pgrace passes to a session")
    if conn.pgrace_engine is not None and not kwargs:
        return conn.pgrace_engine
    try:
        from sqlalchemy import create_engine
        from sqlalchemy.pool import StaticPool
    except ImportError:
        raise CodeError("SQLAlchemy is not installed: pip install 'sqlalchemy>=2'") from None
    made = create_engine("postgresql+psycopg://", creator=lambda: conn, poolclass=StaticPool, **kwargs)
    with conn.untracked():
        with made.connect():
            pass  # the dialect's first-connect queries, and the pool's reset
        if conn.info.transaction_status != 0:
            conn.rollback()
    if not kwargs:
        conn.pgrace_engine = made
    return made
