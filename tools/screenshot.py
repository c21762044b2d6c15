"""Headless Chromium screenshots of pgrace's HTML pages (development tooling, not installed).

Used to make the pictures in ``docs/`` (``python -m tools.screenshot``, or ``make
pictures``) and by the browser tests, which look at the pixels. Chromium is a
subprocess; PNGs are read and written with Pillow (a dev dependency). Nothing here is
needed to run scenarios.

Every picture in ``docs/`` carries, in a PNG ``tEXt`` chunk, the SHA-256 of the HTML it
was taken from, so a test can tell whether it still shows what the current code draws.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image, ImageChops
from PIL.PngImagePlugin import PngInfo

from pgrace.model.scenario import Scenario
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


# -- PNG (Pillow) -------------------------------------------------------------------------


def load_rgb(png: Path) -> Image.Image:
    """A PNG's pixels as RGB (Chromium writes RGBA)."""
    with Image.open(png) as image:
        return image.convert("RGB")


def png_text(data: bytes) -> dict[str, str]:
    """A PNG's tEXt chunks (pgrace writes them before the pixels, so the pixels are not decoded)."""
    with Image.open(io.BytesIO(data)) as image:
        return {k: v for k, v in image.info.items() if isinstance(k, str) and isinstance(v, str)}


def crop_to_content(
    image: Image.Image, background: tuple[int, int, int] = (255, 255, 255), margin: int = 16
) -> Image.Image:
    """Cut the empty background off the bottom and the right, keeping a margin."""
    box = ImageChops.difference(image, Image.new("RGB", image.size, background)).getbbox()
    right, bottom = (box[2], box[3]) if box else (1, 1)
    return image.crop((0, 0, min(image.width, right + margin), min(image.height, bottom + margin)))


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
        image = crop_to_content(load_rgb(shot))
    info = PngInfo()
    info.add_text(SOURCE_KEY, html_digest(html))
    image.save(png, "PNG", pnginfo=info, optimize=True)


# -- the pictures in docs/ ---------------------------------------------------------------

DOCS_COMPARE = ("lost-update",)  # scenarios whose bug-and-fix page is pictured too
DOCS_EXTRA = (("skip-locked-fanout", "bug"),)  # variants pictured besides each file's first one


def docs_pages(server: ServerInfo) -> dict[str, str]:
    """File name in docs/ -> the HTML it pictures, from fresh runs (on the embedded server:
    its label is part of the page)."""
    from pgrace import api
    from pgrace.frontends import catalog
    from pgrace.render.html import render_html, render_html_compare

    pages: dict[str, str] = {}
    for name in catalog.shipped_names():
        scenario = catalog.read_scenario(name)
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
        print("tools.screenshot: chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    from pgrace.servers import open_server

    with open_server("embedded") as server:
        pages = docs_pages(server)
    for file_name, html in pages.items():
        png = folder / file_name
        if png.is_file() and png_text(png.read_bytes()).get(SOURCE_KEY) == html_digest(html):
            print(f"{png}: up to date")  # same page, same picture: no churn in git
            continue
        picture(html, png, width=page_width(html))
        print(f"{png}: {png.stat().st_size // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
