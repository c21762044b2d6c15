"""The isolationtester .spec front end: the corpus, each grammar feature, each error."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from corpus import CORPUS, SPECS, needs_corpus
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgrace.errors import ScenarioError
from pgrace.frontends.spec import (
    MAX_AUTO_PERMUTATIONS,
    interleavings,
    parse_spec,
    permutation_count,
    tokenize,
    unused_steps,
)
from pgrace.model.scenario import CompletionMarker, PermutationStep, Scenario, Session, Step

spec_params = pytest.mark.parametrize(
    "spec_path",
    [pytest.param(spec, marks=needs_corpus) for spec in SPECS] or [pytest.param(None, marks=needs_corpus)],
    ids=lambda p: p.stem if p else "no-corpus",
)


def corpus(name: str) -> Scenario:
    path = CORPUS / "specs" / f"{name}.spec"
    return parse_spec(path.read_text(encoding="utf-8"), str(path))


def parse(text: str) -> Scenario:
    return parse_spec(text, "inline.spec")


def names(scenario: Scenario) -> list[str]:
    return [" ".join(p.step for p in permutation) for permutation in scenario.permutations]


def error_of(text: str) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        parse(text)
    assert info.value.file == "inline.spec"
    assert isinstance(info.value.line, int)
    return info.value


# -- the corpus --------------------------------------------------------------------------


@spec_params
def test_corpus_permutations_match_expected(spec_path: Path) -> None:
    scenario = parse_spec(spec_path.read_text(encoding="utf-8"), str(spec_path))
    prefix = "starting permutation: "
    expected_files = [
        path
        for path in sorted((CORPUS / "expected").glob("*.out"))
        if re.fullmatch(rf"{re.escape(spec_path.stem)}(_\d)?\.out", path.name)
    ]
    assert expected_files[0].name == f"{spec_path.stem}.out"
    for expected in expected_files:
        lines = expected.read_text(encoding="utf-8").splitlines()
        starts = [line[len(prefix) :] for line in lines if line.startswith(prefix)]
        assert names(scenario) == starts, expected.name
    assert unused_steps(scenario) == []


@spec_params
def test_corpus_step_sql_is_echoed_exactly(spec_path: Path) -> None:
    scenario = parse_spec(spec_path.read_text(encoding="utf-8"), str(spec_path))
    output = (CORPUS / "expected" / f"{spec_path.stem}.out").read_text(encoding="utf-8")
    for step in scenario.steps:
        echo = f"step {step.name}: {step.sql}"
        assert f"{echo}\n" in output or f"{echo} <waiting ...>\n" in output, step.name


@spec_params
def test_corpus_scenario_fields(spec_path: Path) -> None:
    scenario = parse_spec(spec_path.read_text(encoding="utf-8"), str(spec_path))
    assert scenario.name == scenario.title == spec_path.stem
    assert scenario.dialect == "spec" and scenario.variant == "bug"
    assert scenario.source == str(spec_path)
    assert len(scenario.teardown) <= 1
    assert {s.session for s in scenario.steps} == set(scenario.session_names)
    assert all(step.line is not None for step in scenario.steps)
    assert all(session.line is not None for session in scenario.sessions)


@needs_corpus
def test_corpus_tricky_sql() -> None:
    nowait5 = corpus("nowait-5")
    assert nowait5.step("sl1_exec").sql == (
        "\n\tBEGIN ISOLATION LEVEL READ COMMITTED;\n\tEXECUTE sl1_run;\n"
        "\tSELECT xmin, xmax, ctid, * FROM test_nowait;\n"
    )
    assert nowait5.step("sl1_prep").sql.startswith("\n\tPREPARE sl1_run AS SELECT id")
    assert [s.teardown for s in nowait5.sessions] == ["COMMIT;", None, "\n\tCOMMIT;\n"]
    assert corpus("simple-write-skew").step("rwx2").sql == ("UPDATE test SET t = 'pear' WHERE t = 'apple'")
    specconflict = corpus("insert-conflict-specconflict")
    assert specconflict.step("s1_noop").sql == ""
    assert specconflict.step("s2_noop").sql == ""
    assert specconflict.step("controller_locks").sql.startswith("SELECT pg_advisory_lock(")
    assert corpus("tuplelock-update").step("s1_advlock").sql == (
        "\n    SELECT pg_advisory_lock(142857),\n        pg_advisory_lock(285714),\n        pg_advisory_lock(571428);\n"
    )


@needs_corpus
def test_corpus_structure() -> None:
    skip3 = corpus("skip-locked-3")
    assert skip3.session_names == ["s1", "s2", "s3"]
    assert [s.setup for s in skip3.sessions] == ["BEGIN;"] * 3
    assert skip3.setup[0].startswith("\n  CREATE TABLE queue (\n\tid\tint")
    assert skip3.teardown == ("\n  DROP TABLE queue;\n",)
    assert skip3.step("s2a") == Step("s2a", "s2", "SELECT * FROM queue ORDER BY id FOR UPDATE LIMIT 1;", line=25)
    assert skip3.sessions[2] == Session("s3", "BEGIN;", None, line=28)

    update = corpus("tuplelock-update")
    assert update.permutations[0][7] == PermutationStep("s1_advunlock1", (CompletionMarker("s2_update"),))
    specconflict = corpus("insert-conflict-specconflict")
    last = specconflict.permutations[4]
    assert PermutationStep("s2_upsert", (CompletionMarker("s1_upsert", notices=10),)) in last
    assert specconflict.setup_line == 9

    skip = corpus("skip-locked")
    assert len(skip.permutations) == 20
    assert names(skip)[:2] == ["s1a s1b s1c s2a s2b s2c", "s1a s1b s2a s1c s2b s2c"]
    assert names(skip)[-1] == "s2a s2b s2c s1a s1b s1c"
    assert len(corpus("two-ids").permutations) == 90


# -- grammar features --------------------------------------------------------------------

FULL = """\
# a comment, then two global setups and a teardown
setup { CREATE TABLE t (id int); }
setup
{
  VACUUM t;
}
teardown { DROP TABLE t; }   # trailing comment

