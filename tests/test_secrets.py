"""A password given in a DSN never reaches a byte of stdout, stderr or any file pgrace writes.

Every shape below carries a password in a way libpq rejects, accepts oddly, or that a user
may type by mistake. Each is run through ``run`` (text, JSON and HTML into files), ``check``
(with --junit and golden files written), ``clean``, ``explore``, ``sweep`` and ``matrix``,
by --dsn and by PGRACE_DSN. Nothing
listens on the port, so every one fails to connect; the real-server cases are at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgrace.cli import main
from pgrace.servers import ServerInfo, describe_dsn, dsn_secrets, redact_dsn, scrub_secrets

LONG = "L0ng-pw-" * 1250  # 10,000 characters

#: (id, DSN, the secrets that must never be shown)
SHAPES: list[tuple[str, str, list[str]]] = [
    ("unterminated-quote", "host=127.0.0.1 port=1 password='S3cr3t-unterm", ["S3cr3t-unterm"]),
    ("url-userinfo", "postgresql://u:S3cr3t-userinfo@127.0.0.1:1/db", ["S3cr3t-userinfo"]),
    ("url-encoded-key", "postgresql://u@127.0.0.1:1/db?pass%77ord=S3cr3t-enckey", ["S3cr3t-enckey"]),
    (
        "url-encoded-value",
        "postgresql://u@127.0.0.1:1/db?password=S3cr%33t-encval",
        ["S3cr%33t-encval", "S3cr3t-encval"],
    ),
    ("url-encoded-userinfo", "postgresql://u:S3cr%2Ft-slash@127.0.0.1:1/db", ["S3cr%2Ft-slash", "S3cr/t-slash"]),
    ("misspelt-key", "host=127.0.0.1 port=1 passwrd=S3cr3t-misspelt", ["S3cr3t-misspelt"]),
    ("misspelt-url-key", "postgresql://u@127.0.0.1:1/db?pasword=S3cr3t-urltypo", ["S3cr3t-urltypo"]),
    ("uppercase-key", "host=127.0.0.1 port=1 PASSWORD=S3cr3t-upper", ["S3cr3t-upper"]),
    (
        "duplicate-keys",
        "host=127.0.0.1 port=1 password=S3cr3t-first password=S3cr3t-second",
        ["S3cr3t-first", "S3cr3t-second"],
    ),
    ("spaces-around-equals", "host=127.0.0.1 port=1 password = S3cr3t-spaced", ["S3cr3t-spaced"]),
    ("quoted-with-spaces", "host=127.0.0.1 port=1 password='S3cr3t with spaces'", ["S3cr3t with spaces"]),
    ("escaped-quote", r"host=127.0.0.1 port=1 password='S3c\'r3t-esc'", ["S3c'r3t-esc", r"S3c\'r3t-esc"]),
    ("unicode", "host=127.0.0.1 port=1 password=пароль-S3cr3t-✓", ["пароль-S3cr3t-✓"]),
    ("very-long", f"host=127.0.0.1 port=1 password={LONG}", [LONG, LONG[:40]]),
    ("no-spaces", "host=127.0.0.1port=1password=S3cr3t-nospace", ["S3cr3t-nospace"]),
    ("multiple-hosts", "postgresql://u:S3cr3t-multi@127.0.0.1:1,127.0.0.1:2/db", ["S3cr3t-multi"]),
    ("url-bad-port", "postgresql://u:S3cr3t-badport@127.0.0.1:badport/db", ["S3cr3t-badport"]),
    ("options-kv", "host=127.0.0.1 port=1 options='-c app.password=S3cr3t-opt'", ["S3cr3t-opt"]),
    ("options-url", "postgresql://u@127.0.0.1:1/db?options=-c%20app.password%3DS3cr3t-urlopt", ["S3cr3t-urlopt"]),
    ("options-bare", "host=127.0.0.1 port=1 options='password=S3cr3t-bareopt'", ["S3cr3t-bareopt"]),
    ("at-in-password", "postgresql://u:p@ss-S3cr3t-at@127.0.0.1:1/db", ["p@ss-S3cr3t-at", "ss-S3cr3t-at"]),
    ("bare-word", "host=127.0.0.1 port=1 S3cr3t-bare", ["S3cr3t-bare"]),
    ("dbname-is-a-dsn", "dbname='host=127.0.0.1 port=1 password=S3cr3t-nested'", ["S3cr3t-nested"]),
    ("sslpassword", "host=127.0.0.1 port=1 sslpassword=S3cr3t-ssl", ["S3cr3t-ssl"]),
    ("tabs-and-newlines", "host=127.0.0.1\tport=1\npassword=S3cr3t-ws\n", ["S3cr3t-ws"]),
    ("unknown-service", "service=pgrace_no_such_service password=S3cr3t-svc", ["S3cr3t-svc"]),
    ("ipv6-url", "postgresql://u:S3cr3t-ipv6@[::1]:1/db", ["S3cr3t-ipv6"]),
    ("uppercase-scheme", "POSTGRESQL://u:S3cr3t-scheme@127.0.0.1:1/db", ["S3cr3t-scheme"]),
]

SCENARIO = """title = "tiny"
sessions = ["a"]
[[step]]
session = "a"
sql = "SELECT 1"
"""


@pytest.fixture(autouse=True)
def forget_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no remembered secret: one test's scrubbing must not hide another's leak."""
    monkeypatch.setattr("pgrace.servers.secrets._REMEMBERED", set())


