"""isolationtester output from hand-built runs, byte for byte."""

from __future__ import annotations

from corpus import CORPUS, needs_corpus

from pgrace.model.scenario import PermutationStep, Scenario, Session, Step
from pgrace.model.timeline import (
    CheckQueried,
    Event,
    LocksObserved,
    NoticeReceived,
    NotifyReceived,
    Outcome,
    PermutationStarted,
    ResultSet,
    Run,
    SetupRan,
    SqlError,
    StepCancelled,
    StepFinished,
    StepLaunched,
    StepWaiting,
    Wait,
)
from pgrace.render.isolation import render_isolation


def rs(columns: tuple[str, ...], *rows: tuple[str | None, ...]) -> ResultSet:
    return ResultSet(columns=columns, text_rows=tuple(rows))


def scenario(
    sessions: dict[str, list[tuple[str, str]]],
    permutations: list[list[str]] | None = None,
) -> Scenario:
    steps = tuple(
        Step(name=step, session=session, sql=sql)
        for session, session_steps in sessions.items()
        for step, sql in session_steps
    )
    if permutations is None:
        permutations = [[step.name for step in steps]]
    return Scenario(
        name="test",
        title="test",
        source="test.spec",
        dialect="spec",
        sessions=tuple(Session(name=name) for name in sessions),
        steps=steps,
        permutations=tuple(tuple(PermutationStep(step) for step in permutation) for permutation in permutations),
    )


class Recorder:
    """Builds the event list the runner would record, with ascending times."""

    def __init__(self, spec: Scenario) -> None:
        self.spec = spec
        self.events: list[Event] = []
        self.seq = 0
        self.permutations = 0

    def now(self) -> float:
        return float(len(self.events))

    def add(self, event: Event) -> None:
        self.events.append(event)

    def permutation(self, *steps: str) -> None:
        self.permutations += 1
        self.add(PermutationStarted(index=self.permutations, steps=steps, t=self.now()))

    def setup(self, session: str | None = None, *results: ResultSet) -> None:
        self.add(SetupRan("setup", session, Outcome(results=results), self.now()))

    def teardown(self, session: str | None = None, *results: ResultSet, error: SqlError | None = None) -> None:
        outcome = Outcome(results=results, error=error)
        self.add(SetupRan("teardown", session, outcome, self.now()))

    def launch(self, name: str) -> int:
        self.seq += 1
        step = self.spec.step(name)
        self.add(StepLaunched(self.seq, step.name, step.session, step.sql, self.now()))
        return self.seq

    def wait(self, seq: int, by_marker: bool = False) -> None:
        waits = () if by_marker else (Wait(kind="row", blocked_by=("s1",)),)
        self.add(StepWaiting(seq, waits, self.now(), by_marker=by_marker))

    def finish(
        self,
        seq: int,
        *results: ResultSet,
        error: SqlError | None = None,
        after_wait: bool = False,
    ) -> None:
        outcome = Outcome(results=results, error=error)
        self.add(StepFinished(seq, outcome, self.now(), after_wait=after_wait))
        self.add(LocksObserved(after_seq=seq, locks=(), t=self.now()))

    def step(self, name: str, *results: ResultSet, error: SqlError | None = None) -> int:
        seq = self.launch(name)
        self.finish(seq, *results, error=error)
        return seq

    def run(self) -> Run:
        run = Run(self.spec, "17.0", "test server", row_locks_available=True)
        run.events = list(self.events)
        return run


# -- skip-locked-3, the whole expected file ----------------------------------------------

SELECT = "SELECT * FROM queue ORDER BY id FOR UPDATE LIMIT 1;"
SKIP_LOCKED_3 = scenario(
    {
        "s1": [("s1a", SELECT), ("s1b", "COMMIT;")],
        "s2": [("s2a", SELECT), ("s2b", "COMMIT;")],
        "s3": [
            ("s3a", "SELECT * FROM queue ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1;"),
            ("s3b", "COMMIT;"),
        ],
    },
    [["s1a", "s2a", "s3a", "s1b", "s2b", "s3b"]],
)


def queue_row(id_: str, data: str) -> ResultSet:
    return rs(("id", "data", "status"), (id_, data, "NEW"))