session "s 1"      # quoted, with a space
setup	{ BEGIN; }
step "a""b" { SELECT 1; }    # "" is one quote
step s1b	{	SELECT '#not a comment';	 }
teardown { COMMIT; }

session s2
step s2a {
    SELECT 2;
 }
step "step" { }
step s$x_9 {SELECT 3}

permutation "a""b" s2a s1b "step" s$x_9
permutation
    s2a   # comment between steps
    # a full-line comment
    "a""b" (s2a, *)
    s1b("step" notices 3)
    "step"(*) s$x_9
"""


def test_full_grammar() -> None:
    scenario = parse(FULL)
    assert scenario.name == scenario.title == "inline"
    assert scenario.setup == ("CREATE TABLE t (id int);", "\n  VACUUM t;\n")
    assert scenario.setup_line == 2
    assert scenario.teardown == ("DROP TABLE t;",)
    assert scenario.sessions == (
        Session("s 1", "BEGIN;", "COMMIT;", line=9),
        Session("s2", None, None, line=15),
    )
    assert [(s.name, s.session, s.sql, s.line) for s in scenario.steps] == [
        ('a"b', "s 1", "SELECT 1;", 11),
        ("s1b", "s 1", "SELECT '#not a comment';", 12),
        ("s2a", "s2", "\n    SELECT 2;\n", 16),
        ("step", "s2", "", 19),
        ("s$x_9", "s2", "SELECT 3", 20),
    ]
    assert scenario.permutations == (
        tuple(PermutationStep(n) for n in ['a"b', "s2a", "s1b", "step", "s$x_9"]),
        (
            PermutationStep("s2a"),
            PermutationStep('a"b', (CompletionMarker("s2a"), CompletionMarker(None))),
            PermutationStep("s1b", (CompletionMarker("step", notices=3),)),
            PermutationStep("step", (CompletionMarker(None),)),
            PermutationStep("s$x_9"),
        ),
    )
    assert unused_steps(scenario) == []


def test_quoted_and_plain_names_are_the_same_and_case_sensitive() -> None:
    scenario = parse('session s1 step "A" {x} step a {y}\npermutation A "a"')
    assert names(scenario) == ["A a"]


def test_keywords_need_quotes_and_are_case_sensitive() -> None:
    scenario = parse('session Session step "notices" {x} step Step {y} permutation Step')
    assert [s.name for s in scenario.steps] == ["notices", "Step"]
    assert unused_steps(scenario) == ["notices"]


def test_non_ascii_names_and_no_space_needed() -> None:
    scenario = parse("session sé step été{x}step été2{y}permutation été2 été")
    assert names(scenario) == ["été2 été"]


def test_block_trimming_keeps_newlines() -> None:
    scenario = parse("session s step a {\t \r\f\n\tx \t\n \f}\nstep b {   }")
    assert scenario.step("a").sql == "\n\tx \t\n"
    assert scenario.step("b").sql == ""


def test_hash_inside_block_is_text_and_lines_count_inside_blocks() -> None:
    scenario = parse("session s\nstep a {\n# x\n--y\n}\nstep b { z }")
    assert scenario.step("a").sql == "\n# x\n--y\n"
    assert scenario.step("b").line == 6


def test_empty_quoted_name() -> None:
    assert parse('session "" step "" {x}').steps[0].name == ""


def test_unused_steps_sorted_by_name_as_isolationtester_does() -> None:
    """isolationtester sorts its steps by name (strcmp) before warning: not declaration order."""
    scenario = parse("session s1 step c {x} step a {y}\nsession s2 step b {z}\npermutation a")
    assert unused_steps(scenario) == ["b", "c"]


def test_automatic_permutations_of_three_sessions() -> None:
    scenario = parse("session a step a1 {} step a2 {} session b step b1 {} session c step c1 {}")
    assert names(scenario) == [
        "a1 a2 b1 c1",
        "a1 a2 c1 b1",
        "a1 b1 a2 c1",
        "a1 b1 c1 a2",
        "a1 c1 a2 b1",
        "a1 c1 b1 a2",
        "b1 a1 a2 c1",
        "b1 a1 c1 a2",
        "b1 c1 a1 a2",
        "c1 a1 a2 b1",
        "c1 a1 b1 a2",
        "c1 b1 a1 a2",
    ]


def recursive_reference(sequences: list[list[str]]) -> list[tuple[str, ...]]:
    """isolationtester's recursion, literally."""
    out: list[tuple[str, ...]] = []

    def recurse(positions: list[int], picked: list[str]) -> None:
        if len(picked) == sum(len(s) for s in sequences):
            out.append(tuple(picked))
            return
        for i, seq in enumerate(sequences):
            if positions[i] < len(seq):
                positions[i] += 1
                recurse(positions, [*picked, seq[positions[i] - 1]])
                positions[i] -= 1

    recurse([0] * len(sequences), [])
    return out


