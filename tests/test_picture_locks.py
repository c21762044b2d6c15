"""Pictures never drop a lock: every holder of a row in its own colour, and no label cut short.

Four readers share one row (FOR SHARE each). The SVG's cell for that row is four stripes,
each in its holder's session colour, with as many labels as fit and "+N more" for the rest;
its tooltip lists them all. Before, a cell showed two holders and was painted in the first
holder's colour. A holder badge's label is wrapped, never ended with "…".
"""

from __future__ import annotations

import textwrap
import xml.etree.ElementTree as ET

import pytest
from fix_recorded import RECORDED, Recorded

from pgrace import api
from pgrace.frontends import catalog
from pgrace.frontends.scenario_toml import parse_toml_scenario
from pgrace.model.timeline import Run
from pgrace.render.common import PALETTE
from pgrace.render.html import render_html
from pgrace.render.svg import render_svg
from pgrace.servers import ServerInfo

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def run(recorded: Recorded) -> Run:
    """tests/recorded/readers.toml: four readers share a row with a long table name, then a writer wants it."""
    return recorded("readers", "bug")


@pytest.fixture(scope="module")
def live_run(pgrace_server: ServerInfo) -> Run:
    """The same scenario run now: what the runner records of it, not how it is drawn."""
    return api.run(catalog.read_scenario(str(RECORDED / "readers.toml")), server=pgrace_server)


def cells(svg: str) -> list[ET.Element]:
    root = ET.fromstring(svg)
    return [g for g in root.iter(f"{SVG}g") if g.get("class") == "lock-cell"]


def test_a_cell_held_by_four_sessions_shows_four_stripes_in_their_colours(run: Run) -> None:
    four = [g for g in cells(render_svg(run)) if g.get("data-holders", "").count(";") == 3]
    assert four, "no cell holds all four readers"
    cell = four[0]
    stripes = [r for r in cell.iter(f"{SVG}rect") if r.get("class") == "lock"]
    assert [r.get("data-session") for r in stripes] == ["r1", "r2", "r3", "r4"]
    assert [r.get("fill") for r in stripes] == [PALETTE[i].strong for i in range(4)]
    title = cell.find(f"{SVG}title")
    assert title is not None and title.text is not None
    assert all(f"r{i} FOR SHARE" in title.text for i in range(1, 5))
    labels = [t.text for t in cell.iter(f"{SVG}text")]
    shown = [name for name in labels if name in ("r1", "r2", "r3", "r4")]
    more = [t for t in labels if t and t.startswith("+")]
    assert len(shown) + (int(more[0][1:].split()[0]) if more else 0) == 4, labels


def test_no_label_in_the_picture_is_cut_short(run: Run) -> None:
    texts = [t.text or "" for t in ET.fromstring(render_svg(run)).iter(f"{SVG}text")]
    assert not any(t.endswith("…") for t in texts), [t for t in texts if t.endswith("…")]


def test_the_html_page_carries_the_same_cells(run: Run) -> None:
    page = render_html(run)
    assert page.count('class="lock-cell"') == render_svg(run).count('class="lock-cell"') > 0


def test_an_update_of_a_row_four_readers_share_waits_for_all_and_resumes_after_the_last(live_run: Run) -> None:
    """The server waits for each member of the row's multixact in turn; pg_blocking_pids names one at a time.
    The timeline said "waits for r1 … resumes after r1's COMMIT (step 6)"; the UPDATE went on at r4's (step 9)."""
    write = next(s for s in live_run.step_runs() if s.step == "write")
    [wait] = write.waits
    assert wait.blocked_by == ("r1", "r2", "r3", "r4")
    assert write.release is not None and (write.release.session, write.release.seq) == ("r4", 9)


LATE_SHARER = """
setup = "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0)"
sessions = ["r1", "w", "r2"]
[[step]]
session = "r1"
sql = "BEGIN; SELECT * FROM t WHERE id = 1 FOR SHARE"
[[step]]
name = "w-upd"
session = "w"
sql = "UPDATE t SET v = 1 WHERE id = 1"
[[step]]
session = "r2"
sql = "BEGIN; SELECT * FROM t WHERE id = 1 FOR SHARE"
[[step]]
session = "r1"
sql = "COMMIT"
[[step]]
session = "r2"
sql = "COMMIT"
"""


def test_a_share_taken_after_the_wait_began_is_waited_for_too(pgrace_server: ServerInfo) -> None:
    """r2 shares the row after w began to wait: the server makes w wait for r2 as well; w went on at r2's
    COMMIT (step 5), where the timeline said r1's (step 4)."""
    run = api.run(parse_toml_scenario(textwrap.dedent(LATE_SHARER), "late.toml"), server=pgrace_server)
    write = next(s for s in run.step_runs() if s.step == "w-upd")
    assert write.release is not None and (write.release.session, write.release.seq) == ("r2", 5)
