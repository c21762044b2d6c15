"""One run's launches as moves: what each step touched (``pg_locks``, rows), and which moves depend on which."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pgrace.drivers.reduce.nature import CHECK_OPAQUE, Nature, setup_clock
from pgrace.drivers.reduce.reads import Shape, effect_of, in_physical_order, shapes
from pgrace.engine.observe.footprints import ROW_ACTING
from pgrace.engine.observe.locks.conflicts import CONFLICTS, ROW_CONFLICTS
from pgrace.model.outcomes import Observed, classify
from pgrace.model.scenario import Scenario
from pgrace.model.timeline import (
    CheckQueried,
    FootprintObserved,
    ResultSet,
    Run,
    StepFinished,
    StepLaunched,
    StepWaiting,
)

__all__ = ["Access", "Move", "Trace", "chains", "dependent", "moves_of"]


@dataclass(frozen=True)
class Access:
    """What a move did to one resource (a relation, an advisory key, an object).

    ``fine``: a table whose rows are told apart (a plain or partitioned one, read without a
    wait); then ``modes`` (its table locks, held or awaited) conflict by the eight-mode
    table and ``rows`` ((primary key, row-lock strength) its transaction locked or changed,
    None: which is unknown) by the row-lock table; ``scan``: the keys of the rows the step
    itself read (None: any row), and ``made``: the keys of the rows its transaction
    inserted or moved a key to (None: not known), see :mod:`.reads`. Otherwise ``writes``
    (more than a read) is all there is.
    """

    writes: bool
    fine: bool = False
    modes: frozenset[str] = frozenset()
    rows: frozenset[tuple[str, str]] | None = frozenset()
    scan: frozenset[str] | None = None
    made: frozenset[str] | None = None
    wrote: bool = True  # the step itself may have inserted, updated or deleted rows of it
    on_rows: bool = True  # False: a table lock alone (a prepare's: parsing locks tables, reads no row)

    def merged(self, other: Access) -> Access:
        rows = None if self.rows is None or other.rows is None else self.rows | other.rows
        return Access(
            self.writes or other.writes,
            self.fine and other.fine,
            self.modes | other.modes,
            rows,
            _union(self.scan, other.scan),
            _union(self.made, other.made),
            self.wrote or other.wrote,
            self.on_rows or other.on_rows,
        )

    @property
    def acts_on_rows(self) -> bool:
        """Locks or writes rows (an insert too): its rows then matter to another's."""
        return self.on_rows and (bool(self.modes & ROW_ACTING) or self.rows is None or bool(self.rows))


