"""pgrace matrix: every cell measured by two real sessions, asserted against the manual's tables."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from fix_servers import PG15, needs_pg15

from pgrace.cli import main
from pgrace.drivers.matrix import (
    DOCUMENTED_ROW_CONFLICTS,
    DOCUMENTED_TABLE_CONFLICTS,
    ROW_OPERATIONS,
    TABLE_LOCK_MODES,
    measure,
)
from pgrace.model.matrix import Matrix
from pgrace.servers import ServerInfo, open_server

# The manual's tables, written out cell by cell (rows: requested, as in the manual; "X": conflict),
# independently of pgrace.drivers.matrix's encoding, which is checked against them too.
MANUAL_TABLE_13_2 = {  # requested: AS RS RE SUE S SRE E AE (held)
    "ACCESS SHARE": "       X",
    "ROW SHARE": "      XX",
    "ROW EXCLUSIVE": "    XXXX",
    "SHARE UPDATE EXCLUSIVE": "   XXXXX",
    "SHARE": "  XX XXX",
    "SHARE ROW EXCLUSIVE": "  XXXXXX",
    "EXCLUSIVE": " XXXXXXX",
    "ACCESS EXCLUSIVE": "XXXXXXXX",
}
MANUAL_TABLE_13_3 = {  # requested: FOR KEY SHARE, FOR SHARE, FOR NO KEY UPDATE, FOR UPDATE (held)
    "FOR KEY SHARE": "   X",
    "FOR SHARE": "  XX",
    "FOR NO KEY UPDATE": " XXX",
    "FOR UPDATE": "XXXX",
}
STATEMENT_MODES = {  # the manual, 13.3.2: which row lock each statement takes
    "UPDATE non-key": "FOR NO KEY UPDATE",
    "UPDATE key": "FOR UPDATE",
    "DELETE": "FOR UPDATE",
    "INSERT child (FK)": "FOR KEY SHARE",
}


def _manual_row_blocks(held: str, requested: str) -> bool:
    modes = list(MANUAL_TABLE_13_3)
    held_mode, requested_mode = STATEMENT_MODES.get(held, held), STATEMENT_MODES.get(requested, requested)
    return MANUAL_TABLE_13_3[requested_mode][modes.index(held_mode)] == "X"


def _manual_table_blocks(held: str, requested: str) -> bool:
    return MANUAL_TABLE_13_2[requested][list(MANUAL_TABLE_13_2).index(held)] == "X"


def test_the_encoded_tables_are_the_manuals() -> None:
    for requested in TABLE_LOCK_MODES:
        for held in TABLE_LOCK_MODES:
            assert (held in DOCUMENTED_TABLE_CONFLICTS[requested]) == _manual_table_blocks(held, requested)
    for requested, row in MANUAL_TABLE_13_3.items():
        assert {m for m, x in zip(MANUAL_TABLE_13_3, row, strict=True) if x == "X"} == DOCUMENTED_ROW_CONFLICTS[
            requested
        ]
    assert {op.name: op.mode for op in ROW_OPERATIONS if op.name in STATEMENT_MODES} == STATEMENT_MODES


def _assert_every_cell_is_the_manuals(measured: Matrix) -> None:
    assert len(measured.row.cells) == 64 and len(measured.table.cells) == 64
    wrong = [
        (c.held, c.requested, c.blocks)
        for c in measured.row.cells
        if c.blocks != _manual_row_blocks(c.held, c.requested)
    ]
    wrong += [
        (c.held, c.requested, c.blocks)
        for c in measured.table.cells
        if c.blocks != _manual_table_blocks(c.held, c.requested)
    ]
    assert wrong == []
    assert not measured.row.disagreements and not measured.table.disagreements
    for cell in measured.row.cells + measured.table.cells:  # a block was seen by the server, with its lock
        assert cell.seen.startswith("waits for") == cell.blocks, cell


def test_matrix_on_postgresql_18_is_the_manuals_in_every_cell(pgrace_server: ServerInfo) -> None:
    measured = measure(pgrace_server)
    _assert_every_cell_is_the_manuals(measured)
    key_share = measured.row.cell("FOR KEY SHARE", "UPDATE non-key")
    assert not key_share.blocks  # the point of FOR NO KEY UPDATE: a foreign key check does not stop it
    assert "FOR KEY SHARE" in key_share.seen  # both hold the row: pgrowlocks shows the shared lock


@pytest.mark.server
@needs_pg15
def test_matrix_on_postgresql_15_is_the_manuals_in_every_cell() -> None:
    with open_server(str(PG15)) as server:
        measured = measure(server)
    assert measured.server_version.startswith("15")
    _assert_every_cell_is_the_manuals(measured)


def test_matrix_command_json_contract(pgrace_server: ServerInfo) -> None:
    result = CliRunner().invoke(main, ["matrix", "-f", "json", "--dsn", pgrace_server.dsn])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) == {"server_version", "row", "table"}
    assert data["row"]["modes"][:4] == ["FOR KEY SHARE", "FOR SHARE", "FOR NO KEY UPDATE", "FOR UPDATE"]
    assert data["table"]["modes"] == list(TABLE_LOCK_MODES)
    cell = data["table"]["cells"][0]
    assert cell == {"held": "ACCESS SHARE", "requested": "ACCESS SHARE", "blocks": False, "documented_blocks": False}
