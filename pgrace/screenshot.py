"""Headless Chromium screenshots of pgrace's HTML pages, and a tiny PNG codec.

Used to make the pictures in ``docs/`` (``python -m pgrace.screenshot``, or ``make
pictures``) and by the browser tests, which look at the pixels. Only the standard
library: PNG is zlib plus a filter byte per row; Chromium is a subprocess. Nothing here
is needed to run scenarios.

Every picture in ``docs/`` carries, in a PNG ``tEXt`` chunk, the SHA-256 of the HTML it
was taken from, so a test can tell whether it still shows what the current code draws.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from pgrace.model import Scenario
from pgrace.servers import ServerInfo

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
SOURCE_KEY = "pgrace-html-sha256"


def find_chromium() -> str | None:
    """The browser binary, or None. ``PGRACE_CHROMIUM`` overrides the search."""
    override = os.environ.get("PGRACE_CHROMIUM")
    if override:
        return override if Path(override).exists() else None
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def chromium_args(binary: str, profile: str) -> list[str]:
    """Flags for a quiet, offline, sandbox-free headless run (containers run as root)."""
    return [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--user-data-dir={profile}",
    ]


def run_chromium(page: Path, extra: list[str], timeout: float = 90.0) -> subprocess.CompletedProcess[bytes]:
    binary = find_chromium()
    if binary is None:
        raise FileNotFoundError("chromium is not installed")
    with tempfile.TemporaryDirectory(prefix="pgrace-chromium-") as profile:
        args = [*chromium_args(binary, profile), *extra, page.resolve().as_uri()]
        return subprocess.run(args, capture_output=True, timeout=timeout, check=False)


def screenshot(page: Path, png: Path, width: int, height: int) -> None:
    """Take a ``width`` x ``height`` screenshot of ``page``; raise when none was written."""
    png.unlink(missing_ok=True)
    result = run_chromium(page, [f"--screenshot={png.resolve()}", f"--window-size={width},{height}"])
    if not png.exists():
        raise RuntimeError(f"chromium wrote no screenshot: {result.stderr.decode(errors='replace')[-400:]}")


def dump_dom(page: Path) -> str:
    """The DOM after Chromium has loaded and laid out ``page``."""
    result = run_chromium(page, ["--dump-dom"])
    return result.stdout.decode("utf-8", "replace")


# -- PNG ---------------------------------------------------------------------------------


@dataclass
class Image:
    """RGB pixels, row by row; ``text`` holds the PNG's tEXt chunks."""

    width: int
    height: int
    rows: list[bytearray]
    text: dict[str, str]

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        row = self.rows[y]
        return row[3 * x], row[3 * x + 1], row[3 * x + 2]


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def decode_png(data: bytes) -> Image:
    """8-bit RGB or RGBA, non-interlaced PNGs (what Chromium writes), as RGB."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos = 8
    idat = b""
    text: dict[str, str] = {}
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or colour not in (2, 6) or interlace:
                raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}, interlace {interlace}")
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        elif kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            text[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"IEND":
            break
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytearray] = []
    previous = bytearray(stride)
    offset = 0
    for _ in range(height):
        method = raw[offset]
        line = bytearray(raw[offset + 1 : offset + 1 + stride])
        offset += 1 + stride
        if method == 2:  # up: the common case for flat pictures, done without an index loop
            line = bytearray((a + b) & 0xFF for a, b in zip(line, previous, strict=True))
        elif method in (1, 3, 4):
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                up = previous[i]
                if method == 1:
                    line[i] = (line[i] + left) & 0xFF
                elif method == 3:
                    line[i] = (line[i] + (left + up) // 2) & 0xFF
                else:
                    corner = previous[i - channels] if i >= channels else 0
                    line[i] = (line[i] + _paeth(left, up, corner)) & 0xFF
        previous = line
        if channels == 4:
            rgb = bytearray(width * 3)
            rgb[0::3], rgb[1::3], rgb[2::3] = line[0::4], line[1::4], line[2::4]
            rows.append(rgb)
        else:
            rows.append(line)
    return Image(width, height, rows, text)


def png_text(data: bytes) -> dict[str, str]:
    """A PNG's tEXt chunks, without decoding its pixels."""
    text: dict[str, str] = {}
    pos = 8
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        if kind == b"tEXt":
            key, _, value = data[pos + 8 : pos + 8 + length].partition(b"\0")
            text[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"IDAT":
            break  # pgrace writes its text before the pixels
        pos += 12 + length
    return text


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def encode_png(image: Image) -> bytes:
    """RGB, filter "up" per row (small for flat pictures), maximum compression."""
    raw = bytearray()
    previous = bytearray(image.width * 3)
    for row in image.rows:
        raw.append(2)
        raw += bytes((a - b) & 0xFF for a, b in zip(row, previous, strict=True))
        previous = row
    header = struct.pack(">IIBBBBB", image.width, image.height, 8, 2, 0, 0, 0)
    text = b"".join(_chunk(b"tEXt", k.encode("latin-1") + b"\0" + v.encode("latin-1")) for k, v in image.text.items())
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + text
        + _chunk(b"IDAT", zlib.compress(bytes(raw), 9))
        + _chunk(b"IEND", b"")
    )


