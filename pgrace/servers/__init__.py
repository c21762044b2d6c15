"""Where pgrace gets a PostgreSQL server from: a throwaway embedded one, or one the user names.

Everything downstream only needs a `ServerInfo`: a conninfo string to an admin database
plus a description that is safe to print.  `open_server` picks the backend so that the
CLI, the tests and the benchmarks all choose servers the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping

from pgrace.errors import PgraceError
from pgrace.servers.info import ServerInfo
from pgrace.servers.interrupts import deferred_interrupts
from pgrace.servers.processes import NO_SERVER_ENV_VAR, refuse_if_forbidden
from pgrace.servers.secrets import (
    connstring_problem,
    describe_dsn,
    dsn_secrets,
    forget_secrets,
    redact_dsn,
    remember_secrets,
    scrub_secrets,
)

__all__ = [
    "NO_SERVER_ENV_VAR",
    "ServerInfo",
    "booting_server",
    "connstring_problem",
    "deferred_interrupts",
    "describe_dsn",
    "dsn_secrets",
    "forget_secrets",
    "open_server",
    "redact_dsn",
    "refuse_if_forbidden",
    "remember_secrets",
    "scrub_secrets",
    "starts_its_own",
]

#: Environment variable naming an existing server; used when no DSN is passed explicitly.
DSN_ENV_VAR = "PGRACE_DSN"


def open_server(
    target: str | None = None, superuser: bool = False, settings: Mapping[str, str] | None = None
) -> contextlib.AbstractContextManager[ServerInfo]:
    """Give a server for the duration of a ``with`` block.

    ``target`` is what ``--server`` takes: ``"embedded"``, a libpq connection string,
    the bin directory of a local PostgreSQL installation, or ``docker:IMAGE``.
    None -> the ``PGRACE_DSN`` environment variable if set -> else the embedded server.
    Backends are imported lazily: each is only needed when chosen. ``superuser``: on a
    server pgrace starts, scenarios run as its superuser instead of an unprivileged role.
    ``settings``: server settings for a server pgrace starts from a data directory (embedded,
    a local installation), e.g. ``max_connections`` sized to a load; a server pgrace only
    connects to is as it is (see ``starts_its_own``).
    """
    if superuser:
        return _as_superuser(open_server(target, settings=settings))
    target = _resolve(target)
    if settings and starts_its_own(target):
        from pgrace.servers.embedded import embedded_server, local_server

        return embedded_server(settings) if target == "embedded" else local_server(target, settings)
    start, rest = _backend(target)
    return start(rest)


def starts_its_own(target: str | None) -> bool:
    """Whether ``target`` is a server pgrace starts from a data directory, so it takes server ``settings``."""
    resolved = _resolve(target)
    prefixed = any(resolved.startswith(prefix) for prefix in BACKENDS)
    return resolved == "embedded" or (not prefixed and os.path.isdir(resolved))


#: Server backends by what ``--server`` starts with, as ``"module:function"``; imported when chosen.
#: The function takes the rest of the target (``docker:IMAGE`` gives it IMAGE) and returns a
#: context manager of a :class:`ServerInfo`. A new backend is one entry and one module.
BACKENDS: dict[str, str] = {
    "docker:": "pgrace.servers.docker:docker_server",
}
EMBEDDED = "pgrace.servers.embedded:embedded_server"  # the target "embedded"
LOCAL = "pgrace.servers.embedded:local_server"  # a PostgreSQL bin directory
EXISTING = "pgrace.servers.existing:existing_server"  # anything else: a connection string


def _backend(target: str) -> tuple[Callable[..., contextlib.AbstractContextManager[ServerInfo]], str]:
    """The backend for ``target``, imported now, and the argument it takes."""
    import importlib

    def imported(where: str) -> Callable[..., contextlib.AbstractContextManager[ServerInfo]]:
        module, _, function = where.partition(":")
        found: Callable[..., contextlib.AbstractContextManager[ServerInfo]] = getattr(
            importlib.import_module(module), function
        )
        return found

    if target == "embedded":
        start = imported(EMBEDDED)
        return lambda _: start(), target
    for prefix, where in BACKENDS.items():
        if target.startswith(prefix):
            return imported(where), target.removeprefix(prefix)
    return imported(LOCAL if os.path.isdir(target) else EXISTING), target


@contextlib.contextmanager
def _as_superuser(opened: contextlib.AbstractContextManager[ServerInfo]) -> Iterator[ServerInfo]:
    with opened as server:
        yield dataclasses.replace(server, scenario_role=False)


@contextlib.contextmanager
def booting_server(target: str | None = None, superuser: bool = False) -> Iterator[Callable[[], ServerInfo]]:
    """`open_server` in two steps: a server pgrace starts itself boots now, ``ready()`` waits for it.

    Meanwhile the caller does its own work (a run loads its scenario and imports the
    driver while postgres starts in other processes). A server pgrace only connects to is
    opened by ``ready()``. Either way a failure to get the server is raised by ``ready()``,
    so the caller's own errors (a bad scenario file) are reported first, as without this.
    """
    target = _resolve(target)
    with contextlib.ExitStack() as stack:
        start: Callable[[], ServerInfo] | None = None
        failure: PgraceError | None = None
        prefixed = any(target.startswith(prefix) for prefix in BACKENDS)
        if target == "embedded" or (not prefixed and os.path.isdir(target)):
            from pgrace.servers.embedded import embedded_booting, local_booting

            try:
                start = stack.enter_context(embedded_booting() if target == "embedded" else local_booting(target))
            except PgraceError as exc:
                failure = exc
        opened: list[ServerInfo] = []

        def ready() -> ServerInfo:
            if failure is not None:
                raise failure
            if not opened:
                server = start() if start is not None else stack.enter_context(open_server(target))
                opened.append(dataclasses.replace(server, scenario_role=False) if superuser else server)
            return opened[0]

        yield ready


def _resolve(target: str | None) -> str:
    return target if target is not None else os.environ.get(DSN_ENV_VAR) or "embedded"