def _union(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
    return None if a is None or b is None else a | b


def _sees(ending: Access, other: Access) -> bool:
    """Whether a read of ``other``'s could see a row version ``ending``'s transaction changed, made
    visible (COMMIT) or took back (ROLLBACK): the keys ``other`` read against those it deleted,
    updated, locked or made."""
    if other.scan == frozenset() or "RowExclusiveLock" not in ending.modes:
        return False  # it reads no row, or the ending transaction changed none of this table
    if ending.rows is None or ending.made is None:
        return True
    changed = {key for key, _ in ending.rows} | ending.made
    return bool(changed) and (other.scan is None or bool(changed & other.scan))


def _conflict(a: Access, b: Access) -> bool:
    if not (a.fine and b.fine):
        return a.writes or b.writes
    if any(held in CONFLICTS[wanted] for wanted in a.modes for held in b.modes):
        return True
    if not (a.acts_on_rows and b.acts_on_rows):
        return False  # a plain read, and another open transaction's change it cannot see in either order
    if a.rows is None or b.rows is None:
        return True
    theirs = dict(b.rows)
    return any(key in theirs and theirs[key] in ROW_CONFLICTS[mode] for key, mode in a.rows)


@dataclass(frozen=True)
class Move:
    """One launched step with what it touched, resource by resource."""

    name: str
    session: str
    access: Mapping[tuple[str, ...], Access]
    opaque: bool
    releases: bool = False
    snapshot: bool = False  # took its transaction's snapshot (REPEATABLE READ, SERIALIZABLE)
    isolated: bool = False  # runs in a transaction that keeps a snapshot
    enablers: tuple[int, ...] = ()  # positions whose completion it had to wait for (not reversible)
    physical: bool = False  # a final check may see rows in the order they lie on disk
    clock: bool = False  # reads the clock: its order among the other readings fixes which time is later


def dependent(a: Move, b: Move) -> bool:
    """Whether the order of two steps may matter (see the package's docstring)."""
    if a.session == b.session or a.opaque or b.opaque or (a.clock and b.clock):
        return True
    if a.isolated and b.isolated:
        return True
    if (a.releases and b.snapshot) or (b.releases and a.snapshot):
        return True
    for key in a.access.keys() & b.access.keys():
        x, y = a.access[key], b.access[key]
        if not (x.fine and y.fine):
            if a.releases or b.releases or x.writes or y.writes:
                return True
        elif _conflict(x, y) or (a.releases and _sees(x, y)) or (b.releases and _sees(y, x)):
            return True
        elif (a.physical or b.physical) and (a.releases or b.releases or (x.wrote and y.wrote)):
            return True  # where new row versions land, and what space an ended transaction frees
    return False


def _resources(entries: frozenset[str], row_wait: bool = False) -> dict[tuple[str, ...], Access]:
    """One reading's entries (see :class:`~pgrace.model.timeline.FootprintObserved`) as resources.

    ``row_wait``: a row-lock waiter's, each row it waits for named (``wants|``): its tuple
    lock counts as the strongest lock of that row, and the table's rows stay told apart."""
    out: dict[tuple[str, ...], Access] = {}
    named = {e[5:] for e in entries if e.startswith("rows|")}
    rows: dict[str, set[tuple[str, str]]] = {}
    for entry in entries:
        if entry.startswith("row|"):
            table, strength, row = json.loads(entry[4:])
            rows.setdefault(table, set()).add((row, strength))
        elif row_wait and entry.startswith("wants|"):
            table, row = json.loads(entry[6:])
            rows.setdefault(table, set()).add((row, "FOR UPDATE"))
    for entry in entries:
        if entry in ("snapshot", "snapshot-in-prefix", "closed", "wants?") or entry.startswith(
            ("rows|", "row|", "table|", "wants|")
        ):
            continue
        fields = (entry.split("|") + [""] * 10)[:10]
        locktype, database, relation, classid, objid, objsubid, _vxid, mode, granted, relkind = fields
        if row_wait and locktype == "tuple":
            continue
        if locktype == "virtualxid" or mode == "SIReadLock":
            continue
        if relation and relation != "?":
            key: tuple[str, ...] = ("relation", relation)
        elif locktype == "advisory":
            key = ("advisory", database, classid, objid, objsubid)
        else:  # a relation not committed yet, an object: no name that stays the same from run to run
            key = UNSTABLE
        writes = not (locktype == "relation" and mode == "AccessShareLock" and granted == "t")
        access = Access(writes)
        if locktype == "relation" and relkind == "p":  # its rows live in its partitions, locked too
            access = Access(writes, True, frozenset({mode}))
        elif locktype == "relation" and relkind == "r":
            acting = mode in ROW_ACTING
            known = frozenset(rows.get(relation, ())) if relation in named or not acting else None
            access = Access(writes, True, frozenset({mode}), known)
        out[key] = out[key].merged(access) if key in out else access
    return out


def _read_and_made(
    access: dict[tuple[str, ...], Access],
    text: str,
    returned: ResultSet | None,
    reading: frozenset[str],
    is_after: Mapping[tuple[str, ...], Access],
    nature: Nature,
    made: dict[str, tuple[str | None, dict[str, frozenset[str] | None]]],
    session: str,
    transaction: str | None,
) -> dict[tuple[str, ...], Access]:
    """Each table's ``scan`` (what the step's text says it read) and ``made`` (the keys its
    transaction made so far: the step's, added to its earlier steps')."""
    effect = effect_of(text, shapes(reading), "closed" in reading, returned, nature.probes)
    if made.get(session, (None, {}))[0] != transaction or session not in made:
        made[session] = (transaction, {})
    mine = made[session][1]
    for table, keys in effect.made.items():
        mine[table] = _union(mine.get(table, frozenset()), keys)
    if effect.made_anywhere:
        for key, a in is_after.items():
            if key[0] == "relation" and "RowExclusiveLock" in a.modes:
                mine[key[1]] = None
    out = {}
    for key, a in access.items():
        if a.fine:
            scan = frozenset() if effect.quiet else effect.scans.get(key[1])
            wrote = effect.writes and "RowExclusiveLock" in a.modes
            a = dataclasses.replace(a, scan=scan, made=mine.get(key[1], frozenset()), wrote=wrote)
        out[key] = a
    return out


def _merge(*readings: Mapping[tuple[str, ...], Access]) -> dict[tuple[str, ...], Access]:
    out: dict[tuple[str, ...], Access] = {}
    for reading in readings:
        for key, access in reading.items():
            out[key] = out[key].merged(access) if key in out else access
    return out


def _coarse(access: Mapping[tuple[str, ...], Access]) -> dict[tuple[str, ...], Access]:
    """The relation-level rule for every resource (a wait: the conflict it hit need not show as rows)."""
    return {key: Access(a.writes) for key, a in access.items()}


def _probing(access: Mapping[tuple[str, ...], Access]) -> dict[tuple[str, ...], Access]:
    """Every row of the tables it locks or writes: what it examined but left decides its result."""
    return {key: dataclasses.replace(a, rows=None) if a.acts_on_rows else a for key, a in access.items()}


def _parsed(before: frozenset[str], after: frozenset[str]) -> dict[tuple[str, ...], Access]:
    """A prepare's footprint: the locks it took (held after it and not before), each relation's by its modes
    alone. Parsing and analysis lock the relations the SQL names (ACCESS SHARE, ROW SHARE for FOR UPDATE, ROW
    EXCLUSIVE for a write's target) until the transaction ends; nothing runs, so no row is read, locked or
    written, and a lock its transaction held already changes nothing another session can see."""
    out = {}
    for key, a in _resources(after - before).items():
        if key[0] == "relation":
            a = Access(False, True, a.modes, frozenset(), frozenset(), frozenset(), False, False)
        out[key] = a
    return out


def _awaits(entries: frozenset[str]) -> bool:
    """A lock asked for and not granted yet."""
    return any(e.split("|")[8:9] == ["f"] for e in entries if not e.startswith(("row", "table|", "wants")))


def _shrank(before: Access, after: Access | None) -> bool:
    """Rows its transaction held before and not after: a savepoint's rollback gave them back."""
    if not before.rows or after is None or after.rows is None:
        return False
    return not before.rows <= after.rows


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
    texts: dict[int, str] = {}
    checks: list[str] = []
    tables: dict[str, Shape] = {}
    wait_kinds: dict[int, set[str]] = {}
    returned: dict[int, ResultSet | None] = {}
    for event in run.events:
        if isinstance(event, StepLaunched):
            launches.append((event.seq, event.step, event.session))
            texts[event.seq] = event.sql
        elif isinstance(event, StepWaiting):
            wait_kinds.setdefault(event.seq, set()).update(w.kind for w in event.waits)
            if event.by_marker:
                wait_kinds[event.seq].add("marker")
        elif isinstance(event, FootprintObserved):
            readings.append((len(launches), {name: (busy, held) for name, busy, held in event.held}))
            for _, _, entries in event.held:
                tables.update(shapes(entries))
        elif isinstance(event, CheckQueried):
            checks.append(event.sql)
        elif isinstance(event, StepFinished):
            finished[event.seq] = (len(launches), event.after_wait, event.outcome.error is not None)
            returned[event.seq] = event.outcome.last_rows
    n = len(launches)
    done_at = {seq: finished[seq][0] - 1 if seq in finished else n for seq, _, _ in launches}
    position_of = {name: i for i, (_, name, _) in enumerate(launches)}

    def held(session: str, before: int) -> tuple[bool, frozenset[str]] | None:
        """The session's last reading taken before launch ``before`` (None: none)."""
        for count, per in reversed(readings):
            if count <= before and session in per:
                return per[session]
        return None

    def during(session: str, first: int, last: int) -> list[frozenset[str]]:
        return [per[session][1] for count, per in readings if first <= count <= last and session in per]

    scenario_defers = "deferr" in " ".join((*scenario.setup, *(s.sql for s in scenario.steps))).lower()
    all_opaque = any(CHECK_OPAQUE.search(c.sql) for c in scenario.checks)
    physical = any(in_physical_order(text, tables) for text in checks or [c.sql for c in scenario.checks])
    own: list[Move] = []
    made: dict[str, tuple[str | None, dict[str, frozenset[str] | None]]] = {}  # session -> (vxid, keys by table)
    clock_everywhere, starts_read_clock = _clock_readers(scenario, natures)
    for i, (seq, name, session) in enumerate(launches):
        end = done_at[seq]
        before_reading = held(session, i)
        before = before_reading[1] if before_reading else frozenset()
        after_reading = held(session, end + 1)
        after = after_reading[1] if after_reading else frozenset()
        between = during(session, i + 1, end + 1)
        was_before, is_after = _resources(before), _resources(after)
        access = _merge(was_before, is_after, *(_resources(r) for r in between))
        nature = natures.get(name, Nature(True, False, False))
        waited = (seq in finished and finished[seq][1]) or any(_awaits(r) for r in between)
        pending = [per[session] for count, per in readings if i + 1 <= count <= end and session in per]
        blocked = [h for busy, h in pending if busy]
        row_wait = (  # every reading while it was blocked shows it on rows, each one named
            waited
            and not wait_kinds.get(seq, set()) - {"row"}
            and bool(blocked)
            and all(any(e.startswith("tuple|") for e in h) for h in blocked)
            and any(e.startswith("wants|") for r in between for e in r)
            and not any("wants?" in r for r in between)
        )
        if row_wait:  # what it waited for is rows, each named: they stay told apart
            access = _merge(was_before, is_after, *(_resources(r, row_wait=True) for r in between))
        elif waited:
            access = _coarse(access)
        elif nature.prepares_only:
            access = _parsed(before, after)
        elif nature.probes:
            access = _probing(access)
        vx_before, vx_after = _vxid(before), _vxid(after)
        transaction = vx_after or vx_before
        reading = after or before
        text, result = texts[seq], returned.get(seq)
        if not nature.prepares_only:  # a prepare reads and makes no row: its text says what a later step will do
            access = _read_and_made(access, text, result, reading, is_after, nature, made, session, transaction)
        releases = (
            bool(was_before.keys() - is_after.keys())
            or (vx_before is not None and vx_before != vx_after)
            or nature.rolls_back
            or any(_shrank(a, is_after.get(k)) for k, a in was_before.items())
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
            # its transaction ended in it after other statements: what they did is in no reading
            or (vx_before is not None and vx_after != vx_before and not nature.single_transaction_statement)
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
        if nature.prepares_only and "snapshot-in-prefix" in after:  # a parse in REPEATABLE READ takes it
            snapshot = snapshot or "snapshot" not in before or vx_before != vx_after
            isolated = True
        enabled_by = tuple(sorted(set(enablers)))
        starts = vx_after is not None and vx_after != vx_before  # its session's transaction began in it
        clock = clock_everywhere or reads_clock(nature, starts, starts_read_clock.get(name, True))
        own.append(Move(name, session, access, opaque, releases, snapshot, isolated, enabled_by, physical, clock))
    moves: list[Move] = []
    for i, move in enumerate(own):
        waiters = [own[j] for j, (seq, _, _) in enumerate(launches) if j != i and done_at[seq] == i]
        if waiters:  # steps that went on during this one: their footprint is this step's too
            access = _merge(move.access, *(w.access for w in waiters))
            move = dataclasses.replace(
                move,
                access=access,
                opaque=move.opaque or any(w.opaque for w in waiters),
                releases=move.releases or any(w.releases for w in waiters),
                isolated=move.isolated or any(w.isolated for w in waiters),
                clock=move.clock or any(w.clock for w in waiters),
            )
        moves.append(move)
    enabled = [_enabled(scenario, launches, done_at, needs, i) for i in range(n)]
    observed = classify(run)
    return Trace(moves, enabled, observed, tuple(name for _, name, _ in launches))


def reads_clock(nature: Nature, starts: bool, start_read: bool) -> bool:
    """Whether a step reads the clock: as it runs, or as the start of a transaction whose start time is read.

    ``starts``: its session's transaction began during it (a new virtual transaction id);
    ``start_read``: a step of its session from it on reads the transaction's start time (or
    the setup left that to happen unseen). now() is the transaction's start, fixed by its
    first statement, so the order of the starts, not of the steps that read it, orders the times.
    """
    return nature.clock or (starts and start_read)


def _clock_readers(scenario: Scenario, natures: Mapping[str, Nature]) -> tuple[bool, dict[str, bool]]:
    """Whether every step reads the clock (the setup left it to a default, a function or a trigger
    that reads it as a statement runs), and for each step whether a transaction that begins in it
    may read its start time: a step of its session from it on reads it (coarse: a later
    transaction's step counts too), or the setup left that to happen unseen."""
    at_start, at_step = setup_clock(scenario)
    out: dict[str, bool] = {}
    for chain in chains(scenario).values():
        later = at_start
        for name in reversed(chain):
            later = later or natures.get(name, Nature(True, False, False)).clock_at_start
            out[name] = later
    return at_step, out


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
    from pgrace.model.orders.space import Space

    key = id(scenario)
    if key not in _CHAINS:
        space = Space(scenario)
        _CHAINS.clear()
        _CHAINS[key] = {scenario.step(chain[0]).session: list(chain) for chain in space.chains}
    return _CHAINS[key]
