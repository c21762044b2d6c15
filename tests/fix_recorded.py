"""Recorded runs: what the renderer tests draw, without a server.

``tests/recorded/NAME.VARIANT.json`` is a real run of a shipped scenario or of
``tests/recorded/NAME.toml``, made by ``python -m tools.record_runs`` (record again after a
change to what a run records). The renderers are pure functions of a run, so a test of how
a run is drawn needs only the recording; a test of what a run records needs the server.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from pgrace.model.timeline import Run
from tools.record_runs import RECORDED, load_run

Recorded = Callable[[str, str], Run]

__all__ = ["RECORDED", "Recorded", "recorded"]


@pytest.fixture(scope="session")
def recorded() -> Recorded:
    """``recorded(name, variant)``: the recorded run, read once per test session (renderers do not change it)."""
    return functools.cache(lambda name, variant: load_run(f"{name}.{variant}"))
