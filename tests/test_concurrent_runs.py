"""Sixteen runs at once on one server, eight in schema mode and eight in database mode: all right.

One round of ``bench/bench_concurrent.py`` (which repeats it): shipped scenarios and corpus
specs mixed, the schema-mode ones as a role without CREATEDB in one shared user database.
Every scenario's expectations hold, every spec prints exactly its expected output, no
traceback, nothing left behind and the user's tables unchanged.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

from corpus import needs_corpus

from pgrace.servers import ServerInfo


def bench() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "bench" / "bench_concurrent.py"
    spec = importlib.util.spec_from_file_location("bench_concurrent", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@needs_corpus
def test_sixteen_runs_at_once_in_both_modes_are_all_right(pgrace_server: ServerInfo) -> None:
    concurrent = bench()
    with concurrent.user_database(pgrace_server) as (owner, role):
        batch = concurrent.jobs(16, random.Random(9), owner, role)
        assert sum("schema mode" in job.label for job in batch) == 8
        assert sum(job.spec is not None for job in batch) == 8
        right, problems = concurrent.run_round(batch, owner)
    assert problems == []
    assert right == 16
