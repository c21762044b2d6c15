"""Small vocabulary shared by the scenario file's readers: key paths, step base names, suggestions."""

from __future__ import annotations

#: Where a value sits in the TOML document: table keys and array indexes from the root.
KeyPath = tuple[str | int, ...]


def did_you_mean(word: str, choices: set[str] | list[str]) -> str:
    import difflib  # for a mistake's message only: a valid file never needs it

    close = difflib.get_close_matches(word, sorted(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def base_name(step_name: str) -> str:
    """``claim`` for ``claim.worker1``: the name a step of a session group is written with."""
    return step_name.rsplit(".", 1)[0] if "." in step_name else step_name