def forbidden(secrets: list[str]) -> list[bytes]:
    """The secrets as bytes, also percent-encoded: the forms a leak could take."""
    return [form.encode() for s in secrets for form in {s, quote(s, safe="")}]


def written_files(root: Path) -> Iterator[Path]:
    return (p for p in root.rglob("*") if p.is_file())


def assert_clean(result: Result, secrets: list[str], root: Path) -> None:
    assert result.exit_code not in (0, 1), result.output  # it cannot have run
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    streams = result.stdout_bytes + (result.stderr_bytes or b"")
    for secret in forbidden(secrets):
        assert secret not in streams, (secret[:40], result.output)
        for path in written_files(root):
            assert secret not in path.read_bytes(), path


@pytest.mark.parametrize(("dsn", "secrets"), [pytest.param(d, s, id=i) for i, d, s in SHAPES])
def test_no_dsn_shape_leaks_its_password(dsn: str, secrets: list[str], tmp_path: Path) -> None:
    story = tmp_path / "tiny.toml"
    story.write_text(SCENARIO)
    cli = CliRunner()
    for args in (
        ["run", str(story), "-o", str(tmp_path / "out.txt")],
        ["run", str(story), "--format", "json", "-o", str(tmp_path / "out.json")],
        ["run", str(story), "--format", "html", "-o", str(tmp_path / "out.html")],
        ["check", str(story), "--junit", str(tmp_path / "junit.xml"), "--golden", "--update"],
        ["clean"],
        ["explore", str(story), "-o", str(tmp_path / "explore.txt")],
        ["sweep", str(story)],
        ["matrix", "--format", "json", "-o", str(tmp_path / "matrix.json")],
    ):
        assert_clean(cli.invoke(main, [*args, "--dsn", dsn]), secrets, tmp_path)
        assert_clean(cli.invoke(main, args, env={"PGRACE_DSN": dsn}), secrets, tmp_path)
    assert_clean(cli.invoke(main, ["run", str(story), "--server", dsn]), secrets, tmp_path)
    assert_clean(cli.invoke(main, ["check", str(story), "--server", dsn, "--server", dsn]), secrets, tmp_path)


def test_a_malformed_dsn_is_not_echoed_but_the_problem_is_named() -> None:
    cli = CliRunner()
    result = cli.invoke(main, ["run", "nowait", "--dsn", "host=127.0.0.1 password='S3cr3t"])
    assert "S3cr3t" not in result.output
    assert "unterminated quoted string" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = cli.invoke(main, ["run", "nowait", "--dsn", "host=127.0.0.1 passwrd=S3cr3t"])
    assert "S3cr3t" not in result.output and 'invalid connection option "…"' in result.stderr