def crop_to_content(image: Image, background: tuple[int, int, int] = (255, 255, 255), margin: int = 16) -> Image:
    """Cut the empty background off the bottom and the right, keeping a margin."""
    bg = bytes(background)

    def blank_row(y: int) -> bool:
        return image.rows[y] == bg * image.width

    bottom = image.height
    while bottom > 1 and blank_row(bottom - 1):
        bottom -= 1
    right = 1
    for row in image.rows[:bottom]:
        for x in range(image.width - 1, right - 1, -1):
            if row[3 * x : 3 * x + 3] != bg:
                right = x + 1
                break
    width = min(image.width, right + margin)
    height = min(image.height, bottom + margin)
    return Image(width, height, [bytearray(row[: 3 * width]) for row in image.rows[:height]], dict(image.text))


def page_width(html: str) -> int:
    """A window wide enough that no picture on the page is scaled down (page margins: 64 px)."""
    widths = [int(w) for w in re.findall(r'<svg [^>]*?width="(\d+)"', html)]
    if 'class="compare"' in html:
        return max(1100, sum(widths) + 32 * (len(widths) - 1) + 64 + 8)
    return max(1100, max(widths, default=0) + 64 + 8)


def html_digest(html: str) -> str:
    return hashlib.sha256(html.encode("utf-8")).hexdigest()


def picture(html: str, png: Path, width: int = 1280, height: int = 4000) -> None:
    """Screenshot ``html`` into ``png``, cropped, tagged with the HTML's digest."""
    with tempfile.TemporaryDirectory(prefix="pgrace-picture-") as folder:
        page = Path(folder) / "page.html"
        page.write_text(html, encoding="utf-8")
        shot = Path(folder) / "shot.png"
        screenshot(page, shot, width, height)
        image = crop_to_content(decode_png(shot.read_bytes()))
    image.text = {SOURCE_KEY: html_digest(html)}
    png.write_bytes(encode_png(image))


# -- the pictures in docs/ ---------------------------------------------------------------

DOCS_COMPARE = ("lost-update",)  # scenarios whose bug-and-fix page is pictured too
DOCS_EXTRA = (("skip-locked-fanout", "bug"),)  # variants pictured besides each file's first one


def docs_pages(server: ServerInfo) -> dict[str, str]:
    """File name in docs/ -> the HTML it pictures, from fresh runs (on the embedded server:
    its label is part of the page)."""
    from pgrace import api, catalog
    from pgrace.render.html import render_html, render_html_compare

    pages: dict[str, str] = {}
    for name in catalog.shipped_names():
        scenario = catalog.load(name)
        pages[f"{name}.png"] = render_html(api.run(scenario, server=server))
        for extra, variant in DOCS_EXTRA:
            if extra == name:
                pages[f"{name}-{variant}.png"] = render_html(
                    api.run(scenario.variant_named(variant), server=server), scenario
                )
        if name in DOCS_COMPARE and scenario.other is not None:
            runs = [api.run(v, server=server) for v in _bug_then_fix(scenario)]
            pages[f"{name}-compare.png"] = render_html_compare(runs)
    return pages


def _bug_then_fix(scenario: Scenario) -> list[Scenario]:
    variants = [scenario] if scenario.other is None else [scenario, scenario.other]
    return sorted(variants, key=lambda s: s.variant != "bug")


def main(argv: list[str] | None = None) -> int:
    """Regenerate the pictures in a folder (default ``docs/``)."""
    args = sys.argv[1:] if argv is None else argv
    folder = Path(args[0] if args else "docs")
    folder.mkdir(parents=True, exist_ok=True)
    if find_chromium() is None:
        print("pgrace.screenshot: chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    from pgrace.servers import open_server

    with open_server("embedded") as server:
        pages = docs_pages(server)
    for file_name, html in pages.items():
        picture(html, folder / file_name, width=page_width(html))
        print(f"{folder / file_name}: {(folder / file_name).stat().st_size // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
