"""One run's launches as moves: what each step touched, per ``pg_locks``, and which moves depend on which."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pgrace.drivers.reduce.nature import CHECK_OPAQUE, Nature
from pgrace.model.outcomes import Observed, classify
from pgrace.model.scenario import Scenario
from pgrace.model.timeline import FootprintObserved, Run, StepFinished, StepLaunched

__all__ = ["Move", "Trace", "chains", "dependent", "moves_of"]


@dataclass(frozen=True)
class Move:
    """One launched step with what it touched: ``access`` maps a resource to whether it more than read it."""

    name: str
    session: str
    access: Mapping[tuple[str, ...], bool]
    opaque: bool
    releases: bool = False
    snapshot: bool = False  # took its transaction's snapshot (REPEATABLE READ, SERIALIZABLE)
    isolated: bool = False  # runs in a transaction that keeps a snapshot
    enablers: tuple[int, ...] = ()  # positions whose completion it had to wait for (not reversible)


def dependent(a: Move, b: Move) -> bool:
    """Whether the order of two steps may matter (see the module's docstring)."""
    if a.session == b.session or a.opaque or b.opaque:
        return True
    if a.isolated and b.isolated:
        return True
    if (a.releases and b.snapshot) or (b.releases and a.snapshot):
        return True
    common = a.access.keys() & b.access.keys()
    if not common:
        return False
    return a.releases or b.releases or any(a.access[k] or b.access[k] for k in common)


def _resources(entries: frozenset[str]) -> dict[tuple[str, ...], bool]:
    """pg_locks entries as resources: a relation, an advisory key, an object; True for more than a read."""
    out: dict[tuple[str, ...], bool] = {}
    for entry in entries:
        if entry == "snapshot":
            continue
        locktype, database, relation, classid, objid, objsubid, _vxid, mode, granted = (entry.split("|") + [""] * 9)[:9]
        if locktype == "virtualxid" or mode == "SIReadLock":
            continue
        if relation and relation != "?":
            key: tuple[str, ...] = ("relation", relation)
        elif locktype == "advisory":
            key = ("advisory", database, classid, objid, objsubid)
        else:  # a relation not committed yet, an object: no name that stays the same from run to run
            key = UNSTABLE
        writes = not (locktype == "relation" and mode == "AccessShareLock" and granted == "t")
        out[key] = out.get(key, False) or writes
    return out


UNSTABLE = ("unstable",)  # a resource named by an OID a later run's setup gives to something else


def _vxid(entries: frozenset[str]) -> str | None:
    for entry in entries:
        parts = entry.split("|")
        if parts[0] == "virtualxid" and len(parts) > 6:
            return parts[6]
    return None


def _isolated(entries: frozenset[str]) -> bool:
    return "snapshot" in entries or any(e.split("|")[7:8] == ["SIReadLock"] for e in entries)


@dataclass
class Trace:
    """One run's launches as moves, and which sessions could have gone next before each."""

    moves: list[Move]
    enabled: list[frozenset[str]]
    observed: Observed
    launched: tuple[str, ...]


def moves_of(
    run: Run, scenario: Scenario, natures: Mapping[str, Nature], needs: Mapping[str, tuple[str, ...]]
) -> Trace:
    """Fold one permutation's events into moves (``needs``: the steps whose captures a step uses)."""
    launches: list[tuple[int, str, str]] = []  # seq, step, session
    readings: list[tuple[int, dict[str, tuple[bool, frozenset[str]]]]] = []  # launches before it, per session
    finished: dict[int, tuple[int, bool, bool]] = {}  # seq -> (launches before it, waited, failed)
    for event in run.events:
        if isinstance(event, StepLaunched):
            launches.append((event.seq, event.step, event.session))
        elif isinstance(event, FootprintObserved):
            readings.append((len(launches), {name: (busy, held) for name, busy, held in event.held}))
        elif isinstance(event, StepFinished):
            finished[event.seq] = (len(launches), event.after_wait, event.outcome.error is not None)
    n = len(launches)
    done_at = {seq: finished[seq][0] - 1 if seq in finished else n for seq, _, _ in launches}
    position_of = {name: i for i, (_, name, _) in enumerate(launches)}

    def held(session: str, before: int) -> tuple[bool, frozenset[str]] | None:
        """The session's last reading taken before launch ``before`` (None: none)."""
        for count, per in reversed(readings):
            if count <= before and session in per:
                return per[session]
        return None

    def during(session: str, first: int, last: int) -> frozenset[str]:
        found: set[str] = set()
        for count, per in readings:
            if first <= count <= last and session in per:
                found |= per[session][1]
        return frozenset(found)

    scenario_defers = "deferr" in " ".join((*scenario.setup, *(s.sql for s in scenario.steps))).lower()
    all_opaque = any(CHECK_OPAQUE.search(c.sql) for c in scenario.checks)
    own: list[Move] = []
    for i, (seq, name, session) in enumerate(launches):
        end = done_at[seq]
        before_reading = held(session, i)
        before = before_reading[1] if before_reading else frozenset()
        after_reading = held(session, end + 1)
        after = after_reading[1] if after_reading else frozenset()
        touched = before | after | during(session, i + 1, end + 1)
        access = _resources(touched)
        nature = natures.get(name, Nature(True, False, False))
        vx_before, vx_after = _vxid(before), _vxid(after)
        releases = bool(_resources(before).keys() - _resources(after).keys()) or (
            vx_before is not None and vx_before != vx_after
        )
        isolated = _isolated(before) or _isolated(after)
        opaque = (
            all_opaque
            or nature.opaque
            or seq not in finished
            or finished[seq][2]  # failed
            or after_reading is None  # its session was lost
            or after_reading[0]  # still busy when last read
            or (vx_before is None and vx_after is None and not nature.local)  # autocommit: its locks are gone
            or (vx_before is not None and vx_after not in (None, vx_before) and not nature.single_transaction_statement)
            or (releases and (scenario_defers or isolated))
            or UNSTABLE in access
        )
        enablers: list[int] = []
        previous = [j for j in range(i) if launches[j][2] == session]
        if previous and done_at[launches[previous[-1]][0]] != previous[-1]:
            enablers.append(done_at[launches[previous[-1]][0]])
        for needed in needs.get(name, ()):
            j = position_of.get(needed)
            if j is not None and j < i:
                enablers.append(done_at[launches[j][0]])
        snapshot = "snapshot" in after and ("snapshot" not in before or vx_before != vx_after)
        own.append(Move(name, session, access, opaque, releases, snapshot, isolated, tuple(sorted(set(enablers)))))
    moves: list[Move] = []
    for i, move in enumerate(own):
        waiters = [own[j] for j, (seq, _, _) in enumerate(launches) if j != i and done_at[seq] == i]
        if waiters:  # steps that went on during this one: their footprint is this step's too
            access = dict(move.access)
            for waiter in waiters:
                for key, writes in waiter.access.items():
                    access[key] = access.get(key, False) or writes
            move = dataclasses.replace(
                move,
                access=access,
                opaque=move.opaque or any(w.opaque for w in waiters),
                releases=move.releases or any(w.releases for w in waiters),
                isolated=move.isolated or any(w.isolated for w in waiters),
            )
        moves.append(move)
    enabled = [_enabled(scenario, launches, done_at, needs, i) for i in range(n)]
    observed = classify(run)
    return Trace(moves, enabled, observed, tuple(name for _, name, _ in launches))


def _enabled(
    scenario: Scenario,
    launches: Sequence[tuple[int, str, str]],
    done_at: Mapping[int, int],
    needs: Mapping[str, tuple[str, ...]],
    i: int,
) -> frozenset[str]:
    """The sessions that could launch their next step before launch ``i``."""
    by_session = chains(scenario)
    launched = {name for _, name, _ in launches[:i]}
    seq_of = {name: seq for seq, name, _ in launches}
    out = set()
    for session, chain in by_session.items():
        left = [s for s in chain if s not in launched]
        if not left:
            continue
        mine = [s for s in chain if s in launched]
        if mine and done_at.get(seq_of[mine[-1]], len(launches)) >= i:
            continue  # still running a step
        if all(n in launched and done_at.get(seq_of[n], len(launches)) < i for n in needs.get(left[0], ())):
            out.add(session)
    return frozenset(out)


_CHAINS: dict[int, dict[str, list[str]]] = {}


def chains(scenario: Scenario) -> dict[str, list[str]]:
    from pgrace.drivers.space import Space

    key = id(scenario)
    if key not in _CHAINS:
        space = Space(scenario)
        _CHAINS.clear()
        _CHAINS[key] = {scenario.step(chain[0]).session: list(chain) for chain in space.chains}
    return _CHAINS[key]