def test_a_real_process_with_pgrace_dsn_leaks_nothing(tmp_path: Path) -> None:
    """The env-var path in a real process: its stderr is what a terminal would show."""
    for _, dsn, secrets in SHAPES[:6]:
        proc = subprocess.run(
            [sys.executable, "-m", "pgrace", "clean"],
            env={**os.environ, "PGRACE_DSN": dsn},
            capture_output=True,
            timeout=60,
        )
        assert proc.returncode not in (0, 1), proc.stderr
        assert b"Traceback" not in proc.stderr
        for secret in forbidden(secrets):
            assert secret not in proc.stdout + proc.stderr


def test_a_connection_failure_names_the_server_without_its_password() -> None:
    assert describe_dsn("postgresql://u:S3cr3t@127.0.0.1:1/db") == "postgresql://u@127.0.0.1:1/db"
    assert describe_dsn("host=h port=5 user=me password=S3cr3t dbname=d") == "postgresql://me@h:5/d"
    assert describe_dsn("host=h passwrd=S3cr3t") == "the given DSN"  # libpq rejects it: nothing is shown
    # libpq takes "ss-S3cr3t@h" as the host of this URL: that host is not shown either
    assert "S3cr3t" not in describe_dsn("postgresql://u:p@ss-S3cr3t@h/db")


def test_scrubbing_finds_passwords_libpq_would_not() -> None:
    assert "S3cr3t-x" in dsn_secrets("host=h password='S3cr3t-x")
    assert "S3cr3t-y" in dsn_secrets("host=h S3cr3t-y")
    assert "S3cr3t-z" in dsn_secrets("host=hpassword=S3cr3t-z")
    assert scrub_secrets("host ss-S3cr3t@h not found", "postgresql://u:p@ss-S3cr3t@h/db") == "host ***@h not found"
    assert "S3cr3t" not in redact_dsn("host=h passwrd=S3cr3t")
    assert dsn_secrets("host=h port=5432 user=me dbname=d sslmode=require") == frozenset()


# -- a real server that checks passwords -------------------------------------------------

VICTIM_PASSWORD = "Righ7-but-secret-pw"
WRONG_PASSWORD = "Wr0ng-and-also-secret"


@pytest.fixture(scope="module")
def password_server(pgrace_server: ServerInfo) -> Iterator[str]:
    """The test server, with a role that must log in by password (scram), as a DSN without one."""
    with psycopg.connect(pgrace_server.dsn, autocommit=True) as admin:
        row = admin.execute("SHOW hba_file").fetchone()
        hba = Path(str(row[0])) if row else None
        if hba is None or not os.access(hba, os.W_OK):
            pytest.skip("the test server's pg_hba.conf is not ours to change")
        original = hba.read_text()
        admin.execute("DROP ROLE IF EXISTS pgrace_victim")
        admin.execute(
            sql.SQL("CREATE ROLE pgrace_victim LOGIN CREATEDB PASSWORD {}").format(sql.Literal(VICTIM_PASSWORD))
        )
        rules = "local all pgrace_victim scram-sha-256\nhost all pgrace_victim all scram-sha-256\n"
        hba.write_text(rules + original)
        admin.execute("SELECT pg_reload_conf()")
        try:
            yield make_conninfo(pgrace_server.dsn, user="pgrace_victim")
        finally:
            hba.write_text(original)
            admin.execute("SELECT pg_reload_conf()")
            admin.execute("DROP ROLE IF EXISTS pgrace_victim")


def test_password_authentication_failed_does_not_leak(password_server: str, tmp_path: Path) -> None:
    params = conninfo_to_dict(password_server)
    host = quote(str(params["host"]), safe="")
    shapes = [
        make_conninfo(password_server, password=WRONG_PASSWORD),
        f"postgresql://pgrace_victim:{WRONG_PASSWORD}@{host}:{params['port']}/postgres",
        f"postgresql://pgrace_victim@{host}:{params['port']}/postgres?pass%77ord={WRONG_PASSWORD}",
    ]
    cli = CliRunner()
    for dsn in shapes:
        for args in (["run", "nowait", "-o", str(tmp_path / "out.txt")], ["check", "scenarios"], ["clean"]):
            result = cli.invoke(main, [*args, "--dsn", dsn])
            assert result.exit_code == 3, result.output
            assert "password authentication failed" in result.stderr
            assert_clean(result, [WRONG_PASSWORD], tmp_path)