@settings(deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=4).filter(lambda lengths: sum(lengths) <= 8)
)
def test_interleavings_match_isolationtester_recursion(lengths: list[int]) -> None:
    sequences = [[f"s{i}_{j}" for j in range(n)] for i, n in enumerate(lengths)]
    generated = list(interleavings(sequences))
    assert generated == recursive_reference(sequences)
    assert len(generated) == permutation_count(lengths)


def test_interleavings_is_lazy_and_handles_long_sessions() -> None:
    first = next(interleavings([[str(i) for i in range(5000)], ["x"]]))
    assert first[-1] == "x"
    assert list(itertools.islice(interleavings([["a"], ["b"]]), 5)) == [
        ("a", "b"),
        ("b", "a"),
    ]


def test_long_single_session_parses() -> None:
    steps = " ".join(f"step s{i} {{}}" for i in range(3000))
    assert len(parse(f"session s {steps}").permutations) == 1


# -- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message", "line"),
    [
        ("session s\nstep a { x }\n;", 'unexpected character ";"', 3),
        ("session s\n\nstep a { x } }", 'unexpected character "}"', 3),
        ("session s step a {x}\npermutation a -", 'unexpected character "-"', 2),
        ("session s\nstep a {\n x", "unterminated sql block", 2),
        ('session "s\nstep', "unexpected newline in quoted identifier", 1),
        ('session s step a {} permutation "a', "unterminated quoted identifier", 1),
        ("session s1\nstep a {}\nsession s2\nstep a {}", "duplicate step name: a", 4),
        ("session s\nstep a {}\nsession s\nstep b {}", "duplicate session name: s", 3),
        (
            "session s1 step a {}\nsession s2 step b {}\npermutation a\n  b(a) c",
            'undefined step "c" specified in permutation',
            4,
        ),
        (
            "session s1 step a {}\nsession s2 step b {}\npermutation a\n  b(\nc)",
            'undefined blocking step "c" referenced in permutation step "b"',
            5,
        ),
        (
            "session s1 step a {} step a2 {}\nsession s2 step b {}\npermutation a2 b\n a(a2)",
            'permutation step "a" cannot block on its own session',
            4,
        ),
        (
            "session s1 step a {} step a2 {}\npermutation a2 a (\na2 notices 2)",
            'permutation step "a" cannot block on its own session',
            3,
        ),
    ],
)
def test_isolationtester_errors(text: str, message: str, line: int) -> None:
    error = error_of(text)
    assert error.message.startswith(message)
    assert error.line == line
    assert str(error).startswith(f"inline.spec:{line}: {message}")


