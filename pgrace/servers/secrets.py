"""Passwords in connection strings: found, remembered, and scrubbed from every message that may quote them."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

if TYPE_CHECKING:  # psycopg is imported where it is used: a run imports it while its server boots
    import psycopg


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