def skip_locked_3_run() -> Run:
    rec = Recorder(SKIP_LOCKED_3)
    rec.permutation("s1a", "s2a", "s3a", "s1b", "s2b", "s3b")
    rec.setup()
    for session in ("s1", "s2", "s3"):
        rec.setup(session)
    rec.step("s1a", queue_row("1", "foo"))
    s2a = rec.launch("s2a")
    rec.wait(s2a)
    rec.step("s3a", queue_row("2", "bar"))
    rec.step("s1b")
    rec.finish(s2a, queue_row("1", "foo"), after_wait=True)
    rec.step("s2b")
    rec.step("s3b")
    rec.teardown()
    rec.add(CheckQueried(index=0, outcome=Outcome(results=(queue_row("1", "x"),)), t=9.0))
    return rec.run()


SKIP_LOCKED_3_OUT = "".join(
    f"{line}\n"
    for line in [
        "Parsed test spec with 3 sessions",
        "",
        "starting permutation: s1a s2a s3a s1b s2b s3b",
        "step s1a: SELECT * FROM queue ORDER BY id FOR UPDATE LIMIT 1;",
        "id|data|status",
        "--+----+------",
        " 1|foo |NEW   ",
        "(1 row)",
        "",
        "step s2a: SELECT * FROM queue ORDER BY id FOR UPDATE LIMIT 1; <waiting ...>",
        "step s3a: SELECT * FROM queue ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1;",
        "id|data|status",
        "--+----+------",
        " 2|bar |NEW   ",
        "(1 row)",
        "",
        "step s1b: COMMIT;",
        "step s2a: <... completed>",
        "id|data|status",
        "--+----+------",
        " 1|foo |NEW   ",
        "(1 row)",
        "",
        "step s2b: COMMIT;",
        "step s3b: COMMIT;",
    ]
)


def test_skip_locked_3() -> None:
    assert render_isolation(skip_locked_3_run()) == SKIP_LOCKED_3_OUT


@needs_corpus
def test_skip_locked_3_matches_the_corpus_file() -> None:
    expected = (CORPUS / "expected" / "skip-locked-3.out").read_bytes()
    assert render_isolation(skip_locked_3_run()).encode() == expected


# -- nowait-5: multi-line steps, a waiting multi-line step, a void result, an error ------

NOWAIT_5 = scenario(
    {
        "sl1": [
            (
                "sl1_prep",
                "\n\tPREPARE sl1_run AS SELECT id FROM test_nowait WHERE "
                "pg_advisory_lock(0) is not null FOR UPDATE NOWAIT;\n",
            ),
            (
                "sl1_exec",
                "\n\tBEGIN ISOLATION LEVEL READ COMMITTED;\n\tEXECUTE sl1_run;\n"
                "\tSELECT xmin, xmax, ctid, * FROM test_nowait;\n",
            ),
        ],
        "upd": [
            ("upd_getlock", "\n\tSELECT pg_advisory_lock(0);\n"),
            (
                "upd_doupdate",
                "\n\tBEGIN ISOLATION LEVEL READ COMMITTED;\n"
                "\tUPDATE test_nowait SET value = value WHERE id % 2 = 0;\n\tCOMMIT;\n",
            ),
            ("upd_releaselock", "\n\tSELECT pg_advisory_unlock(0);\n"),
        ],
        "lk1": [
            (
                "lk1_doforshare",
                "\n\tBEGIN ISOLATION LEVEL READ COMMITTED;\n\tSELECT id FROM test_nowait WHERE id % 2 = 0 FOR SHARE;\n",
            ),
        ],
    },
    [
        [
            "sl1_prep",
            "upd_getlock",
            "sl1_exec",
            "upd_doupdate",
            "lk1_doforshare",
            "upd_releaselock",
        ]
    ],
)


def nowait_5_run() -> Run:
    rec = Recorder(NOWAIT_5)
    rec.permutation(*(p.step for p in NOWAIT_5.permutations[0]))
    rec.setup()
    rec.step("sl1_prep")
    rec.step("upd_getlock", rs(("pg_advisory_lock",), ("",)))
    exec_ = rec.launch("sl1_exec")
    rec.wait(exec_)
    rec.step("upd_doupdate")
    rec.step("lk1_doforshare", rs(("id",), ("2",)))
    rec.step("upd_releaselock", rs(("pg_advisory_unlock",), ("t",)))
    message = 'could not obtain lock on row in relation "test_nowait"'
    rec.finish(exec_, error=SqlError("55P03", message), after_wait=True)
    rec.teardown("sl1")
    rec.teardown("lk1")
    rec.teardown()
    return rec.run()


