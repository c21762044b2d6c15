"""The ``[load]`` section of a scenario file: one worker's transaction, for ``pgrace load``.

    [load]
    setup = "CREATE TABLE ledger (amount int NOT NULL)"   # after the scenario's setup
    transaction = [
      "BEGIN",
      { step = "alice-read" },             # the variant's own step: its SQL and capture
      { sleep = "5ms" },                   # simulated work, inside the transaction
      { set = "amount", random = [1, 100] },
      { sql = "UPDATE ...", capture = "x" },
      "COMMIT",
    ]
    [[load.check]]                         # after each client count: (expected, actual[, detail])
    description = "no withdrawal is lost"
    sql = "SELECT ..."

``[fix.load]`` (or ``[bug.load]``) replaces any of these keys for that variant. A step is
named as in the file (``claim``, or ``claim.worker1`` for one of a group), and resolved
against each variant's steps, so the fix's load runs the fix's SQL.

pgbench reads the transaction, and psql the emitted setup and check files: both run a
backslash outside quotes as a meta-command (``\\shell`` runs a shell). Reading a scenario
must never run anything on the machine, so every SQL text ``load`` hands them is refused
here if it holds one, with the line it came from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pgrace.errors import ScenarioError
from pgrace.frontends.names import KeyPath, base_name, did_you_mean
from pgrace.model.scenario import Load, LoadCheck, LoadCommand, Scenario, Step
from pgrace.model.variables import NAME, find, meta_command, scan_error

if TYPE_CHECKING:
    from pgrace.frontends.scenario_toml.reader import Reader

LOAD_KEYS = {"setup", "transaction", "check"}
COMMAND_KEYS = {"step", "sql", "capture", "sleep", "set", "random"}
CHECK_KEYS = {"description", "sql"}


def build_load(read: Reader, raw: Any, override: Any, scenario: Scenario, variant_key: str | None) -> Load:
    """The ``[load]`` table (with the variant's ``[VARIANT.load]`` keys over it), resolved on ``scenario``'s steps."""
    loc = read.loc
    if not isinstance(raw, dict):
        raise loc.error("[load] must be a table", "load")
    read.check_keys(raw, LOAD_KEYS, ("load",), "[load] key")
    merged = dict(raw)
    origin: dict[str, KeyPath] = {key: ("load",) for key in raw}
    if override is not None:
        where: KeyPath = (str(variant_key), "load")
        if not isinstance(override, dict):
            raise loc.error(f"[{variant_key}.load] must be a table", *where)
        read.check_keys(override, LOAD_KEYS, where, f"[{variant_key}.load] key")
        merged.update(override)
        origin.update({key: where for key in override})
    transaction = merged.get("transaction")
    path = origin.get("transaction", ("load",))
    if not isinstance(transaction, list) or not transaction:
        raise loc.error("[load] needs transaction = [...], the statements of one worker's transaction", *path)
    params = {k for k, _ in scenario.params}
    known: set[str] = set()  # pgbench variables defined so far: \set names and captures
    commands: list[LoadCommand] = []
    where = (*path, "transaction")
    line = loc.line_of(*where)
    for index, item in enumerate(transaction):
        command = _command(read, item, scenario, where, line, variant_key)
        if command.kind == "sql":
            what = f"step {command.step!r}, run by [load]," if command.step else f"load command {index + 1}"
            if (error := scan_error(command.sql)) is not None:  # pgbench could not split it either
                snippet = " ".join(command.sql.split())[:60]
                raise ScenarioError(
                    f"load SQL {snippet!r} cannot be split into statements: {error}", loc.source, command.line
                )
            _refuse_meta_command(read, command.sql, what, command.line)
        for use in find(command.sql):
            if use.session is not None:
                raise loc.error(
                    f"load command {index + 1} uses {use.written}: a load transaction is one worker; write :{use.name}",
                    *where,
                )
            if use.name not in params and use.name not in known:
                raise loc.error(
                    f"load command {index + 1} uses {use.written}, which no earlier command captures or sets"
                    f" and no param defines{did_you_mean(use.name, params | known)}",
                    *where,
                )
            if use.form == "identifier" and use.name not in params:
                raise loc.error(
                    f"load command {index + 1} uses {use.written}: pgbench binds a captured value as a"
                    " parameter, never as an identifier",
                    *where,
                )
        known |= {variable for variable, _ in command.capture}
        if command.kind == "set":
            known.add(command.name)
        commands.append(command)
    setup_path = origin.get("setup", ("load",))
    setup = read.sql_list(merged.get("setup", []), *setup_path, "setup")
    variant = read.data.get(variant_key) if variant_key is not None else None
    scenario_setup = (str(variant_key), "setup") if isinstance(variant, dict) and "setup" in variant else ("setup",)
    for text in scenario.setup:  # emitted into the setup file, for psql
        _refuse_meta_command(read, text, "the setup, run by [load],", loc.line_of(*scenario_setup))
    for text in setup:
        _refuse_meta_command(read, text, "[load] setup", loc.line_of(*setup_path, "setup"))
        for use in find(text):
            if use.session is not None or use.name not in params:
                raise loc.error(f"[load] setup uses {use.written}, which is not a param", *setup_path, "setup")
    checks_raw = merged.get("check", [])
    check_path = origin.get("check", ("load",))
    if not isinstance(checks_raw, list):
        raise loc.error("load checks are [[load.check]] tables", *check_path)
    checks = []
    for index, item in enumerate(checks_raw):
        where = (*check_path, "check", index)
        if not isinstance(item, dict):
            raise loc.error("each load check is a [[load.check]] table", *where)
        read.check_keys(item, CHECK_KEYS, where, "load check key")
        query = read.text(item.get("sql"), *where, "sql", what="load check sql")
        _refuse_meta_command(read, query, "load check sql", loc.line_of(*where, "sql"))
        for use in find(query):
            if use.session is not None or use.name not in params:
                raise loc.error(f"load check uses {use.written}, which is not a param", *where)
        checks.append(
            LoadCheck(read.text(item.get("description", query), *where, "description"), query, loc.line_of(*where))
        )
    return Load(tuple(commands), setup, tuple(checks), loc.line_of("load"))


def _refuse_meta_command(read: Reader, text: str, what: str, line: int | None) -> None:
    """A backslash outside quotes is a pgbench or psql command, not SQL (PostgreSQL accepts none there)."""
    found = meta_command(text)
    if found is not None:
        raise ScenarioError(
            f'{what} holds "{found}": pgbench and psql would run it on this machine (a backslash outside'
            " quotes is a meta-command); SQL has a backslash only inside quotes",
            read.loc.source,
            line,
        )


def _sql_line(read: Reader, step: Step, variant_key: str | None) -> int | None:
    """The line of ``step``'s ``sql``: in its ``[VARIANT.step.NAME]`` override if it has one, else in its table."""
    loc = read.loc
    variant = read.data.get(variant_key) if variant_key is not None else None
    overrides = variant.get("step") if isinstance(variant, dict) else None
    if isinstance(overrides, dict):
        for base in (step.name, base_name(step.name)):
            if isinstance(overrides.get(base), dict) and "sql" in overrides[base]:
                return loc.line_of(str(variant_key), "step", base, "sql")
    if step.line is None:
        return None
    header = next((path for path, number in loc.headers.items() if number == step.line - 1), None)
    return loc.line_of(*header, "sql") if header is not None else step.line


def _command(
    read: Reader, item: Any, scenario: Scenario, where: KeyPath, line: int, variant_key: str | None
) -> LoadCommand:
    loc = read.loc
    if isinstance(item, str):
        return LoadCommand("sql", sql=item, line=line)
    if not isinstance(item, dict):
        raise loc.error("a load command is SQL text or a table: { step }, { sql }, { sleep }, { set, random }", *where)
    read.check_keys(item, COMMAND_KEYS, where, "load command key")
    kinds = [key for key in ("step", "sql", "sleep", "set") if key in item]
    if len(kinds) != 1:
        raise loc.error("a load command is one of { step }, { sql }, { sleep }, { set, random }", *where)
    kind = kinds[0]
    if kind == "step":
        name = item["step"]
        if not isinstance(name, str):
            raise loc.error("step names a step of the scenario", *where)
        steps = [s for s in scenario.steps if s.name == name] or [
            s for s in scenario.steps if base_name(s.name) == name
        ]
        if not steps:
            names = {s.name for s in scenario.steps} | {base_name(s.name) for s in scenario.steps}
            raise loc.error(
                f"[load] names no step {name!r} of the {scenario.variant} variant{did_you_mean(name, names)}", *where
            )
        step = steps[0]
        if step.sleep is not None or step.crash is not None:
            raise loc.error(f"step {name!r} sends no SQL; a load transaction runs SQL steps only", *where)
        capture = read.capture(item["capture"], where) if "capture" in item else step.capture
        return LoadCommand(
            "sql", sql=step.sql, capture=capture, step=step.name, line=_sql_line(read, step, variant_key)
        )
    if kind == "sql":
        text = read.text(item["sql"], *where, "sql", what="load sql")
        return LoadCommand("sql", sql=text, capture=read.capture(item.get("capture"), where), line=line)
    if "capture" in item:
        raise loc.error(f"a {kind} command sends no SQL: it has no capture", *where)
    if kind == "sleep":
        return LoadCommand("sleep", seconds=read.duration(item["sleep"], (*where, "sleep")), line=line)
    name = item["set"]
    bounds = item.get("random")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise loc.error("set names a variable: letters, digits and '_'", *where)
    if (
        not isinstance(bounds, list)
        or len(bounds) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
        or bounds[0] > bounds[1]
    ):
        raise loc.error("a set command draws random = [low, high], two whole numbers, low <= high", *where)
    return LoadCommand("set", name=name, low=bounds[0], high=bounds[1], line=line)
