"""The option types of the CLI: durations and lists parsed by click, the library given numbers and tuples.

No server: what an option becomes is read from the context click makes, before any command runs.
"""

from __future__ import annotations

import re
from typing import Any

import click
import pytest

from pgrace.cli import main
from pgrace.cli.types import CommaList, Duration


def parsed(*args: str) -> dict[str, Any]:
    """What ``pgrace ARGS`` hands its command, as click parsed it."""
    command = main.commands[args[0]]
    return command.make_context(args[0], list(args[1:])).params


@pytest.mark.parametrize(
    ("text", "seconds"), [("5", 5.0), ("1.5", 1.5), ("5s", 5.0), ("1.5s", 1.5), ("200ms", 0.2), (" 300 ms ", 0.3)]
)
def test_a_duration_is_seconds_or_milliseconds(text: str, seconds: float) -> None:
    assert Duration().convert(text, None, None) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("nan", "'nan' is not a positive, finite number of seconds"),
        ("inf", "'inf' is not a positive, finite number of seconds"),
        ("0ms", "'0ms' is not a positive, finite number of seconds"),
        ("soon", "'soon' is not a number of seconds, or one ending in s or ms (5, 5s, 200ms)"),
        ("5m", "'5m' is not a number of seconds"),
    ],
)
def test_a_duration_that_is_no_positive_finite_time_is_refused(text: str, says: str) -> None:
    with pytest.raises(click.BadParameter, match=re.escape(says)):
        Duration().convert(text, None, None)


def test_a_whole_duration_takes_whole_seconds_within_its_bound() -> None:
    whole = Duration(whole=True, most=86400)
    assert whole.convert("2000ms", None, None) == 2.0
    for text in ("1.5", "200ms", "0", "86401", "nan"):
        with pytest.raises(click.BadParameter, match="is not a whole number of seconds from 1 to 86400"):
            whole.convert(text, None, None)


def test_a_list_converts_each_item_and_refuses_a_bad_or_empty_one() -> None:
    counts = CommaList(click.IntRange(1, 1000), "client counts from 1 to 1000", "1,2,4,8")
    assert counts.convert("1,2,4,8", None, None) == (1, 2, 4, 8)
    assert counts.convert(" 1 , 16 ", None, None) == (1, 16)
    for text in ("0", "1,x", "1,,2", "", "1001"):
        with pytest.raises(click.BadParameter, match="is not a list of client counts from 1 to 1000, like 1,2,4,8"):
            counts.convert(text, None, None)


def test_the_commands_hand_the_library_numbers_and_tuples_not_text() -> None:
    load = parsed("load", "lost-update", "-c", "1,2", "-T", "3s", "--setup-timeout", "2", "-t", "4")
    assert (load["clients"], load["duration"], load["setup_timeout"], load["transactions"]) == ((1, 2), 3.0, 2.0, 4)
    assert parsed("load", "lost-update")["clients"] == (1, 2, 4, 8)  # the default, parsed as any value
    assert parsed("run", "lost-update", "--step-timeout", "200ms", "--pace", "1.5s")["step_timeout"] == 0.2
    assert parsed("minimize", "lost-update", "--order", "a1, b1")["order"] == ("a1", "b1")


def test_a_shard_and_a_setting_are_parsed_by_click_into_tuples() -> None:
    assert parsed("explore", "lost-update", "--shard", "2/3")["shard"] == (2, 3)
    assert parsed("run", "lost-update", "-p", "workers=5", "-p", "level=")["params"] == (
        ("workers", "5"),
        ("level", ""),
    )
    swept = parsed("sweep", "lost-update", "-p", "level=read-committed, serializable")["params"]
    assert swept == (("level", ("read-committed", "serializable")),)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["explore", "lost-update", "--shard", "3/2"], "'3/2' is not K/N with 1 ≤ K ≤ N"),
        (["explore", "lost-update", "--shard", "x"], "'x' is not K/N with 1 ≤ K ≤ N"),
        (["run", "lost-update", "-p", "workers"], "'workers' is not NAME=VALUE"),
        (["run", "lost-update", "-p", "=5"], "'=5' is not NAME=VALUE"),
        (["sweep", "lost-update", "-p", "level=a,,b"], "'level=a,,b' is not NAME=VALUE[,VALUE...]"),
    ],
)
def test_a_bad_shard_or_setting_is_refused_by_its_option(args: list[str], says: str) -> None:
    with pytest.raises(click.BadParameter, match=re.escape(says)):
        parsed(*args)
