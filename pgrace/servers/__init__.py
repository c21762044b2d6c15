"""Where pgrace gets a PostgreSQL server from: a throwaway embedded one, or one the user names.

Everything downstream only needs a `ServerInfo`: a conninfo string to an admin database
plus a description that is safe to print.  `open_server` picks the backend so that the
CLI, the tests and the benchmarks all choose servers the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

from pgrace.errors import PgraceError

if TYPE_CHECKING:  # psycopg is imported where it is used: a run imports it while its server boots
    import psycopg

__all__ = ["ServerInfo", "booting_server", "describe_dsn", "dsn_secrets", "open_server", "redact_dsn", "scrub_secrets"]

#: Environment variable naming an existing server; used when no DSN is passed explicitly.
DSN_ENV_VAR = "PGRACE_DSN"

#: Set by the test suite's fast tier (``make test-fast``): this process and its children may not
#: start a PostgreSQL, so a test that needs one but is not marked ``server`` fails instead.
NO_SERVER_ENV_VAR = "PGRACE_NO_SERVER"


def refuse_if_forbidden(what: str) -> None:
    """Raise before starting ``what`` when `NO_SERVER_ENV_VAR` forbids starting servers."""
    if os.environ.get(NO_SERVER_ENV_VAR):
        raise RuntimeError(f"{NO_SERVER_ENV_VAR} is set: this process may not start {what}")


@dataclass(frozen=True)
class ServerInfo:
    """A reachable server, described once so nobody has to re-derive it."""

    dsn: str
    """libpq conninfo of an admin database on the server; may contain a password."""
    version: str
    """``server_version`` as the server reports it, e.g. ``"18.1"``."""
    label: str
    """Human description without any password, safe for logs and reports."""
    bindir: str | None = None
    """The bin directory of the server's own installation (pgbench lives there), when pgrace started it."""
    fresh: bool = False
    """pgrace started it for this process from its clean template: no killed run can have left anything on it."""
    notes: tuple[str, ...] = ()
    """What pgrace had to mend to start it (a damaged cache entry rebuilt), one line each, for the user."""
    scenario_role: bool = False
    """Each run's SQL runs as a role pgrace creates for it, without superuser (servers pgrace starts itself).

    False: it runs as the DSN's own role (a user's server, or ``--superuser``).
    """


def open_server(target: str | None = None, superuser: bool = False) -> contextlib.AbstractContextManager[ServerInfo]:
    """Give a server for the duration of a ``with`` block.

    ``target`` is what ``--server`` takes: ``"embedded"``, a libpq connection string,
    the bin directory of a local PostgreSQL installation, or ``docker:IMAGE``.
    None -> the ``PGRACE_DSN`` environment variable if set -> else the embedded server.
    Backends are imported lazily: each is only needed when chosen. ``superuser``: on a
    server pgrace starts, scenarios run as its superuser instead of an unprivileged role.
    """
    if superuser:
        return _as_superuser(open_server(target))
    start, rest = _backend(_resolve(target))
    return start(rest)


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
        return scrub_secrets(head + rest.rstrip("?&"), dsn)
    return scrub_secrets(_KV_SECRET_RE.sub("", dsn).strip(), dsn)


#: conninfo keywords whose values are secrets and must never be printed.
_SECRET_KEYS = ("password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key")

#: Shorter candidates are not scrubbed from messages (they would blank out ordinary words);
#: the DSN itself is never echoed, so they cannot leak that way.
_MIN_SCRUB_LEN = 3

_ANYWHERE_SECRET_RE = re.compile(
    r"(?:pass|pwd|secret)[\w%.-]*\s*(?:=|%3d)\s*(?P<value>'(?:[^'\\]|\\.)*'?|[^\s&']+)", re.IGNORECASE
)

#: Secrets of every DSN this process was given (see `remember_secrets`).
_REMEMBERED: set[str] = set()


@functools.cache
def _libpq_keywords() -> frozenset[str]:
    """The keywords this libpq knows; any other key in a DSN is a typo and its value may be a password."""
    from psycopg import pq

    return frozenset(o.keyword.decode() for o in pq.Conninfo.get_defaults())


def _password_like(key: str) -> bool:
    """A key whose value should be treated as a secret: libpq's secret keys and anything libpq does not know."""
    key = key.strip().lower()
    return key in _SECRET_KEYS or key not in _libpq_keywords()


def _option_key_is_secret(key: str) -> bool:
    """A GUC or option name given in ``options`` that looks like it holds a password."""
    word = re.sub(r"[^a-z]", "", key.lower().rsplit(".", 1)[-1])
    return any(part in word for part in ("pass", "pwd", "pw", "secret", "token", "cred", "key")) or (
        _edit_distance(word, "password") <= 2
    )


def _edit_distance(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def _kv_pairs(text: str) -> Iterator[tuple[str | None, str, str]]:
    """``(key, raw value, unescaped value)`` of a key=value conninfo, tolerant like no parser should be.

    Follows libpq's conninfo_parse, but never fails: a word without ``=`` is yielded with key
    None (libpq would quote it back in its error), an unterminated quote runs to the end.
    """
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i].isspace():
            i += 1
        start = i
        while i < n and not text[i].isspace() and text[i] != "=":
            i += 1
        key = text[start:i]
        j = i
        while j < n and text[j].isspace():
            j += 1
        if j >= n or text[j] != "=":
            if key:
                yield None, key, key
            continue
        i = j + 1
        while i < n and text[i].isspace():
            i += 1
        value_start, chars = i, []
        if i < n and text[i] == "'":
            i += 1
            while i < n and text[i] != "'":
                if text[i] == "\\" and i + 1 < n:
                    i += 1
                chars.append(text[i])
                i += 1
            i += 1
        else:
            while i < n and not text[i].isspace():
                if text[i] == "\\" and i + 1 < n:
                    i += 1
                chars.append(text[i])
                i += 1
        yield key, text[value_start:i], "".join(chars)


