"""Record real runs as JSON for the renderer tests, and read them back (development tooling).

The renderers are pure functions of a :class:`~pgrace.model.timeline.Run`; only getting a run needs
PostgreSQL. ``python -m tools.record_runs [NAME.VARIANT ...]`` runs every shipped scenario's
variants, every ``tests/recorded/*.toml`` and ``tests/hostile/hostile.toml`` once on the
embedded server and writes ``tests/recorded/NAME.VARIANT.json``; the tests load them with
`load_run` and render them with no server.

The JSON is the run's dataclasses field by field (a field at its default left out, a tuple
as a list, a value whose field may hold several dataclasses naming its class in ``"type"``),
read back by the fields' type hints, so a recording is exactly the run it was made from:
`dump_run` refuses one that would not read back equal. A scenario's ``source`` under the
repository is kept relative to it, so a recording reads back with this checkout's path. A
run whose model changed since it was recorded does not load (an unknown or missing field):
record again.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from functools import cache
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from pgrace.model import timeline
from pgrace.model.scenario import Scenario
from pgrace.model.timeline import Run

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "recorded"
HOSTILE = ROOT / "tests" / "hostile" / "hostile.toml"  # control characters and markup, from the server too


def dump_run(run: Run) -> str:
    """The run as indented JSON; raises ValueError when it would not read back equal."""
    text = json.dumps(_encode(run, Run), indent=1, ensure_ascii=False) + "\n"
    if load_run_text(text) != run:
        raise ValueError(f"the run of {run.scenario.name} ({run.scenario.variant}) does not read back equal")
    return text


def load_run_text(text: str) -> Run:
    run: Run = _decode(json.loads(text), Run)
    return run


def load_run(name: str) -> Run:
    """The recorded run ``tests/recorded/NAME.json`` (``"lost-update.bug"``)."""
    return load_run_text((RECORDED / f"{name}.json").read_text(encoding="utf-8"))


# -- the codec: dataclasses by their fields' type hints --------------------------------------


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls, vars(sys.modules[cls.__module__]) | vars(timeline))


def _fields(cls: type) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if f.init]


def _is_default(field: dataclasses.Field[Any], value: object) -> bool:
    """A field left at its default is not written: a recording shows what the run holds."""
    if field.default is not dataclasses.MISSING:
        return bool(value == field.default)
    return field.default_factory is not dataclasses.MISSING and bool(value == field.default_factory())


def _classes(hint: Any) -> dict[str, type]:
    """The dataclasses a union admits, by name (empty when it admits at most one)."""
    if get_origin(hint) not in (Union, types.UnionType):
        return {}
    found: dict[str, type] = {
        arg.__name__: arg for arg in get_args(hint) if isinstance(arg, type) and dataclasses.is_dataclass(arg)
    }
    return found if len(found) > 1 else {}


def _encode(value: Any, hint: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return _relative(value) if hint is _SOURCE else value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        hints = _hints(type(value))
        encoded = {
            f.name: _encode(getattr(value, f.name), _field_hint(type(value), f.name, hints))
            for f in _fields(type(value))
            if not _is_default(f, getattr(value, f.name))
        }
        return {"type": type(value).__name__, **encoded} if _classes(hint) else encoded
    if isinstance(value, tuple | list):
        return [_encode(item, _item_hint(hint, index)) for index, item in enumerate(value)]
    if isinstance(value, dict):
        return {key: _encode(item, _args(hint, 1)) for key, item in value.items()}
    raise TypeError(f"cannot record a {type(value).__name__}: {value!r}")


def _decode(value: Any, hint: Any) -> Any:
    if hint is _SOURCE:
        return _absolute(value)
    if value is None or hint is Any:
        return value
    classes = _classes(hint)
    if classes:
        return _decode({k: v for k, v in value.items() if k != "type"}, classes[value["type"]])
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        members = [arg for arg in get_args(hint) if arg is not type(None)]
        return _decode(value, members[0]) if len(members) == 1 else value
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        unknown = set(value) - {f.name for f in _fields(hint)}
        if unknown:
            raise ValueError(f"{hint.__name__} has no field {sorted(unknown)[0]!r}: record the runs again")
        hints = _hints(hint)
        return hint(**{name: _decode(item, _field_hint(hint, name, hints)) for name, item in value.items()})
    if origin is tuple:
        return tuple(_decode(item, _item_hint(hint, index)) for index, item in enumerate(value))
    if origin is list:
        return [_decode(item, _args(hint, 0)) for item in value]
    if origin is dict:
        return {key: _decode(item, _args(hint, 1)) for key, item in value.items()}
    if hint is float and isinstance(value, int):
        return float(value)
    if origin is Literal or hint in (int, float, str, bool):
        return value
    raise TypeError(f"cannot read a {hint!r} back")


#: Stands for the type of ``Scenario.source``, which is kept relative to the repository.
_SOURCE = object()


def _field_hint(cls: type, name: str, hints: dict[str, Any]) -> Any:
    return _SOURCE if cls is Scenario and name == "source" else hints[name]


def _item_hint(hint: Any, index: int) -> Any:
    args = get_args(hint)
    if not args:
        return Any
    if get_origin(hint) is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        return args[index]
    return args[0]


def _args(hint: Any, index: int) -> Any:
    args = get_args(hint)
    return args[index] if args else Any


def _relative(source: object) -> object:
    if isinstance(source, str) and source.startswith(f"{ROOT}/"):
        return source.removeprefix(f"{ROOT}/")
    return source


def _absolute(source: str) -> str:
    return str(ROOT / source) if (ROOT / source).is_file() and not Path(source).is_absolute() else source


# -- recording -------------------------------------------------------------------------------


def scenarios() -> list[tuple[str, Scenario]]:
    """What is recorded, by the name of its recording: each variant of the shipped and the tests' own scenarios."""
    from pgrace.frontends import catalog

    loaded = [catalog.read_scenario(name) for name in catalog.shipped_names()]
    loaded += [catalog.read_scenario(str(path)) for path in [*sorted(RECORDED.glob("*.toml")), HOSTILE]]
    return [(f"{s.name}.{variant}", s.variant_named(variant)) for s in loaded for variant in s.variants]


def main(argv: list[str]) -> int:
    """Record everything (or the recordings named) on one embedded server."""
    from pgrace import api
    from pgrace.servers import open_server

    wanted = [(name, s) for name, s in scenarios() if not argv or name in argv]
    with open_server("embedded") as server:
        for name, scenario in wanted:
            (RECORDED / f"{name}.json").write_text(dump_run(api.run(scenario, server=server)), encoding="utf-8")
            print(f"recorded tests/recorded/{name}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
