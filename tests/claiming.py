"""The SKIP LOCKED claim every client test through the proxy shares: two workers, two pending jobs.

Each worker reads the first pending job (:data:`PENDING`), then marks it claimed and counts the
claim (:func:`claim`), in one transaction. Without a lock both can read job 1 and claim it twice;
with :data:`SKIP_LOCKED` appended to the read no order does. The scenario file
(:data:`CLAIM_FILE`, tests/clients/claim.toml) holds the setup and the checks for ``--exec``
commands (its bug variant's check is the double claim's signature, ``--fix``'s says each job is
claimed once); :data:`SETUP`, :data:`FINAL` and :data:`CLAIMED_ONCE` are the same for
``pgrace.proxy`` async sessions. :func:`double_claim_found` and :func:`cure_proved` judge an
exploration either way, by its final states.
"""

from __future__ import annotations

from pathlib import Path

from pgrace.api import read_scenario
from pgrace.model.exploration import Exploration

CLAIM_FILE = Path(__file__).parent / "clients" / "claim.toml"
PENDING = "SELECT id FROM jobs WHERE status = 'pending' ORDER BY id LIMIT 1"
SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"

_BUG = read_scenario(str(CLAIM_FILE))
assert _BUG.other is not None
_FIX = _BUG.other
SETUP = "".join(_BUG.setup)
FINAL = _FIX.checks[0].sql
CLAIMED_ONCE = [list(row) for row in _FIX.checks[0].rows]
"""Jobs 1 and 2 claimed once each: what every order must leave with the cure."""
DOUBLE_CLAIM = _BUG.checks[0].rows
"""Job 1 claimed twice, job 2 by nobody: the final state only the race leaves."""


def claim(parameter: str) -> str:
    """The UPDATE that marks the job read claimed, with the driver's ``parameter`` placeholder (``$1``, ``%s``)."""
    return f"UPDATE jobs SET status = 'claimed', claims = claims + 1 WHERE id = {parameter}"


def _finals(explored: Exploration) -> set[tuple[tuple[object, ...], ...]]:
    return {c.final[0] for c in explored.classes}


def double_claim_found(found: Exploration) -> int:
    """The search was complete and some order claims job 1 twice (others once each); its run count."""
    assert found.complete, found.incomplete
    assert _finals(found) == {DOUBLE_CLAIM, tuple(map(tuple, CLAIMED_ONCE))}, [c.summary for c in found.classes]
    assert not any(c.errors or c.unexpected for c in found.classes), [c.summary for c in found.classes]
    assert found.runs is not None
    return found.runs


def cure_proved(proved: Exploration) -> int:
    """The search was complete and every order claims each job once, with no error; its run count."""
    assert proved.complete, proved.incomplete
    assert _finals(proved) == {tuple(map(tuple, CLAIMED_ONCE))}, [c.summary for c in proved.classes]
    assert proved.ok and not any(c.errors or c.unexpected for c in proved.classes), [c.summary for c in proved.classes]
    assert proved.runs is not None
    return proved.runs
