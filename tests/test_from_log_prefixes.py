"""The common ``log_line_prefix`` shapes are detected with and without each of their fields.

A server logs a real deadlock under each prefix; from-log reads its log without ``--prefix``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import tools.incidents as real
from pgrace.drivers.fromlog import from_log
from pgrace.drivers.fromlog.records import open_log

SHAPES = [
    "%t [%p]: user=%u,db=%d,app=%a ",  # pgBadger's, without client=%h
    "%t [%p]: [%l-1] user=%u,db=%d,app=%a,client=%h ",  # pgBadger's, whole
    "%m [%p]: [%l-1] db=%d,user=%u ",
    "%t [%p]: app=%a,client=%h ",
    "%m [%p] %a %v ",
    "%m [%p] %q%u@%d %a ",
    "%t [%p] %x ",
]


@pytest.mark.server
def test_the_common_shapes_are_detected_with_and_without_their_fields(tmp_path: Path) -> None:
    logs = {}
    for n, shape in enumerate(SHAPES):
        with real.logging_server("18", prefix=shape) as logging:
            real.deadlock(logging)
            logs[shape] = tmp_path / f"shape{n}.log"
            shutil.copy(logging.logfile(), logs[shape])
    for shape, log in logs.items():
        fmt = open_log(str(log), None)
        assert fmt.prefix is not None and fmt.prefix.template == shape, (shape, fmt)
        found = from_log([str(log)], verify=False)
        assert [i.kind for i in found.incidents] == ["deadlock"], shape
        assert found.incident is not None
        names = set(found.incident.names.values())
        assert names == {"alice", "bob"} if "%a" in shape else all(n.startswith("pid") for n in names), shape
        assert found.written is not None and 'error = "40P01"' in found.written.text
