"""A throwaway PostgreSQL in a Docker container, through testcontainers (``pgrace-cli[docker]``).

testcontainers is an optional extra, imported only when a ``docker:IMAGE`` server is
asked for; without it, or without a reachable Docker engine, the error says what to do.
Each container carries a label of its own (``org.pgrace.container``), so a start that
fails or is interrupted before testcontainers hands the container back still removes it.
The container's port is published on the loopback only, its superuser's password is made
for the run, and scenarios run as a role made for each run, as on the embedded server:
another user of the machine cannot reach it, and a scenario cannot act as its superuser.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import secrets
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from pgrace.errors import ServerUnavailable
from pgrace.servers.info import ServerInfo
from pgrace.servers.interrupts import deferred_interrupts
from pgrace.servers.processes import refuse_if_forbidden
from pgrace.servers.secrets import remember_secrets

#: The label on every container pgrace starts; its value is unique to one start.
LABEL = "org.pgrace.container"
#: The only address the container's PostgreSQL is published on.
LOOPBACK = "127.0.0.1"
#: The container's superuser and database (its password is made for each start).
SUPERUSER = "pgrace"


def docker_available() -> str | None:
    """None when a Docker engine answers; otherwise why not (for skips and messages)."""
    try:
        import docker  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        return "testcontainers is not installed: pip install 'pgrace-cli[docker]'"
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


def _postgres_container() -> Any:
    """testcontainers' PostgresContainer class, wherever this version keeps it.

    4.15 moved it to ``testcontainers.community.postgres`` and made the old module warn
    when imported; versions before have only the old one.
    """
    try:
        from testcontainers.community.postgres import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
            PostgresContainer,
        )
    except ImportError:
        from testcontainers.postgres import PostgresContainer  # type: ignore[import-untyped,import-not-found,unused-ignore]
    # Versions before 4.1 print their progress to stderr (a handler on each module's logger): a
    # failed start must still be one line there.
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("testcontainers"):
            logging.getLogger(name).setLevel(logging.WARNING)
    return PostgresContainer


def _remove_labelled(value: str) -> None:
    """Remove the container of one start, whether or not testcontainers got to hold it."""
    import docker

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        client = docker.from_env()
        try:
            for container in client.containers.list(all=True, filters={"label": f"{LABEL}={value}"}):
                container.remove(force=True, v=True)
        finally:
            client.close()


@contextlib.contextmanager
def docker_server(image: str) -> Iterator[ServerInfo]:
    """Start ``image`` (e.g. ``postgres:17``), yield it, and remove the container, however the block ends."""
    problem = docker_available()
    if problem is not None:
        raise ServerUnavailable(f"cannot start docker:{image}: {problem}")
    refuse_if_forbidden(f"docker:{image}")
    mark = uuid.uuid4().hex
    password = secrets.token_urlsafe(24)
    remember_secrets(f"password={password}")
    container: Any = _postgres_container()(
        image, username=SUPERUSER, password=password, dbname=SUPERUSER, driver=None
    ).with_kwargs(labels={LABEL: mark})
    # Published on the loopback alone (testcontainers would publish on every address, 0.0.0.0 and ::).
    container.ports = {str(port): (LOOPBACK, None) for port in container.ports}
    try:
        container.start()
    except BaseException as exc:  # a timeout, an engine error, Ctrl-C or SIGTERM while it waits
        with deferred_interrupts():
            _remove_labelled(mark)
        if isinstance(exc, Exception):
            first = (str(exc).splitlines() or [exc.__class__.__name__])[0]
            raise ServerUnavailable(f"cannot start docker:{image}: {first}") from exc
        raise
    try:
        port = container.get_exposed_port(5432)
        dsn = make_conninfo(host=LOOPBACK, port=port, user=SUPERUSER, password=password, dbname=SUPERUSER)
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        version = str(row[0]) if row else "unknown"
        yield ServerInfo(
            dsn=dsn,
            version=version,
            label=f"docker:{image} PostgreSQL {version}",
            scenario_role=True,
            role_password=True,
        )
    finally:
        with deferred_interrupts():
            container.stop()