def test_unknown_step_gets_a_hint() -> None:
    error = error_of("session s1 step s1a {} step s1b {}\npermutation s1a s1c")
    assert error.message in (
        'undefined step "s1c" specified in permutation; did you mean "s1a" or "s1b"?',
        'undefined step "s1c" specified in permutation; did you mean "s1b" or "s1a"?',
    )
    error = error_of("session s1 step insert {}\npermutation inesrt")
    assert error.message.endswith('; did you mean "insert"?')
    error = error_of("session s1 step a {}\npermutation zzzzzz")
    assert error.message == 'undefined step "zzzzzz" specified in permutation'


def test_unknown_blocker_gets_a_hint() -> None:
    spec = "session s1 step s1a {} step s1b {}\nsession s2 step s2a {}\n"
    error = error_of(spec + "permutation s1a s2a(s1x)")
    assert error.message.endswith('; did you mean "s1a"?')
    assert error.line == 3
    error = error_of(spec + "permutation s1a s2a(s1b)")
    assert error.message.endswith('; step "s1b" exists but is not in this permutation')


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("", 1, 'expected "setup", "teardown" or "session", found end of file'),
        ("\n\n# only a comment\n", 4, "found end of file"),
        ("setup {} teardown {} teardown {}", 1, 'expected "session", found keyword'),
        ("teardown {} setup {} session s step a {}", 1, 'expected "session"'),
        ("session s\nsetup {}\n", 3, 'expected "step", found end of file'),
        ("session s\nteardown {} step a {}", 2, 'expected "setup" or "step"'),
        ("session s step a {}\nsetup {}", 2, 'expected "session", "permutation"'),
        ("session s step a {} teardown {}\nstep b {}", 2, 'found keyword "step"'),
        ("session s step a {} permutation\n", 2, "expected a step name after"),
        ("session s step a {} permutation a\n42", 2, 'found "42"'),
        ("session s step a {} permutation a (notices 3)", 1, 'found keyword "notices"'),
        ("session s step a {} permutation a ()", 1, 'found ")"'),
        ("session s step a {} permutation a (b c)", 1, 'expected "," or ")"'),
        ("session s step a {} permutation a (b notices x)", 1, "a number after"),
        ("session s step a {} permutation a (b notices 99999999999)", 1, "out of range"),
        ("session s step {}", 1, "expected a step name, found an SQL block"),
        ("session step a {}", 1, 'write "step" in double quotes'),
        ("session s step a\n\nb {}", 3, 'expected an SQL block for step "a"'),
        ("session s step a {} permutation a session t", 1, 'found keyword "session"'),
        ("session s step a {} (", 1, 'found "("'),
    ],
)
def test_syntax_errors(text: str, line: int, fragment: str) -> None:
    error = error_of(text)
    assert error.line == line
    assert fragment in error.message
    assert error.message.startswith(("syntax error: ", "notice count"))