NOWAIT_5_WAITING = (
    "step sl1_exec: \n"
    "\tBEGIN ISOLATION LEVEL READ COMMITTED;\n"
    "\tEXECUTE sl1_run;\n"
    "\tSELECT xmin, xmax, ctid, * FROM test_nowait;\n"
    " <waiting ...>\n"
    "step upd_doupdate: \n"
)
NOWAIT_5_END = (
    "step upd_releaselock: \n"
    "\tSELECT pg_advisory_unlock(0);\n"
    "\n"
    "pg_advisory_unlock\n"
    "------------------\n"
    "t                 \n"
    "(1 row)\n"
    "\n"
    "step sl1_exec: <... completed>\n"
    'ERROR:  could not obtain lock on row in relation "test_nowait"\n'
)


def test_multi_line_step_waiting_and_error_after_completion() -> None:
    output = render_isolation(nowait_5_run())
    assert NOWAIT_5_WAITING in output
    assert output.endswith(NOWAIT_5_END)
    assert "step upd_getlock: \n\tSELECT pg_advisory_lock(0);\n\n" in output


@needs_corpus
def test_nowait_5_matches_the_corpus_file() -> None:
    expected = (CORPUS / "expected" / "nowait-5.out").read_bytes()
    assert render_isolation(nowait_5_run()).encode() == expected


# -- notices, notifies, teardown tables, and the rest ------------------------------------


def test_notices_come_before_the_step_line_that_raised_them() -> None:
    spec = scenario({"s1": [("s1a", "SELECT f();")]}, [["s1a"]])
    rec = Recorder(spec)
    rec.permutation("s1a")
    seq = rec.launch("s1a")
    rec.add(NoticeReceived("s1", "NOTICE", "f() called", "00000", rec.now()))
    rec.add(NoticeReceived("s1", "WARNING", "careful", "01000", rec.now()))
    rec.finish(seq, rs(("f",), ("ok",)))
    assert render_isolation(rec.run()) == (
        "Parsed test spec with 1 sessions\n"
        "\n"
        "starting permutation: s1a\n"
        "s1: NOTICE:  f() called\n"
        "s1: WARNING:  careful\n"
        "step s1a: SELECT f();\n"
        "f \n"
        "--\n"
        "ok\n"
        "(1 row)\n"
        "\n"
    )


def test_session_teardown_tables_print_bare() -> None:
    unlock_all = rs(("pg_advisory_unlock_all",), ("",))
    spec = scenario({"s1": [("s1c", "COMMIT;")], "s2": [("s2c", "COMMIT;")]})
    rec = Recorder(spec)
    for _ in range(2):
        rec.permutation("s1c", "s2c")
        rec.setup()
        rec.step("s1c")
        rec.step("s2c")
        rec.teardown("s1", unlock_all)
        rec.teardown("s2", unlock_all)
        rec.teardown()
    table = "pg_advisory_unlock_all\n----------------------\n                      \n(1 row)\n\n"
    permutation = "\nstarting permutation: s1c s2c\nstep s1c: COMMIT;\nstep s2c: COMMIT;\n" + table + table
    assert render_isolation(rec.run()) == ("Parsed test spec with 2 sessions\n" + permutation + permutation)
    # Two blank lines in a row between permutations, as in lock-committed-update.out.
    assert "(1 row)\n\n\nstarting permutation" in render_isolation(rec.run())


def test_setup_table_and_every_result_of_a_multi_statement_step() -> None:
    spec = scenario({"s1": [("s1a", "SELECT 1 AS a; SELECT 'x' AS b; SET x = 1;")]})
    rec = Recorder(spec)
    rec.permutation("s1a")
    rec.setup(None, rs(("n",), ("3",)))
    rec.setup("s1", rs(("m",)))
    rec.step("s1a", rs(("a",), ("1",)), rs(("b",), ("x",)), rs(()))
    assert render_isolation(rec.run()) == (
        "Parsed test spec with 1 sessions\n"
        "\n"
        "starting permutation: s1a\n"
        "n\n-\n3\n(1 row)\n\n"
        "m\n-\n(0 rows)\n\n"
        "step s1a: SELECT 1 AS a; SELECT 'x' AS b; SET x = 1;\n"
        "a\n-\n1\n(1 row)\n\n"
        "b\n-\nx\n(1 row)\n\n"
    )


