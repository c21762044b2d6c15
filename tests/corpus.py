"""Where PostgreSQL's isolation corpus is, and what a test does without it.

The corpus lives in ``../shared/pg-isolation`` beside the checkout (test data, never
copied into the repository). A developer without it gets a skip that says so; CI has it
and sets ``PGRACE_REQUIRE_CORPUS=1``, so there a missing corpus fails the tests that need
it instead of hiding them (see ``conftest.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "pg-isolation"
REQUIRED = os.environ.get("PGRACE_REQUIRE_CORPUS", "") not in ("", "0")
SPECS = sorted((CORPUS / "specs").glob("*.spec")) if (CORPUS / "specs").is_dir() else []

needs_corpus = pytest.mark.corpus
"""Mark a test (or a parameter) that reads the corpus."""


def present() -> bool:
    return (CORPUS / "specs").is_dir() and (CORPUS / "expected").is_dir()