def test_too_many_automatic_permutations() -> None:
    sessions = "\n".join(f"session s{i} " + " ".join(f"step s{i}_{j} {{}}" for j in range(6)) for i in range(4))
    assert permutation_count([6, 6, 6, 6]) > MAX_AUTO_PERMUTATIONS
    error = error_of(sessions)
    assert error.line == 1
    assert "list the permutations" in error.message


def test_tokenizer_ends_with_eof_on_the_last_line() -> None:
    tokens = tokenize("session s\n\n", "x")
    assert [(t.kind, t.line) for t in tokens] == [("keyword", 1), ("name", 1), ("eof", 3)]


# -- robustness: nothing but ScenarioError, always with a line -------------------------

PIECES = [
    "setup",
    "teardown",
    "session",
    "step",
    "permutation",
    "notices",
    "s1",
    "s2",
    "a",
    '"',
    '""',
    '"x"',
    "{",
    "}",
    "{ SELECT 1; }",
    "(",
    ")",
    ",",
    "*",
    "#",
    "\n",
    " ",
    "\t",
    "0",
    "12",
    "9999999999999",
    ";",
    "é",
    "$",
    "\r",
    "\f",
    "\x00",
]
spec_like_text = st.lists(st.sampled_from(PIECES) | st.text(max_size=3), max_size=40).map("".join)


def assert_parse_is_safe(text: str) -> None:
    try:
        scenario = parse_spec(text, "fuzz.spec")
    except ScenarioError as error:
        assert isinstance(error.line, int) and error.line >= 1
        assert error.file == "fuzz.spec"
        assert error.message
        return
    assert scenario.sessions and scenario.steps and scenario.permutations


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200) | spec_like_text)
def test_random_text_raises_only_scenario_errors(text: str) -> None:
    assert_parse_is_safe(text)


MUTATION = st.tuples(
    st.sampled_from(["delete", "duplicate", "insert"]),
    st.floats(min_value=0, max_value=1, exclude_max=True),
    st.integers(min_value=1, max_value=8),
    st.sampled_from(PIECES) | st.text(min_size=1, max_size=3),
)


def mutate(text: str, mutations: list[tuple[str, float, int, str]]) -> str:
    for kind, where, length, insert in mutations:
        pos = int(where * len(text)) if text else 0
        if kind == "delete":
            text = text[:pos] + text[pos + length :]
        elif kind == "duplicate":
            text = text[:pos] + text[pos : pos + length] * 2 + text[pos + length :]
        else:
            text = text[:pos] + insert + text[pos:]
    return text


@needs_corpus
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(SPECS or [Path("missing")]),
    st.lists(MUTATION, min_size=1, max_size=6),
)
def test_mutated_corpus_specs_raise_only_scenario_errors(
    spec_path: Path, mutations: list[tuple[str, float, int, str]]
) -> None:
    assert_parse_is_safe(mutate(spec_path.read_text(encoding="utf-8"), mutations))
