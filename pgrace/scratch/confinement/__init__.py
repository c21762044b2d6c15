"""Which SQL can be kept inside a scratch schema: decided before any of it runs.

In schema mode (``--allow-scratch-schema``) a run lives in a throwaway schema of the
user's own database, next to the user's tables. Every connection of the run has only
that schema on its ``search_path`` (see :mod:`pgrace.scratch`), so an unqualified name
resolves there, in ``pg_temp`` or in ``pg_catalog``, never in ``public``. What that
cannot confine is refused here, up front, with the reason: names qualified with another
schema, changing ``search_path``, statements that act on the database, roles, the server
or files, dynamic SQL that cannot be read before it runs, and writes to the catalogs.

The check uses PostgreSQL's own parser (pglast) and walks every statement, including the
bodies of SQL and PL/pgSQL functions and ``DO`` blocks. Its limits, said plainly: a name
hidden in a string is only seen where PostgreSQL turns a string into a name (casts to
``regclass`` and friends, ``nextval`` and the other functions in ``rules.NAME_ARGUMENTS``);
functions installed into ``pg_catalog`` by the user's extensions run as their authors
wrote them; ``NOTIFY`` and advisory locks are shared by the whole database.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pglast
from pglast import ast
from pglast.enums import TransactionStmtKind

from pgrace.errors import ScenarioError
from pgrace.model.scenario import Scenario
from pgrace.scratch.confinement.rules import Unconfined
from pgrace.scratch.confinement.walk import check_text

__all__ = ["confine_scenario", "refusal", "sql_texts"]


def refusal(text: str, prepared: Iterable[str] = ()) -> str | None:
    """Why ``text`` cannot be confined to a scratch schema, or None when it can.

    ``prepared`` holds the two-phase transaction names that the same scenario prepares
    itself: only those may be committed or rolled back.
    """
    try:
        check_text(text, frozenset(prepared) | frozenset(_prepared_in(text)))
    except Unconfined as exc:
        return str(exc)
    return None


def confine_scenario(scenario: Scenario) -> None:
    """Raise :class:`ScenarioError` (``file:line``) at the first SQL of ``scenario`` that schema mode refuses."""
    texts = list(sql_texts(scenario))
    prepared = frozenset(gid for text, _ in texts for gid in _prepared_in(text))
    for text, line in texts:
        reason = refusal(text, prepared)
        if reason is not None:
            raise ScenarioError(
                f"refused in a scratch schema (--allow-scratch-schema): {reason}", scenario.source, line
            )


def sql_texts(scenario: Scenario) -> Iterator[tuple[str, int | None]]:
    """Every SQL text the scenario would run, with the line it comes from, its variables filled in.

    Parameters are known; what steps capture is not yet: a captured value stands in as
    NULL, and as an identifier as ``pgrace_variable`` (so ``:"v".t`` is seen qualified).
    """
    from pgrace.model.variables import Value, find, param_values, substitute

    params = param_values(scenario)

    def filled(text: str) -> str:
        if scenario.dialect != "pgrace":
            return text
        values = {
            use.key: params.get(use.key) or Value("pgrace_variable" if use.form == "identifier" else None)
            for use in find(text)
        }
        return substitute(text, values)

    for text in scenario.setup:
        yield filled(text), scenario.setup_line
    for session in scenario.sessions:
        for block in (session.setup, session.teardown):
            if block is not None:
                yield filled(block), session.line
    for step in scenario.steps:
        if step.sleep is None and step.crash is None:  # those are pgrace's own actions, not SQL
            yield filled(step.sql), step.line
    for check in scenario.checks:
        yield filled(check.sql), check.line
    for text in scenario.teardown:
        yield filled(text), scenario.setup_line


def _prepared_in(text: str) -> Iterator[str]:
    try:
        statements = pglast.parse_sql(text)
    except pglast.parser.ParseError:
        return
    for raw in statements:
        stmt = raw.stmt
        if isinstance(stmt, ast.TransactionStmt) and stmt.kind == TransactionStmtKind.TRANS_STMT_PREPARE:
            yield str(stmt.gid)
