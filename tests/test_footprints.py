"""A footprint reading, after every step of the reduced search, costs as little as it can."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg._queries
import pytest

from pgrace.drivers.reduce import executor
from pgrace.frontends import catalog
from pgrace.model.orders.space import Space
from pgrace.servers import ServerInfo

ROWS = Path(__file__).parent / "explore" / "rows"


def test_the_footprint_query_is_not_converted_at_every_step(
    pgrace_server: ServerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg keeps the conversion of a ``%s`` query (placeholders to ``$n``) only for one shorter than
    4096 characters; the footprint query is longer, so it is sent as it is, never split again."""
    split: list[bytes] = []
    real = psycopg._queries._split_query

    def counted(query: bytes, *args: Any, **kwargs: Any) -> Any:
        if b"pg_locks" in query and b"pg_stat_activity" in query:
            split.append(query)
        return real(query, *args, **kwargs)

    monkeypatch.setattr(psycopg._queries, "_split_query", counted)
    scenario = catalog.read_scenario(str(ROWS / "rows-apart.toml"))
    with executor(scenario, pgrace_server, 5.0) as execute:
        trace = execute(tuple(name for chain in Space(scenario).chains for name in chain))
    assert len(trace.moves) == len(scenario.steps)  # the footprints were read: a move per step
    assert split == []
