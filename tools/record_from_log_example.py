"""Record examples/from-log/deadlock.log: a real deadlock, logged by the embedded PostgreSQL 18.

The server logs as docs/guide/from-log.md recommends (log_lock_waits, a short
deadlock_timeout, log_statement = all, log_line_prefix '%m [%p] %a %v %x '); alice and bob
transfer money in opposite orders (tools/incidents.py). Then the scenario pgrace writes
from that log is examples/from-log/deadlock.toml.

    python tools/record_from_log_example.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pgrace.drivers.fromlog import from_log
from tools import incidents

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    target = ROOT / "examples" / "from-log"
    with incidents.logging_server("18") as server:
        incidents.deadlock(server)
        shutil.copy(server.logfile(), target / "deadlock.log")
    found = from_log(["examples/from-log/deadlock.log"], verify=False)
    assert found.written is not None
    (target / "deadlock.toml").write_text(found.written.text + "\n")


if __name__ == "__main__":
    main()
