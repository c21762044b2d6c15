"""Java clients for the proxy's tests: pgjdbc (Debian's libpostgresql-jdbc-java) and a JDK to compile them.

A developer without them gets a skip that says what to install; CI installs both and sets
``PGRACE_REQUIRE_CLIENTS=1``, so there a missing one fails the tests instead of hiding them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

JDBC = Path("/usr/share/java/postgresql.jar")
CLIENTS = Path(__file__).parent / "clients"
REQUIRED = os.environ.get("PGRACE_REQUIRE_CLIENTS", "") not in ("", "0")


def missing() -> str | None:
    """What of Java is not installed, for people (None: javac, java and pgjdbc are)."""
    if not JDBC.exists():
        return f"no pgjdbc at {JDBC} (apt-get install libpostgresql-jdbc-java)"
    for tool in ("java", "javac"):
        if shutil.which(tool) is None:
            return f"no {tool} (apt-get install openjdk-17-jdk-headless)"
    return None


def require() -> None:
    """Skip the test without Java, or fail it under ``PGRACE_REQUIRE_CLIENTS``."""
    if (problem := missing()) is not None:
        if REQUIRED:
            pytest.fail(f"PGRACE_REQUIRE_CLIENTS is set but there is {problem}")
        pytest.skip(problem)


def compile_clients(where: Path, *sources: str) -> Path:
    """``sources`` (files of tests/clients, or written into ``where`` already) compiled into ``where``."""
    require()
    paths = [str(CLIENTS / s) if (CLIENTS / s).exists() else s for s in sources]
    subprocess.run(["javac", "-cp", str(JDBC), "-d", str(where), *paths], cwd=where, check=True, timeout=300)
    return where


def command(classes: Path, main: str, *args: str, flags: str = "") -> str:
    """The shell command line that runs class ``main`` with pgjdbc on its class path."""
    return " ".join(["java", *flags.split(), "-cp", f"{JDBC}:{classes}", main, *args])