def _option_secrets(options: str) -> Iterator[str]:
    """Values in an ``options`` string (``-c name=value``, ``--name=value``) whose name looks like a password's."""
    for word in re.split(r"\s+", options):
        key, sep, value = word.lstrip("-").removeprefix("c").partition("=")
        if sep and value and _option_key_is_secret(key):
            yield value


def dsn_secrets(dsn: str) -> frozenset[str]:
    """Every piece of ``dsn`` that may be a password, in the forms a message could quote it.

    Found textually, so a DSN libpq rejects (unterminated quote, misspelt key, password in a
    URL's userinfo with an unescaped ``@``) gives its secrets too, and by libpq's own parse
    (percent-encoded keys and values). Unknown keys count as password-like: a typo's value
    is the likeliest secret of all.
    """
    found: set[str] = set()

    def add(value: str) -> None:
        for form in (value, unquote(value), quote(value, safe="")):
            found.add(form)
            # Pieces, for messages that quote a part of a mangled value (a host after a stray '@').
            found.update(p for p in re.split(r"[\s@:/?&,]+", form) if len(p) >= 4)

    scheme = re.match(r"^\s*postgres(?:ql)?://", dsn, re.IGNORECASE)
    if scheme is not None:
        rest = dsn[scheme.end() :]
        authority, _, query = rest.partition("?")
        if "@" in authority:
            userinfo = authority.rsplit("@", 1)[0]
            user, colon, password = userinfo.partition(":")
            if colon:
                add(password)
            if "@" in user:  # "u@x:pw@host": all but the user's name is suspect
                add(user.split("@", 1)[1])
        for pair in query.split("&"):
            key, sep, value = pair.partition("=")
            key = unquote(key)
            if sep and _password_like(key):
                add(value)
            elif sep and key == "options":
                for secret in _option_secrets(unquote(value)):
                    add(secret)
            elif not sep and pair:
                add(pair)
    else:
        for kv_key, raw, kv_value in _kv_pairs(dsn):
            if kv_key is None or _password_like(kv_key):
                add(raw)
                add(kv_value)
            elif kv_key == "dbname" and ("=" in kv_value or "://" in kv_value):  # libpq expands it as a DSN
                found.update(dsn_secrets(kv_value))
            elif kv_key == "options":
                for secret in _option_secrets(kv_value):
                    add(secret)
    # Anywhere, even run into another value ("host=h password=x" typed without its space).
    for m in _ANYWHERE_SECRET_RE.finditer(dsn):
        add(m.group("value").strip("'"))
    import psycopg.conninfo

    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        params = {}
    for param, setting in params.items():
        if isinstance(setting, str) and param in _SECRET_KEYS:
            add(setting)
        elif isinstance(setting, str) and param == "options":
            for secret in _option_secrets(setting):
                add(secret)
    return frozenset(s for s in found if s)


def remember_secrets(dsn: str) -> None:
    """Note ``dsn``'s secrets (and PGPASSWORD's) so that `scrub_secrets` removes them from any later message."""
    _REMEMBERED.update(dsn_secrets(dsn))
    env_password = os.environ.get("PGPASSWORD")
    if env_password:
        _REMEMBERED.add(env_password)


def forget_secrets() -> None:
    """Start afresh: secrets are remembered for one command, so one command's scrubbing never reaches another's text."""
    _REMEMBERED.clear()


def scrub_secrets(text: str, dsn: str | None = None) -> str:
    """Replace every secret of ``dsn`` and of every remembered DSN in ``text`` with ``***``.

    The last line of defence for text that may quote a connection string (libpq's and the
    server's messages); pgrace's own messages never quote a user's DSN in the first place.
    """
    secrets = set(_REMEMBERED)
    if dsn is not None:
        secrets |= dsn_secrets(dsn)
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= _MIN_SCRUB_LEN:
            text = text.replace(secret, "***")
    return text


def describe_dsn(dsn: str) -> str:
    """Where ``dsn`` points, as ``postgresql://user@host:port/dbname``, built from non-secret fields only.

    The string the user gave is never shown: it may hold a password in any shape.
    """
    import psycopg.conninfo

    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return "the given DSN"

    def field(key: str) -> str:
        value = params.get(key)
        if not isinstance(value, str) or not value:
            return ""
        return "***" if scrub_secrets(value, dsn) != value else value

    host = field("host") or field("hostaddr")
    port = field("port")
    user = field("user")
    dbname = field("dbname")
    where = f"{quote(user, safe='')}@" if user else ""
    where += quote(host, safe=",") if host.startswith("/") else host
    where += f":{port}" if port else ""
    where += f"/{quote(dbname, safe='')}" if dbname else ""
    return f"postgresql://{where}" if where else "the server named by libpq's defaults (PGHOST, PGPORT, …)"


def connstring_problem(exc: psycopg.Error) -> str:
    """libpq's complaint about a malformed DSN, without the pieces of the DSN it quotes."""
    message = " ".join(str(exc).split()).removesuffix(" in connection info string")
    known = _libpq_keywords()
    return re.sub(r'"([^"]*)"', lambda m: m.group(0) if m.group(1) in known | {"="} else '"…"', message)


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