def test_error_lines_use_the_severity() -> None:
    spec = scenario({"s1": [("s1a", "SELECT 1;"), ("s1b", "x")]})
    rec = Recorder(spec)
    rec.permutation("s1a", "s1b")
    rec.step("s1a", rs(("?column?",), ("1",)), error=SqlError("40P01", "deadlock detected"))
    rec.step("s1b", error=SqlError("57P01", "terminating connection", severity="FATAL"))
    output = render_isolation(rec.run())
    assert output.endswith(
        "step s1a: SELECT 1;\n"
        "?column?\n--------\n       1\n(1 row)\n\n"
        "ERROR:  deadlock detected\n"
        "step s1b: x\n"
        "FATAL:  terminating connection\n"
    )


def test_marker_wait_cancel_and_notify() -> None:
    spec = scenario({"s1": [("s1a", "LISTEN c;")], "s2": [("s2a", "SELECT pg_sleep(1);")]})
    rec = Recorder(spec)
    rec.permutation("s2a", "s1a")
    s2a = rec.launch("s2a")
    rec.wait(s2a, by_marker=True)
    rec.wait(s2a)  # a second report for the same launch is not printed twice
    s1a = rec.launch("s1a")
    rec.add(NotifyReceived("s1", "c", "hello", "s2", rec.now()))
    rec.finish(s1a)
    rec.add(StepCancelled(s2a, 360.0, graph=(("s2", ()),), t=rec.now()))
    cancel = SqlError("57014", "canceling statement due to user request")
    rec.finish(s2a, error=cancel, after_wait=True)
    assert render_isolation(rec.run()) == (
        "Parsed test spec with 2 sessions\n"
        "\n"
        "starting permutation: s2a s1a\n"
        "step s2a: SELECT pg_sleep(1); <waiting ...>\n"
        's1: NOTIFY "c" with payload "hello" from s2\n'
        "step s1a: LISTEN c;\n"
        "isolationtester: canceling step s2a after 360 seconds\n"
        "step s2a: <... completed>\n"
        "ERROR:  canceling statement due to user request\n"
    )


def test_empty_step_prints_a_trailing_space() -> None:
    spec = scenario({"s1": [("s1_noop", "")]})
    rec = Recorder(spec)
    rec.permutation("s1_noop")
    rec.step("s1_noop")
    assert render_isolation(rec.run()).endswith("\nstep s1_noop: \n")


def test_unused_steps_are_warned_about_first() -> None:
    spec = scenario(
        {"s1": [("a", "SELECT 1;"), ("b", "SELECT 2;")], "s2": [("c", "SELECT 3;")]},
        [["a"]],
    )
    assert render_isolation(Recorder(spec).run()) == (
        "unused step name: b\nunused step name: c\nParsed test spec with 2 sessions\n"
    )


def test_unused_steps_are_warned_about_in_isolationtesters_sorted_order() -> None:
    """isolationtester walks its step array after sorting it by name (strcmp): byte order, not declaration."""
    spec = scenario(
        {"s1": [("zz", "SELECT 1;"), ("used", "SELECT 2;"), ("Bb", "SELECT 3;")], "s2": [("aa", "SELECT 4;")]},
        [["used"]],
    )
    assert render_isolation(Recorder(spec).run()).startswith(
        "unused step name: Bb\nunused step name: aa\nunused step name: zz\nParsed test spec"
    )


def test_teardown_failure_is_reported_like_isolationtester() -> None:
    spec = scenario({"s1": [("s1a", "SELECT 1;")]})
    rec = Recorder(spec)
    rec.permutation("s1a")
    rec.step("s1a")
    rec.teardown("s1", error=SqlError("25P02", "current transaction is aborted"))
    missing = 'table "t" does not exist'
    rec.teardown(error=SqlError("42P01", missing, detail="gone"))
    assert render_isolation(rec.run()).endswith(
        "step s1a: SELECT 1;\n"
        "teardown of session s1 failed: ERROR:  current transaction is aborted\n"
        f"teardown failed: ERROR:  {missing}\nDETAIL:  gone\n"
    )
