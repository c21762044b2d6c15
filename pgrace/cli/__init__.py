"""The ``pgrace`` command: thin click commands over :mod:`pgrace.api`.

:mod:`pgrace.cli.base` holds the group, the options the commands share and the one place
errors reach the user; each module beside it holds the commands of one kind. Each command
parses options, calls one library function and renders. Importing this package imports
none of the drivers or renderers (tests/test_import_cost.py): each command imports what it
needs when it runs.
"""

from __future__ import annotations

from pgrace.cli import cleaning, from_log, loading, proving, running  # each adds its commands to `main`
from pgrace.cli.base import FORMATS, PgraceGroup, main

__all__ = ["FORMATS", "PgraceGroup", "cleaning", "from_log", "loading", "main", "proving", "running"]
