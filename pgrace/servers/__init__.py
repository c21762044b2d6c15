"""Where pgrace gets a PostgreSQL server from: a throwaway embedded one, or one the user names.

Everything downstream only needs a `ServerInfo`: a conninfo string to an admin database
plus a description that is safe to print.  `open_server` picks the backend so that the
CLI, the tests and the benchmarks all choose servers the same way.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType

import psycopg.conninfo

__all__ = ["ServerInfo", "open_server", "redact_dsn"]

#: Environment variable naming an existing server; used when no DSN is passed explicitly.
DSN_ENV_VAR = "PGRACE_DSN"

#: conninfo keywords whose values are secrets and must never be printed.
_SECRET_KEYS = ("password", "sslpassword")


@dataclass(frozen=True)
class ServerInfo:
    """A reachable server, described once so nobody has to re-derive it."""

    dsn: str
    """libpq conninfo of an admin database on the server; may contain a password."""
    version: str
    """``server_version`` as the server reports it, e.g. ``"18.1"``."""
    label: str
    """Human description without any password, safe for logs and reports."""


def open_server(
    target: str | None = None,
) -> contextlib.AbstractContextManager[ServerInfo]:
    """Give a server for the duration of a ``with`` block.

    ``target`` is what ``--server`` takes: ``"embedded"``, a libpq connection string,
    the bin directory of a local PostgreSQL installation, or ``docker:IMAGE``.
    None -> the ``PGRACE_DSN`` environment variable if set -> else the embedded server.
    Backends are imported lazily: each is only needed when chosen.
    """
    if target is None:
        target = os.environ.get(DSN_ENV_VAR) or "embedded"
    if target == "embedded":
        from pgrace.servers.embedded import embedded_server

        return embedded_server()
    if target.startswith("docker:"):
        from pgrace.servers.docker import docker_server

        return docker_server(target.removeprefix("docker:"))
    if os.path.isdir(target):
        from pgrace.servers.embedded import local_server

        return local_server(target)
    from pgrace.servers.existing import existing_server

    return existing_server(target)


_URI_RE = re.compile(r"^(?P<scheme>postgres(?:ql)?://)(?P<userinfo>[^@/?]*@)?", re.IGNORECASE)
_URI_QUERY_SECRET_RE = re.compile(r"(?P<sep>[?&])(?:ssl)?password=[^&]*&?", re.IGNORECASE)
_KV_SECRET_RE = re.compile(
    r"\b(?:ssl)?password\s*=\s*(?:'(?:[^'\\]|\\.)*'|(?:\\.|[^\s'\\])(?:\\.|[^\s\\])*)\s*",
    re.IGNORECASE,
)


def redact_dsn(dsn: str) -> str:
    """Remove any password from a URI or key=value conninfo, so the result can be shown.

    Works textually (no parsing by libpq), so it also redacts strings that libpq would
    reject; error messages about a malformed DSN must not leak its secret either.
    """
    m = _URI_RE.match(dsn)
    if m is not None:
        userinfo = m.group("userinfo")
        head = m.group("scheme")
        if userinfo is not None:
            head += userinfo[:-1].split(":", 1)[0] + "@"
        rest = dsn[m.end() :]

        def _drop_param(pm: re.Match[str]) -> str:
            # Keep the separator only when something follows it.
            tail = pm.group(0)
            return pm.group("sep") if tail.endswith("&") else ""

        rest = _URI_QUERY_SECRET_RE.sub(_drop_param, rest)
        return head + rest.rstrip("?&")
    return _KV_SECRET_RE.sub("", dsn).strip()


def scrub_secrets(text: str, dsn: str) -> str:
    """Remove the DSN's password from an arbitrary message (e.g. a libpq error) before it is shown."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return text
    for key in _SECRET_KEYS:
        value = params.get(key)
        # Very short values would turn the message into noise and carry little risk.
        if isinstance(value, str) and len(value) >= 3:
            text = text.replace(value, "***")
    return text


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold back Ctrl-C and SIGTERM while cleanup runs, then deliver them.

    A signal during cleanup would otherwise leave a server or a scratch database behind:
    the CLI turns SIGTERM into an exception, just like Ctrl-C (a killed run's bench
    found the run directory of an embedded server left after a SIGTERM in teardown).
    Only the main thread can install signal handlers; elsewhere this is a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def _remember(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous: dict[int, _Handler] = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, _remember)
    except ValueError:  # not the main interpreter
        _restore(previous)
        yield
        return
    try:
        yield
    finally:
        _restore(previous)
        for pending in dict.fromkeys(received):
            handler = previous[pending]
            if callable(handler):
                handler(pending, None)
            elif handler in (signal.SIG_DFL, None):
                os.kill(os.getpid(), pending)


_Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


def _restore(previous: dict[int, _Handler]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
