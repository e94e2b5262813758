"""The data ledger: which samples each replica trains at each step, so none is skipped or repeated.

torchft makes the *model* state consistent across failures, but not the data: a replica that dies
and comes back would, with a per-replica data loader, either replay or skip batches (torchft issues
#37 and #309). FT-HSDP fixes this with a ledger that is part of the committed state.

A step's data must be known before its quorum is (the quorum overlaps forward and backward, as in
torchft), so it cannot depend on who takes part. Instead the global batch of a step has one fixed
*slot* per configured replica (slot = replica id) and every slot gets one *unit* of `replica_batch`
samples, decided by the committed state alone:

* the state is a cursor into the sample stream, the units *pending* re-issue, and the slots that
  contributed to the last committed step;
* units are handed out pending first, then fresh from the cursor, to the slots that contributed
  last time first (so a re-issued unit goes to a replica likely alive), then the others, each group
  in slot order;
* when a step commits, the units of the slots that contributed (the quorum's participants, which
  the worker learns from a one-hot slot riding in the gradient allreduce) are trained; every other
  unit (a missing or failed replica's) goes back to pending, oldest sample first.

Pending never holds more than one unit per slot, the committed units never overlap, and together
with the final pending units they tile the stream from where the run started: every sample exactly
once. The state travels with the state a healing replica fetches. Pure arithmetic, tested by
tables; the worker (`runtime.api`) writes one `LedgerRecord` per committed step, and `verify`
replays the records.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, order=True)
class Slot:
    """One unit of samples [lo, hi) of the global stream (one replica's share of a step)."""

    lo: int
    hi: int

    def rank_slice(self, rank: int, world_size: int) -> Slot:
        """The part of this replica's share that one rank inside the replica trains."""
        per_rank = (self.hi - self.lo) // world_size
        lo = self.lo + rank * per_rank
        return Slot(lo, lo + per_rank)

    def ids(self) -> range:
        return range(self.lo, self.hi)


@dataclass(frozen=True)
class LedgerState:
    """The committed ledger: cursor, units awaiting re-issue, last step's contributing slots."""

    cursor: int = 0
    pending: tuple[Slot, ...] = ()
    last: tuple[int, ...] = ()

    def to_json(self) -> str:
        return json.dumps(
            {
                "cursor": self.cursor,
                "pending": [[s.lo, s.hi] for s in self.pending],
                "last": self.last,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> LedgerState:
        data = json.loads(text)
        return cls(
            cursor=int(data["cursor"]),
            pending=tuple(Slot(int(lo), int(hi)) for lo, hi in data["pending"]),
            last=tuple(int(s) for s in data["last"]),
        )


def slot_order(state: LedgerState, slots: int) -> list[int]:
    """Slots in the order they receive units: last step's contributors, then the rest."""
    first = sorted(s for s in set(state.last) if 0 <= s < slots)
    return first + [s for s in range(slots) if s not in set(first)]


def issue(state: LedgerState, slots: int, replica_batch: int) -> list[Slot]:
    """The unit of every slot (index = slot) for the next step, from the committed state only."""
    if slots < 1 or replica_batch < 1:
        raise ValueError(f"slots={slots} and replica_batch={replica_batch} must be >= 1")
    units = list(state.pending[:slots])
    fresh = state.cursor
    while len(units) < slots:
        units.append(Slot(fresh, fresh + replica_batch))
        fresh += replica_batch
    out: list[Slot | None] = [None] * slots
    for slot, unit in zip(slot_order(state, slots), units, strict=True):
        out[slot] = unit
    return [u for u in out if u is not None]


def take(state: LedgerState, slot: int, slots: int, replica_batch: int) -> Slot:
    """This replica's unit for the next step (slot = replica id)."""
    if not 0 <= slot < slots:
        raise ValueError(f"slot {slot} outside 0..{slots - 1}")
    return issue(state, slots, replica_batch)[slot]


def commit(
    state: LedgerState, contributors: Iterable[int], slots: int, replica_batch: int
) -> LedgerState:
    """The state after a step in which exactly `contributors` trained their units."""
    done = sorted(set(contributors))
    if not done or not all(0 <= s < slots for s in done):
        raise ValueError(f"contributors {done} must be a non-empty subset of 0..{slots - 1}")
    units = issue(state, slots, replica_batch)
    fresh = slots - min(len(state.pending), slots)
    back = [units[s] for s in range(slots) if s not in set(done)]
    pending = tuple(sorted([*state.pending[slots:], *back]))
    return LedgerState(
        cursor=state.cursor + fresh * replica_batch, pending=pending, last=tuple(done)
    )


@dataclass(frozen=True)
class LedgerRecord:
    """What one replica's leader writes when a step commits.

    `step` is the step that committed, `cursor`/`pending`/`last` the ledger state it started from,
    `contributors` the slots whose units were trained, and `lo`/`hi` this replica's own unit (None
    when it did not contribute: healing or just joined). Any one record of a step is enough to
    replay the step.
    """

    step: int
    replica: int
    cursor: int
    pending: list[list[int]]
    last: list[int]
    contributors: list[int]
    slots: int
    replica_batch: int
    lo: int | None = None
    hi: int | None = None

    @property
    def participants(self) -> int:
        return len(self.contributors)

    def state(self) -> LedgerState:
        return LedgerState(
            cursor=self.cursor,
            pending=tuple(Slot(lo, hi) for lo, hi in self.pending),
            last=tuple(self.last),
        )

    def head(self) -> str:
        keys = ("cursor", "pending", "last", "contributors", "slots", "replica_batch")
        return json.dumps({k: getattr(self, k) for k in keys}, sort_keys=True)

    def to_json(self) -> str:
        data: dict[str, Any] = json.loads(self.head())
        data.update(step=self.step, replica=self.replica, lo=self.lo, hi=self.hi)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def make(
        cls,
        step: int,
        replica: int,
        state: LedgerState,
        contributors: Sequence[int],
        slots: int,
        replica_batch: int,
    ) -> LedgerRecord:
        mine = take(state, replica, slots, replica_batch) if replica in contributors else None
        return cls(
            step=step,
            replica=replica,
            cursor=state.cursor,
            pending=[[s.lo, s.hi] for s in state.pending],
            last=list(state.last),
            contributors=sorted(contributors),
            slots=slots,
            replica_batch=replica_batch,
            lo=mine.lo if mine else None,
            hi=mine.hi if mine else None,
        )


@dataclass
class LedgerVerdict:
    ok: bool
    steps: int
    samples: int
    pending: int = 0
    problems: list[str] = field(default_factory=list)
    #: Steps committed more than once: the run went back (a restore from a checkpoint or a
    #: fresh start) and the first commits' training was lost with the state they built.
    rolled_back: int = 0


def verify(records: Iterable[LedgerRecord]) -> LedgerVerdict:
    """Replay the committed steps and check that every sample was trained exactly once, judged
    against the history of the final state.

    That history is found backwards from the last step: the record of each step whose commit
    yields the state the next step started from (one step has one head per history, as a head
    fixes the next state). Records off it are steps whose training a rollback discarded (the
    run went back to a checkpoint, or started over), counted in `rolled_back`, unless a replica
    that the history says contributed to that step has no record on it and recorded the step
    from another start state: that replica trained some other unit (replicas disagree). On the
    history, each step must start from the state the previous one left, and a replica's own
    unit must be the one its slot was issued. Then the trained units may not overlap (nothing
    trained twice), and with the units still pending at the end they must tile the stream from
    where the first step started (nothing skipped).
    """
    by_step: dict[int, dict[str, list[LedgerRecord]]] = {}
    for rec in records:
        by_step.setdefault(rec.step, {}).setdefault(rec.head(), []).append(rec)
    if not by_step:
        return LedgerVerdict(ok=True, steps=0, samples=0)
    problems: list[str] = []
    steps = sorted(by_step)
    history = _history(by_step, problems)
    geometry = {(recs[0].slots, recs[0].replica_batch) for recs in history.values()}
    if len(geometry) > 1:
        problems.append(f"slots/batch changed over the run: {sorted(geometry)}")
    trained: list[tuple[Slot, int]] = []
    after: LedgerState | None = None
    for step in steps:
        ref = history[step][0]
        state = ref.state()
        if after is not None and state != after:
            kind = "skipped" if state.cursor > after.cursor else "repeated"
            problems.append(
                f"step {step}: starts from cursor {state.cursor} pending {list(state.pending)}, "
                f"previous step left cursor {after.cursor} pending {list(after.pending)} "
                f"({kind} samples)"
            )
        try:
            units = issue(state, ref.slots, ref.replica_batch)
            after = commit(state, ref.contributors, ref.slots, ref.replica_batch)
        except ValueError as exc:
            problems.append(f"step {step}: {exc}")
            after = None
            continue
        problems += _shares(step, history[step], units)
        problems += _off_history(step, by_step[step], ref)
        trained += [(units[s], step) for s in ref.contributors]
    start = history[steps[0]][0].state()
    samples = sum(u.hi - u.lo for u, _ in trained)
    if after is not None:
        problems += _tiling(start, after, trained)
    missing = sorted(set(range(steps[0], steps[-1] + 1)) - set(steps))
    if missing:
        problems.append(f"steps never committed: {missing[:10]}")
    pending = sum(u.hi - u.lo for u in after.pending) if after else 0
    return LedgerVerdict(
        ok=not problems,
        steps=len(by_step),
        samples=samples,
        pending=pending,
        problems=problems,
        rolled_back=sum(1 for step in steps if _redone(by_step[step], history[step][0])),
    )


def _history(
    by_step: dict[int, dict[str, list[LedgerRecord]]], problems: list[str]
) -> dict[int, list[LedgerRecord]]:
    """The records of each step on the final state's history, walking back from the last step.

    Where no head of a step leads to the next step's start (a gap the replay reports), the
    head most replicas recorded stands in, so the walk goes on.
    """
    steps = sorted(by_step, reverse=True)
    last = by_step[steps[0]]
    if len(last) > 1:
        problems.append(f"step {steps[0]}: replicas disagree on the ledger state: {sorted(last)}")
    history: dict[int, list[LedgerRecord]] = {}
    wanted: LedgerState | None = None
    for step in steps:
        heads = by_step[step]
        leads = [h for h, rs in heads.items() if wanted is not None and _leads_to(rs[0], wanted)]
        head = leads[0] if leads else max(heads, key=lambda h: (len(heads[h]), h))
        history[step] = heads[head]
        wanted = heads[head][0].state()
    return history


def _leads_to(rec: LedgerRecord, state: LedgerState) -> bool:
    try:
        return commit(rec.state(), rec.contributors, rec.slots, rec.replica_batch) == state
    except ValueError:
        return False


def _shares(step: int, recs: list[LedgerRecord], units: list[Slot]) -> list[str]:
    """Each record's own unit is the one its slot was issued (None when it did not contribute)."""
    problems: list[str] = []
    for r in recs:
        if not 0 <= r.replica < r.slots:
            problems.append(f"step {step}: replica {r.replica} has no slot of {r.slots}")
            continue
        own = (r.lo, r.hi)
        want = (units[r.replica].lo, units[r.replica].hi) if r.replica in r.contributors else None
        if want is None and own != (None, None):
            problems.append(f"step {step}: replica {r.replica} did not contribute but has {own}")
        elif want is not None and own != want:
            problems.append(f"step {step}: replica {r.replica} share {own} off-slot {want}")
    return problems


def _off_history(step: int, heads: dict[str, list[LedgerRecord]], ref: LedgerRecord) -> list[str]:
    """A contributor of the step on the history whose own record of the step started from
    another state trained another unit than the history gave its slot (replicas disagree).

    One that started from the same state took the same unit: the step was committed twice from
    one state with other participants, and the history's commit counted this replica without
    its record (it was killed after the allreduce, or its own allreduce failed after the peers'
    completed). Its record is of the commit that was rolled back.
    """
    ours = ref.head()  # serialised once, not once per record
    start = ref.state()
    on = {r.replica for r in heads[ours]}
    off = sorted(
        {
            (r.replica, h)
            for h, recs in heads.items()
            if h != ours
            for r in recs
            if r.state() != start
        }
    )
    return [
        f"step {step}: replicas disagree on the ledger state: replica {replica} recorded "
        f"{head}, the run's history {ours}"
        for replica, head in off
        if replica in ref.contributors and replica not in on
    ]


def _redone(heads: dict[str, list[LedgerRecord]], ref: LedgerRecord) -> bool:
    """The step was committed more than once: a head off the history, or one replica's record
    of it twice (a rollback to a state the history had, replayed the same way)."""
    if len(heads) > 1:
        return True
    replicas = [r.replica for r in heads[ref.head()]]
    return len(replicas) != len(set(replicas))


def _merged(units: Iterable[Slot]) -> list[Slot]:
    """Sorted, non-overlapping units with touching ones joined."""
    out: list[Slot] = []
    for unit in units:
        if out and out[-1].hi == unit.lo:
            out[-1] = Slot(out[-1].lo, unit.hi)
        else:
            out.append(unit)
    return out


def _tiling(start: LedgerState, end: LedgerState, trained: list[tuple[Slot, int]]) -> list[str]:
    """Trained units plus the final pending ones cover start's region exactly once."""
    problems: list[str] = []
    pieces = sorted([*trained, *((u, -1) for u in end.pending)])
    expected = sorted([*start.pending, Slot(start.cursor, end.cursor)])
    region = [s for s in expected if s.hi > s.lo]
    covered: list[Slot] = []
    for unit, step in pieces:
        if covered and unit.lo < covered[-1].hi:
            where = f"step {step}" if step >= 0 else "pending"
            problems.append(f"{where}: samples [{unit.lo},{unit.hi}) trained twice (repeated)")
            continue
        covered.append(unit)
    merged, want = _merged(covered), _merged(region)
    if merged != want:
        problems.append(
            f"trained + pending cover {merged[:5]}, expected {want[:5]} (skipped samples)"
        )
    return problems


def read_log(paths: Iterable[Path]) -> list[LedgerRecord]:
    """Read every ledger JSON-lines file (a torn last line from a killed writer is skipped)."""
    out: list[LedgerRecord] = []
    for path in paths:
        for line in path.read_text().splitlines():
            try:
                out.append(LedgerRecord(**json.loads(line)))
            except (ValueError, TypeError):
                continue
    return out


def appended_since(log_dir: Path, since: float) -> bool:
    """Whether any replica's ledger log in `log_dir` was written after `since` (wall clock).

    A replica that starts with no state and finds one written after its own start knows that a
    replica holding the run's state committed meanwhile, so it is alive: what a quorum of fresh
    replicas asks before it restores the run from disk (a whole-run loss leaves every log older
    than the replicas that come back)."""
    for path in log_dir.glob("r*.jsonl"):
        try:
            if path.stat().st_mtime > since:
                return True
        except OSError:
            continue
    return False
