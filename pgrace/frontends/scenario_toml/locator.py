"""Where a key sits in the TOML text: ``tomllib`` keeps no positions, so lines are found by scanning."""

from __future__ import annotations

import bisect
import re

from pgrace.errors import ScenarioError


class Locator:
    """Finds the line of a key in the TOML text, since ``tomllib`` does not say.

    A path such as ``("step", 2, "expect", "rows")`` is looked up as the longest prefix
    that names a table header (``[[step]]`` number 2), then key by key inside it.
    """

    HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]")

    def __init__(self, text: str, source: str) -> None:
        self.lines = text.splitlines()
        self.source = source
        self.headers: dict[tuple[str | int, ...], int] = {}
        self.starts: list[int] = []
        counts: dict[tuple[str, ...], int] = {}
        for number, line in enumerate(self.lines):
            match = self.HEADER.match(line)
            if not match:
                continue
            parts = tuple(p.strip().strip('"').strip("'") for p in match.group(2).split("."))
            self.starts.append(number)
            if match.group(1) == "[[":
                counts[parts] = counts.get(parts, -1) + 1
                self.headers[(*parts, counts[parts])] = number
            else:
                self.headers[parts] = number

    def error(self, message: str, *path: str | int) -> ScenarioError:
        return ScenarioError(message, self.source, self.line_of(*path))

    def line_of(self, *path: str | int) -> int:
        """Never unknown: a key that is missing altogether is reported at its table (or line 1)."""
        start, end, found, rest = 0, self._end_of(-1), 1, path
        for cut in range(len(path), 0, -1):
            if path[:cut] in self.headers:
                start = self.headers[path[:cut]]
                end, found, rest = self._end_of(start), start + 1, path[cut:]
                break
        else:  # no table of its own: ``[fx.step.s]`` is where the key ``fx`` first appears
            deeper = [line for header, line in self.headers.items() if path and header[: len(path)] == path]
            top_level = _key(path[0]) if path else None
            if deeper and top_level and not any(top_level.match(self.lines[k]) for k in range(end)):
                return min(deeper) + 1
        for key in rest:
            if isinstance(key, int):
                continue
            pattern = re.compile(rf"(^|[{{,\s.])[\"']?{re.escape(key)}[\"']?\s*[=.]")
            line = next((k for k in range(start, end) if pattern.search(self.lines[k])), None)
            if line is None:  # not a key of its table: perhaps a table of its own below it ([fix.stp.one])
                deeper = [
                    n for header, n in self.headers.items() if len(header) > len(path) and header[: len(path)] == path
                ]
                return min(deeper) + 1 if deeper else found
            start, found = line, line + 1
        return found

    def key_in_section(self, line: int, key: str) -> int:
        """The line of ``key = ...`` in the table whose header is on ``line`` (that line if it is not there)."""
        pattern = _key(key)
        start = line - 1
        return next((k + 1 for k in range(start, self._end_of(start)) if pattern.match(self.lines[k])), line)

    def _end_of(self, header: int) -> int:
        """The line where the section starting at ``header`` (-1: the top) ends."""
        after = bisect.bisect_right(self.starts, header)  # starts are in order: no scan per lookup
        return self.starts[after] if after < len(self.starts) else len(self.lines)


def _key(key: str | int) -> re.Pattern[str]:
    """A line that sets ``key`` at its start (bare or quoted)."""
    return re.compile(rf"\s*[\"']?{re.escape(str(key))}[\"']?\s*=")