def test_a_run_with_the_right_password_shows_it_nowhere(password_server: str, tmp_path: Path) -> None:
    dsn = make_conninfo(password_server, password=VICTIM_PASSWORD)
    cli = CliRunner()
    story = tmp_path / "tiny.toml"
    story.write_text(SCENARIO)
    outputs = []
    for fmt in ("text", "json", "html", "svg", "markdown", "mermaid", "isolation"):
        result = cli.invoke(main, ["run", "nowait", "--format", fmt, "-o", str(tmp_path / f"out.{fmt}"), "--dsn", dsn])
        assert result.exit_code == 0, result.output
        outputs.append(result.stdout_bytes + (result.stderr_bytes or b""))
    result = cli.invoke(
        main, ["check", str(story), "--golden", "--update", "--junit", str(tmp_path / "j.xml")], env={"PGRACE_DSN": dsn}
    )
    assert result.exit_code == 0, result.output
    outputs.append(result.stdout_bytes)
    result = cli.invoke(main, ["clean", "--dsn", dsn])
    assert result.exit_code == 0 and "pgrace_victim@" in result.output  # the user is named, not the secret
    outputs.append(result.stdout_bytes)
    assert (tmp_path / "out.json").read_text().count("pgrace_victim") >= 1
    for blob in [*outputs, *(p.read_bytes() for p in written_files(tmp_path))]:
        assert VICTIM_PASSWORD.encode() not in blob
    shutil.rmtree(tmp_path)


def test_passwords_from_a_service_file_pgpassword_or_pgpass_do_not_leak(
    password_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libpq finds these passwords itself; the wrong one is rejected by the server, and never shown."""
    params = conninfo_to_dict(password_server)
    service_file = tmp_path / "pg_service.conf"
    service_file.write_text(
        f"[victim]\nhost={params['host']}\nport={params['port']}\nuser=pgrace_victim\n"
        f"dbname=postgres\npassword={WRONG_PASSWORD}\n"
    )
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"*:*:*:pgrace_victim:{WRONG_PASSWORD}\n")
    pgpass.chmod(0o600)
    cli = CliRunner()
    cases = [
        ("service=victim", {"PGSERVICEFILE": str(service_file)}),
        (password_server, {"PGPASSWORD": WRONG_PASSWORD}),
        (password_server, {"PGPASSFILE": str(pgpass)}),
    ]
    for dsn, env in cases:
        for args in (["run", "nowait"], ["clean"]):
            result = cli.invoke(main, [*args, "--dsn", dsn], env=env)
            assert result.exit_code == 3, result.output
            assert "password authentication failed" in result.stderr
            assert_clean(result, [WRONG_PASSWORD], tmp_path / "none")


@pytest.mark.parametrize("debug", ["", "1"])
def test_an_internal_error_shows_neither_a_password_nor_a_control_character(
    debug: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pgrace.cli.exits import report_internal_error
    from pgrace.servers import remember_secrets

    monkeypatch.setenv("PGRACE_DEBUG", debug)
    remember_secrets("host=127.0.0.1 password=S3cr3t-internal")
    try:
        raise RuntimeError('connection to "127.0.0.1" with S3cr3t-internal failed \x1b]0;pwned\x07')
    except RuntimeError as exc:
        report_internal_error(exc)
    err = capsys.readouterr().err
    assert "internal error" in err and "RuntimeError" in err
    assert "S3cr3t-internal" not in err and "\x1b" not in err and "\x07" not in err


def test_one_commands_secrets_do_not_blank_out_a_later_commands_words() -> None:
    """Found in CI: a fuzzed `--dsn 'password=sql'` made every later message in the process read `postgre***`."""
    cli = CliRunner()
    failed = cli.invoke(main, ["run", "lost-update", "--dsn", "host=/nonexistent port=1 password=shipped"])
    assert failed.exit_code == 3, failed.output
    assert "shipped" not in failed.output
    later = cli.invoke(main, ["show", "no-such-race"])  # its one-line error goes through the scrubber
    assert later.exit_code == 2, later.output
    assert "no shipped scenario 'no-such-race'" in later.stderr and "***" not in later.stderr
