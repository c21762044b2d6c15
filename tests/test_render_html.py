"""The HTML timeline as a person sees it: opened in headless Chromium, screenshotted, and
the pixels checked: worker 2's lane holds the orange wait band and the striped wait bar,
and the arrow reaches into worker 1's lane, whose badge says it holds jobs id=1. Also:
the pictures in docs/ (shown in the README and on the docs pages) are what the current code draws.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

from pgrace.cli import main
from pgrace.render.common import PALETTE, WAIT_COLOUR, WAIT_DARK
from pgrace.servers import ServerInfo, open_server
from tools.screenshot import (
    SOURCE_KEY,
    crop_to_content,
    docs_pages,
    dump_dom,
    find_chromium,
    html_digest,
    load_rgb,
    png_text,
    screenshot,
)

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="chromium is not installed (Debian: apt-get install chromium): the HTML was not looked at in a browser",
)


def rgb(hex_colour: str) -> bytes:
    return bytes(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))


def pixels(image: Image.Image, hex_colour: str) -> list[tuple[int, int]]:
    """Every pixel of exactly this colour (flat fills render exactly), found at C speed."""
    target = rgb(hex_colour)
    data, stride = image.tobytes(), 3 * image.width
    found = []
    for y in range(image.height):
        row = data[y * stride : (y + 1) * stride]
        start = row.find(target)
        while start != -1:
            if start % 3 == 0:
                found.append((start // 3, y))
            start = row.find(target, start + 1)
    return found


def longest_run(values: list[int]) -> range:
    """The longest stretch of consecutive integers in sorted ``values``."""
    best = current = range(0)
    for value in values:
        current = range(current.start, value + 1) if current and value == current.stop else range(value, value + 1)
        best = max(best, current, key=len)
    return best


def x_range(points: list[tuple[int, int]]) -> range:
    xs = sorted(x for x, _ in points)
    return range(xs[0], xs[-1] + 1)


class WaitGroups(HTMLParser):
    """The wait groups of a DOM dump, with the text inside each."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[dict[str, str | None]] = []
        self.texts: list[str] = []
        self.depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.depth:
            self.depth += tag == "g"
        elif tag == "g" and dict(attrs).get("class") == "wait":
            self.waits.append(dict(attrs))
            self.texts.append("")
            self.depth = 1

    def handle_endtag(self, tag: str) -> None:
        if self.depth and tag == "g":
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.depth:
            self.texts[-1] += data


@pytest.mark.browser
@needs_chromium
def test_a_browser_shows_worker2_waiting_on_job_1_held_by_worker1(pgrace_server: ServerInfo, tmp_path: Path) -> None:
    page = tmp_path / "hol.html"
    args = ["run", "head-of-line-blocking", "--format", "html", "-o", str(page), "--dsn", pgrace_server.dsn]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output

    # the browser built the picture's elements
    found = WaitGroups()
    found.feed(dump_dom(page))
    [wait] = found.waits
    assert (wait["data-waiter"], wait["data-holder"], wait["data-row"]) == ("worker2", "worker1", "jobs id=1")
    assert "waits for worker1 on jobs id=1" in found.texts[0] and "worker1 holds jobs id=1" in found.texts[0]

    # and painted it where a person looks for it
    shot = tmp_path / "hol.png"
    screenshot(page, shot, 1100, 1500)
    image = load_rgb(shot)
    assert (image.width, image.height) == (1100, 1500)
    lane1 = x_range(pixels(image, PALETTE[0].light))  # the lane tints are used for nothing else
    lane2 = x_range(pixels(image, PALETTE[1].light))
    assert 250 <= len(lane1) <= 320 and 250 <= len(lane2) <= 320 and lane1.stop < lane2.start

    orange = pixels(image, WAIT_COLOUR)
    band = [(x, y) for x, y in orange if x in lane2]
    assert len(band) > 3000, "worker 2's lane should show the orange wait band"
    band_rows = longest_run(sorted(y for y, n in Counter(y for _, y in band).items() if n > 100))
    assert len(band_rows) >= 20, "the band should be a thick orange strip"
    dark = pixels(image, WAIT_DARK)
    arrow = [(x, y) for x, y in dark if x in lane1 and y in band_rows]
    assert len(arrow) > 60, "the wait's arrow should reach into worker 1's lane"
    badge = [(x, y) for x, y in pixels(image, PALETTE[0].strong) if x in lane1 and y in band_rows]
    assert len(badge) > 100, "worker 1's lane should show its padlock badge next to the arrow"
    bar = [y for x, y in dark if x in range(lane2.start + 10, lane2.start + 32) and y > band_rows.stop]
    assert bar and max(bar) - min(bar) > 60, "a striped bar should run down worker 2's lane until it resumes"


@pytest.fixture(scope="module")
def embedded(pgrace_server: ServerInfo) -> Iterator[ServerInfo]:
    """The embedded server: its label is part of the pictured pages."""
    if pgrace_server.label.startswith("embedded"):
        yield pgrace_server
    else:
        with open_server("embedded") as server:
            yield server


def test_the_pictures_in_docs_show_what_the_current_code_draws(embedded: ServerInfo) -> None:
    pages = docs_pages(embedded)
    assert {f"{name}.png" for name in ("lost-update", "head-of-line-blocking", "nowait")} <= set(pages)
    stale = []
    for name, html in pages.items():
        picture = DOCS / name
        assert picture.is_file(), f"docs/{name} is missing: run `make pictures` (needs chromium)"
        data = picture.read_bytes()
        assert len(data) < 600_000, f"docs/{name} is too big for a README"
        if png_text(data).get(SOURCE_KEY) != html_digest(html):
            stale.append(name)
    assert not stale, f"docs/{', '.join(stale)}: stale; run `make pictures` (needs chromium) to redraw"


def test_the_readme_shows_pictures_from_docs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shown = re.findall(r"!\[[^\]]*\]\((docs/[^)]+\.png)\)", readme)
    assert shown, "the README should show a picture of a timeline"
    for path in shown:
        assert (ROOT / path).is_file(), path


def test_pictures_are_cropped_to_their_content_with_a_margin() -> None:
    image = Image.new("RGB", (300, 200), (255, 255, 255))
    image.paste((10, 20, 30), (40, 5, 120, 90))  # content ends at x=119, y=89
    cropped = crop_to_content(image)
    assert cropped.size == (120 + 16, 90 + 16)
    assert cropped.getpixel((40, 5)) == (10, 20, 30) and cropped.getpixel((0, 0)) == (255, 255, 255)
    assert crop_to_content(Image.new("RGB", (50, 50), (255, 255, 255))).size == (17, 17)
