"""The one conversion of a server's error report (psycopg's :class:`~psycopg.errors.Diagnostic`) to a SqlError.

A step's result arrives as a raw ``PGresult`` (scenario steps, control SQL) or as the
exception psycopg raised (the application's code): both carry a ``Diagnostic``, and both
become the same :class:`~pgrace.model.timeline.SqlError`, so a timeline does not depend on the
transport that ran its steps.
"""

from __future__ import annotations

from dataclasses import replace

from psycopg import pq
from psycopg.errors import Diagnostic, Error, OperationalError

from pgrace.model.timeline import Outcome, SqlError

QUERY_CANCELED = "57014"
SERVER_ENDED = ("57P01", "57P02", "57P03")  # admin shutdown, crash shutdown, cannot connect now


def sql_error(diag: Diagnostic, fallback: str, text: str = "") -> SqlError:
    """``fallback``: the message when the report has none (one libpq built itself has no fields)."""
    return SqlError(
        diag.sqlstate or "XX000",
        diag.message_primary or fallback,
        diag.severity_nonlocalized or "ERROR",
        diag.message_detail or None,
        text=text,
    )


def result_error(res: pq.abc.PGresult) -> SqlError:
    """A failed result's error, with libpq's whole message as ``text`` (isolationtester prints it)."""
    return sql_error(Diagnostic(res), first_line(res.get_error_message()), raw_message(res.error_message))


def cancelled_by_pgrace(outcome: Outcome, after: str) -> Outcome:
    """The outcome of a statement pgrace cancelled ``after`` a timeout (``"the step timeout 10 s"``): its
    cancellation error says so in its DETAIL, and in libpq's whole message where it carries one, so that a
    timeline tells pgrace's cancel from the application's own."""
    error = outcome.error
    if error is None or error.sqlstate != QUERY_CANCELED:
        return outcome
    why = f"pgrace cancelled it after {after}"
    said = replace(
        error,
        detail=f"{why}; {error.detail}" if error.detail else why,
        text=f"{error.text}DETAIL:  {why}\n" if error.text else "",
    )
    return replace(outcome, error=said)


def exception_error(exc: Error) -> SqlError:
    """The error psycopg raised for a statement (its message's first line when the server sent no fields)."""
    said = str(exc).strip()
    return sql_error(exc.diag, first_line(said) if said else type(exc).__name__)


def lost_connection(exc: BaseException) -> str | None:
    """What was said (its first line) when ``exc`` says, by its SQLSTATE, that the server ended the connection or
    the link failed: it stopped, crashed, takes none (57P01-57P03), or class 08. None for anything else: a
    statement's own error (a cancel, a lock timeout), or an error without a SQLSTATE, which cannot tell a
    connection that broke from one pgrace closed itself."""
    if not isinstance(exc, OperationalError):
        return None
    state = exc.sqlstate or ""
    if state not in SERVER_ENDED and not state.startswith("08"):
        return None
    return first_line(str(exc)) or type(exc).__name__


def raw_message(message: bytes) -> str:
    """libpq's message exactly as PQerrorMessage gives it (psycopg's own accessors tidy it up)."""
    return message.decode("utf-8", "replace")


def field(res: pq.abc.PGresult, code: pq.DiagnosticField) -> str:
    value = res.error_field(code)
    return value.decode("utf-8", "replace") if value is not None else ""


def first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else text.strip()
