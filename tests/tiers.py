"""The thorough tier: tests that repeat, at many times the cost, what a faster test of the same feature checks.

Whole explorations and soundness comparisons over every shipped variant or every client: ``make test``
leaves them out unless ``PGRACE_THOROUGH`` is set, and CI sets it, so every change is still checked
by them before it lands. A feature keeps at least one everyday test.
"""

from __future__ import annotations

import os
from collections.abc import Container, Iterable

import pytest
from _pytest.mark import ParameterSet

#: Whether this run is the thorough one (``PGRACE_THOROUGH=1 make test``, as CI runs it).
THOROUGH = os.environ.get("PGRACE_THOROUGH", "") not in ("", "0")


def tiered(values: Iterable[object], long: Container[object]) -> list[ParameterSet]:
    """One parameter set per value (a tuple spreads over several arguments); those in ``long`` in the thorough tier."""
    return [
        pytest.param(*(value if isinstance(value, tuple) else (value,)), marks=[pytest.mark.thorough] * (value in long))
        for value in values
    ]
