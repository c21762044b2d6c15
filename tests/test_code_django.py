"""Django's ORM interleaved on pgrace's connections: get() + save() loses an update; select_for_update() and F() cure it.

The example (examples/code/withdraw_django.py) configures Django in code, on its
PostgreSQL backend over psycopg 3; pgrace.drivers.code_django hands each session's
thread pgrace's connection as Django's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction
from documentation import page
from test_code import ROOT, _example

from pgrace.drivers.code import explore_code, run_code
from pgrace.drivers.code_django import connected, session
from pgrace.errors import CodeError
from pgrace.model.exploration import Exploration
from pgrace.servers import ServerInfo

EXAMPLE = _example("withdraw_django")
LIMIT = 20  # runs: the acceptance for the race and each cure


def _explore(fn: Callable[[], object], server: ServerInfo, **options: Any) -> Exploration:
    sessions = {"alice": session(fn), "bob": session(fn)}
    return explore_code(sessions, setup=EXAMPLE.SETUP, final=EXAMPLE.FINAL, server=server, **options)


def test_get_then_save_loses_an_update(pgrace_server: ServerInfo) -> None:
    found = _explore(EXAMPLE.withdraw, pgrace_server)
    assert found.complete and found.run_count <= LIMIT
    assert {c.final[0] for c in found.classes} == {((400,),), ((300,),)}
    lost = next(c for c in found.classes if c.final[0] == ((400,),))
    kinds = [sql.split()[0] for _, sql in lost.statements]
    assert sorted(kinds) == ["COMMIT", "COMMIT", "SELECT", "SELECT", "UPDATE", "UPDATE"]  # no setter, no set-up


@pytest.mark.parametrize("cure", ["withdraw_locked", "withdraw_f"])
def test_both_cures_hold_in_every_order(pgrace_server: ServerInfo, cure: str) -> None:
    found = _explore(getattr(EXAMPLE, cure), pgrace_server)
    assert found.complete and found.run_count <= LIMIT
    assert {c.final[0] for c in found.classes} == {((300,),)}


def test_the_reduced_classes_are_every_orders(pgrace_server: ServerInfo) -> None:
    for fn in (EXAMPLE.withdraw, EXAMPLE.withdraw_locked, EXAMPLE.withdraw_f):
        reduced, every = _explore(fn, pgrace_server), _explore(fn, pgrace_server, reduce=False)
        assert {(c.final, c.errors) for c in reduced.classes} == {(c.final, c.errors) for c in every.classes}


def test_steps_are_noted_at_the_applications_lines(pgrace_server: ServerInfo, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    run = run_code(
        {"alice": session(EXAMPLE.withdraw_locked), "bob": session(EXAMPLE.withdraw_locked)},
        setup=EXAMPLE.SETUP,
        final=EXAMPLE.FINAL,
        order=["alice", "bob", "alice", "alice", "bob", "bob"],
        server=pgrace_server,
    )
    first = EXAMPLE.withdraw_locked.__code__.co_firstlineno
    where = f"examples/code/withdraw_django.py:{first + 2}"  # the with statement's line: its COMMIT
    get, save = f"examples/code/withdraw_django.py:{first + 3}", f"examples/code/withdraw_django.py:{first + 5}"
    assert [(s.session, s.sql.split()[0], s.note) for s in run.scenario.steps] == [
        ("alice", "SELECT", get),
        ("bob", "SELECT", get),
        ("alice", "UPDATE", save),
        ("alice", "COMMIT", where),
        ("bob", "UPDATE", save),
        ("bob", "COMMIT", where),
    ]
    (waited,) = [s for s in run.step_runs() if s.waited]
    assert (waited.session, waited.waits[0].holder) == ("bob", "alice")
    assert run.scenario.name == "withdraw_locked"  # the session's name and place are the function's


def test_a_queryset_iterator_declares_and_fetches_as_steps(pgrace_server: ServerInfo) -> None:
    """QuerySet.iterator() reads through Django's own server-side cursor class, which pgrace did not make."""

    def total() -> None:
        with transaction.atomic():
            assert sum(a.balance for a in EXAMPLE.Account.objects.order_by("pk").iterator(chunk_size=10)) == 500

    run = run_code({"t": session(total)}, setup=EXAMPLE.SETUP, server=pgrace_server)
    shown = [s.sql for s in run.step_runs()]
    # the cursor's name is left out: Django names it after the thread, another in every run
    assert (
        shown[0]
        == 'DECLARE CURSOR FOR SELECT "accounts"."id", "accounts"."balance" FROM "accounts" ORDER BY "accounts"."id" ASC'
    )
    again = run_code({"t": session(total)}, setup=EXAMPLE.SETUP, server=pgrace_server)
    assert [s.sql for s in again.step_runs()] == shown  # the same statements in every run
    assert shown[1:] == [
        "FETCH (server-side cursor)",
        "FETCH (server-side cursor)",
        "CLOSE (server-side cursor)",
        "COMMIT",
    ]


def test_only_pgraces_connection_is_handed_over() -> None:
    with pytest.raises(CodeError, match="takes the connection pgrace passes to a session"), connected(object()):
        pass


def test_the_guide_shows_the_examples_real_output(
    pgrace_server: ServerInfo, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    text = page("guide/your-own-code.md")
    block = re.search(r"<!-- output: python examples/code/withdraw_django.py -->\n```text\n(.*?)```\n", text, re.S)
    assert block is not None
    EXAMPLE.main(server=pgrace_server)
    shown = capsys.readouterr().out

    def server_free(text: str) -> str:  # the server line names the server the tests run on
        return "\n".join(line for line in text.splitlines() if not line.startswith("server: "))

    assert server_free(shown) == server_free(block[1])
