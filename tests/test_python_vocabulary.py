"""One vocabulary: every word of a run's JSON names the same fact on the Python objects.

A reader of ``pgrace run -f json`` who writes ``step.name``, ``step.waited_on``,
``wait.key`` or ``step.rows`` in a script gets what the JSON says, not an
``AttributeError``. Checked on every recorded run (real runs of the shipped scenarios), key
by key and value by value, recursively through waits, locks, errors and releases.
"""

from __future__ import annotations

from typing import Any

import pytest
from fix_recorded import RECORDED

from pgrace.model.values import to_json_value
from pgrace.render.json import run_to_dict
from tools.record_runs import load_run

RUNS = sorted(p.name.removesuffix(".json") for p in RECORDED.glob("*.json"))

ELSEWHERE = {
    # a 40001's SIRead locks are the step's (``step.predicate_locks_at_error``), not the error's
    "steps.error.predicate_locks",
}
DERIVED = {
    # the JSON names the session that blocked when the server named no row holder
    "steps.waited_on.holder",
}


def same(value: Any, said: Any, path: str) -> None:
    """``value`` (Python) says what ``said`` (JSON) says, under the JSON's names."""
    if isinstance(said, dict) and not isinstance(value, dict):
        for key, inner in said.items():
            where = f"{path}.{key}"
            if where in ELSEWHERE:
                continue
            assert hasattr(value, key), f"{type(value).__name__} has no {key!r} ({where} in the JSON)"
            if where not in DERIVED:
                same(getattr(value, key), inner, where)
    elif isinstance(said, dict):
        assert {k: to_json_value(v) for k, v in value.items()} == said, path
    elif isinstance(said, list):
        assert value is not None and len(value) == len(said), path
        for one, other in zip(value, said, strict=True):
            same(one, other, path)
    elif isinstance(said, float) and path.endswith("_ms"):
        assert round(value, 3) == said, path
    elif said is None and value == "":  # the JSON says null for no detail, no reason: the object ""
        pass
    else:
        assert to_json_value(value) == said, path


@pytest.mark.parametrize("name", RUNS)
def test_the_python_objects_answer_to_the_jsons_words(name: str) -> None:
    run = load_run(name)
    data = run_to_dict(run)
    for key in ("steps", "server", "server_version", "row_locks_available", "checks", "ok"):
        same(getattr(run, key), data[key], key)


def test_the_words_a_new_user_reached_for() -> None:
    run = load_run("skip-locked-fanout.bug")
    claim = next(s for s in run.steps if s.name == "claim.worker2")
    assert claim.waited and claim.rows == ((2,),) and claim.columns == ("id",) and claim.error is None
    [wait] = claim.waited_on
    assert (wait.holder, wait.table, wait.key, wait.mode) == ("worker1", "jobs", {"id": 1}, "FOR UPDATE")
    assert claim.release is not None and claim.release.step == claim.released_by
