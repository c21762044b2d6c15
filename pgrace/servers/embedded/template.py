"""The cached initdb template a run copies instead of running initdb: built once, checked before each use."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile

from pgrace.errors import ServerUnavailable
from pgrace.servers.embedded.binaries import (
    _cache_lock,
    _discard,
    _make_tmp_dir,
    _make_world_readable,
    _publish,
    _server_user,
    _User,
)
from pgrace.servers.embedded.process import _child_env, _child_setup, _tail
from pgrace.servers.embedded.rundirs import _RUN_PREFIX, _our_run_dirs, _run_dirs_lock

#: initdb options of the cached template.  Part of the template's cache key, so
#: changing them invalidates old templates.  A 1 MB WAL segment (instead of 16 MB)
#: keeps the per-run copy small.
_INITDB_ARGS = (
    "--no-sync",
    "-U",
    "postgres",
    "-A",
    "trust",
    "-E",
    "UTF8",
    "--locale=C",
    "--wal-segsize=1",
)

#: Server settings: durability is pointless for data we throw away, and background


_TEMPLATE_MANIFEST = "pgrace-template.json"
_TEMPLATE_CONFIG = ("PG_VERSION", "postgresql.conf", "postgresql.auto.conf", "pg_hba.conf", "pg_ident.conf")
_PG_CONTROL_SIZE = 8192


def _ensure_template(
    bindir: str, key: str, cache: str, base: str, user: _User | None, notes: list[str], rebuild: bool = False
) -> str:
    """Return the cached initdb template data directory, creating it once.

    initdb runs in tmpfs (``base``) and only its result is copied into the cache:
    measured here, initdb takes 0.25 s on tmpfs but 1 s on the overlay disk.

    The template is ours and writable by nobody else: as root, the server's account only
    reads it, so nothing a server does (a superuser scenario's ``COPY ... TO`` a file) can
    change what later runs start from. It is checked before every use (see
    :func:`_template_problem`); a bad one is rebuilt under the cache lock, and ``notes``
    says so (not for one an older pgrace left to the server's account: that is expected).
    """
    options = hashlib.sha256(" ".join(_INITDB_ARGS).encode()).hexdigest()[:8]
    final = os.path.join(cache, f"template-{key}-{options}")
    data = os.path.join(final, "data")
    if not rebuild and _template_problem(final) is None:
        return data
    with _cache_lock(cache):
        problem = "it could not start a server" if rebuild else _template_problem(final)
        if problem is not None:
            if os.path.lexists(final):
                _discard(final, cache)
                if problem not in _EXPECTED_REBUILDS:
                    notes.append(f"the cached server template in {final} was damaged ({problem}); rebuilt it")
            _build_template(bindir, cache, base, user, final)
    return data


def _template_problem(final: str) -> str | None:
    """Why the template in ``final`` cannot be used (None: it can).

    Checked on every run, cheaply (about 4 ms): everything in it is ours and writable by
    no one else, no link; the manifest written when it was built has the digests of its
    configuration (a changed line could load a library that is not there, or make every
    run read-only); and the files without which postgres cannot start are there.
    """
    data = os.path.join(final, "data")
    if not os.path.lexists(final):
        return "missing"
    if (owner := _foreign_entry(final)) is not None:
        return owner
    try:
        with open(os.path.join(final, _TEMPLATE_MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        return "no manifest"
    except (OSError, ValueError) as exc:
        return f"unreadable manifest: {exc}"
    if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict):
        return "unreadable manifest"
    for name, digest in manifest["config"].items():
        try:
            with open(os.path.join(data, name), "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() != digest:
                    return f"{name} was changed"
        except OSError as exc:
            return f"{name}: {exc.strerror}"
    try:
        if os.stat(os.path.join(data, "global", "pg_control")).st_size != _PG_CONTROL_SIZE:
            return "global/pg_control is damaged"
        if not os.listdir(os.path.join(data, "base")):
            return "base/ is empty"
    except OSError as exc:
        return f"{os.path.relpath(exc.filename or data, data)}: {exc.strerror}"
    return None


def _write_template_manifest(staged: str) -> None:
    """Record what :func:`_template_problem` checks, beside (not inside) the data directory."""
    config = {}
    for name in _TEMPLATE_CONFIG:
        with open(os.path.join(staged, "data", name), "rb") as f:
            config[name] = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(staged, _TEMPLATE_MANIFEST), "w", encoding="utf-8") as f:
        json.dump({"config": config}, f)
    os.chmod(os.path.join(staged, _TEMPLATE_MANIFEST), 0o644)


def _foreign_entry(final: str) -> str | None:
    """What in the template is not ours alone: a directory of another owner or open to others' writes, a link.

    Directories are what decide: in one only we can write, nobody else can add, remove or
    replace a file, and the files are ours, made 0644 when the template was built (their
    content that matters is checked against the manifest). Reading the directory entries'
    types costs no stat per file: a run pays about a millisecond for the template's ~1,000.
    """
    me, server = os.geteuid(), _server_uid()
    pending = [final]
    while pending:
        directory = pending.pop()
        where = os.path.relpath(directory, final)
        try:
            st = os.lstat(directory)
            if stat.S_ISLNK(st.st_mode):
                return f"{where} is a link"
            if st.st_uid != me:
                return _OLDER_LAYOUT if st.st_uid == server else f"{where} is not ours"
            if st.st_mode & 0o022:
                return f"{where} is writable by others"
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.is_symlink():
                        return f"{os.path.relpath(entry.path, final)} is a link"
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
        except OSError as exc:
            return f"{where}: {exc.strerror}"
    return None


_OLDER_LAYOUT = "owned by the server's account"  # how an older pgrace left it: rebuilt without a word
_EXPECTED_REBUILDS = ("missing", "no manifest", _OLDER_LAYOUT)


def _server_uid() -> int | None:
    with contextlib.suppress(ServerUnavailable):
        user = _server_user()
        return user.uid if user is not None else None
    return None


def _build_template(bindir: str, cache: str, base: str, user: _User | None, final: str) -> None:
    with _run_dirs_lock:  # named like a run dir, so a killed first run's leftover is swept
        work = tempfile.mkdtemp(prefix=f"{_RUN_PREFIX}{os.getpid()}-initdb-", dir=base)
        _our_run_dirs.add(work)
    try:
        if user is not None:
            os.chown(work, user.uid, user.gid)
        work_data = os.path.join(work, "data")
        env = _child_env()
        env["TZ"] = "UTC"  # recorded in the template: reproducible timestamps, no tz scan
        result = subprocess.run(
            [os.path.join(bindir, "bin", "initdb"), *_INITDB_ARGS, "-D", work_data],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=work,
            preexec_fn=_child_setup(user, death_signal=False),
            check=False,
        )
        if result.returncode != 0:
            output = result.stdout.decode(errors="replace").strip()
            raise ServerUnavailable(
                f"initdb of the embedded server template failed (exit {result.returncode}): {_tail(output)}"
            )
        _drop_spare_wal(work_data)
        tmp = _make_tmp_dir(cache)
        try:
            shutil.copytree(work_data, os.path.join(tmp, "data"), symlinks=True)
            _write_template_manifest(tmp)
            if user is not None:  # ours (root's), and only readable by the server's account
                _make_world_readable(tmp)
            _publish(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        with _run_dirs_lock:
            _our_run_dirs.discard(work)


def _drop_spare_wal(data: str) -> None:
    """Delete the pre-allocated future WAL segments initdb leaves behind.

    After initdb's shutdown checkpoint every segment before the redo segment is gone,
    so the lowest-numbered one holds the checkpoint; the record may run into the next
    one, so two are kept.  The rest are recycled empties that postgres recreates on
    demand; not copying them saves ~5 MB per run.
    """
    wal = os.path.join(data, "pg_wal")
    segments = sorted(n for n in os.listdir(wal) if re.fullmatch(r"[0-9A-F]{24}", n))
    for name in segments[2:]:
        os.unlink(os.path.join(wal, name))
