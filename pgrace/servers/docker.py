"""A throwaway PostgreSQL in a Docker container, through testcontainers (``pgrace[docker]``).

testcontainers is an optional extra, imported only when a ``docker:IMAGE`` server is
asked for; without it, or without a reachable Docker engine, the error says what to do.
"""

from __future__ import annotations

import contextlib
import gc
import os
import warnings
from collections.abc import Iterator
from typing import Any

import psycopg

from pgrace.errors import ServerUnavailable
from pgrace.servers.info import ServerInfo


def docker_available() -> str | None:
    """None when a Docker engine answers; otherwise why not (for skips and messages)."""
    try:
        import docker  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        return "testcontainers is not installed: pip install 'pgrace[docker]'"
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://") and not os.path.exists(host.removeprefix("unix://")):
        return f"no Docker engine is reachable (no socket at {host.removeprefix('unix://')})"
    client: Any = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            try:
                client = docker.from_env()
                client.ping()
            except Exception as exc:  # the docker SDK raises many unrelated types for "no engine"
                first = (str(exc).splitlines() or [""])[0][:120]
                return f"no Docker engine is reachable ({exc.__class__.__name__}: {first})"
            finally:
                if client is not None:
                    client.close()
                gc.collect()  # the SDK leaks a socket on failure: reclaim it while warnings are off
    except Exception as exc:
        return f"no Docker engine is reachable ({exc.__class__.__name__})"
    return None


@contextlib.contextmanager
def docker_server(image: str) -> Iterator[ServerInfo]:
    """Start ``image`` (e.g. ``postgres:17``), yield it, and remove the container."""
    problem = docker_available()
    if problem is not None:
        raise ServerUnavailable(f"cannot start docker:{image}: {problem}")
    from testcontainers.postgres import PostgresContainer  # type: ignore[import-untyped,import-not-found,unused-ignore]

    container: Any = PostgresContainer(image, driver=None)
    try:
        container.start()
    except Exception as exc:
        raise ServerUnavailable(f"cannot start docker:{image}: {exc}") from exc
    try:
        dsn = container.get_connection_url()
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        version = str(row[0]) if row else "unknown"
        yield ServerInfo(dsn=dsn, version=version, label=f"docker:{image} PostgreSQL {version}")
    finally:
        container.stop()
