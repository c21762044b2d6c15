"""A slice of bench/bench_fuzz_surfaces.py: generated scenario files and options, each a real ``python -m pgrace``.

The files exercise ``[load]``, ``[fix.load]``, sleep and crash steps, ``waits_on``,
``released_by``, params for sweeps and ``retry`` loops (valid and not), with hostile values (pgbench
meta-commands whose shell command would leave a marker file, SQL in values, huge and
NaN-ish numbers, control characters); the options ``-j``, ``--max``, ``--shard``,
``--seed``, ``-c``, ``-T``, ``-t``, ``--step-timeout``, ``-o`` and ``--emit`` get hostile or
small values. Each case must exit 0-3 within its bound with no traceback, run no shell
command, leave its scenario file as it was and nothing but what ``-o``/``--emit`` asked
for, and leave the server with no scratch database and no backend. The slice is fixed
(seed 0, the first CASES cases; make test runs the first EVERYDAY, the thorough tier the rest); the bench runs 3,000
and more.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tiers import tiered

from bench import bench_fuzz_surfaces as fuzz

CASES = 60
EVERYDAY = 20


@pytest.fixture(scope="module")
def lane() -> Iterator[fuzz.Lane]:
    with fuzz.lanes(1) as (only,):
        yield only


@pytest.mark.server
@pytest.mark.parametrize("index", tiered(range(CASES), range(EVERYDAY, CASES)))
def test_a_generated_case_ends_cleanly(lane: fuzz.Lane, index: int) -> None:
    case = fuzz.generate(0, index)
    result = lane.run(case)
    shown = (
        f"{' '.join(case.args)}\nhostile: {case.hostile}\nstderr: {result.stderr[-1500:]}\n--- file\n{case.text[:3000]}"
    )
    assert not result.problems, f"{'; '.join(result.problems)}\n{shown}"


def test_the_slice_reaches_every_command_and_runs_some() -> None:
    cases = [fuzz.generate(0, i) for i in range(CASES)]
    assert {c.command for c in cases} == {
        "show",
        "run",
        "explore",
        "sweep",
        "sweep-explore",
        "check",
        "check-explore",
        "load",
        "load-emit",
    }
    texts = "\n".join(c.text for c in cases)
    for surface in ("[load]", "[fix.load]", "sleep = ", "crash = ", "waits_on", "released_by", "\\shell", "retry"):
        assert surface in texts, surface
    assert fuzz.GOOD_RETRY in texts and any(bad in texts for bad in fuzz.BAD_RETRIES), "retry loops, valid and not"
    assert sum(1 for c in cases if not c.hostile) >= 10, "a third of the cases should run, not only be refused"
