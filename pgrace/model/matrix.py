"""What ``pgrace matrix`` measured: the lock conflict tables, pair by pair, beside the manual's.

The measuring is :mod:`pgrace.drivers.matrix`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pgrace.errors import EXIT_FAILED, EXIT_OK

__all__ = ["Matrix", "MatrixTable", "ModePair"]


@dataclass(frozen=True)
class ModePair:
    """One measured pair: does ``requested`` wait while another session holds ``held``?"""

    held: str
    requested: str
    blocks: bool
    documented_blocks: bool
    seen: str = ""  # the lock pgrace saw: what the requester waited for, or what both hold

    def to_dict(self) -> dict[str, Any]:
        return {
            "held": self.held,
            "requested": self.requested,
            "blocks": self.blocks,
            "documented_blocks": self.documented_blocks,
        }

    @property
    def agrees(self) -> bool:
        return self.blocks == self.documented_blocks


@dataclass
class MatrixTable:
    """One conflict table: a pair per (held, requested) mode."""

    modes: tuple[str, ...]
    cells: list[ModePair] = field(default_factory=list)

    def cell(self, held: str, requested: str) -> ModePair:
        return next(c for c in self.cells if c.held == held and c.requested == requested)

    @property
    def disagreements(self) -> list[ModePair]:
        return [c for c in self.cells if not c.agrees]

    def to_dict(self) -> dict[str, Any]:
        return {"modes": list(self.modes), "cells": [c.to_dict() for c in self.cells]}


@dataclass
class Matrix:
    """What ``pgrace matrix`` measured: the row-lock and table-lock conflict tables of one server."""

    server_version: str
    server_label: str
    row: MatrixTable
    table: MatrixTable

    def to_dict(self) -> dict[str, Any]:
        return {"server_version": self.server_version, "row": self.row.to_dict(), "table": self.table.to_dict()}

    @property
    def ok(self) -> bool:
        """Every measured pair agrees with the manual's tables."""
        return not self.row.disagreements and not self.table.disagreements

    @property
    def exit_code(self) -> int:
        """``pgrace matrix``'s: 1 when a pair differs from the manual's tables."""
        return EXIT_OK if self.ok else EXIT_FAILED
