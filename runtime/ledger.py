"""The data ledger: which samples each replica trains at each step, so none is skipped or repeated.

torchft makes the *model* state consistent across failures, but not the data: a replica that dies
and comes back would, with a per-replica data loader, either replay or skip batches (torchft issues
#37 and #309). FT-HSDP fixes this with one global sample cursor that is part of the committed
state. At every step the quorum's participants (the replicas at the highest step, in the quorum's
fixed order) each take the next `replica_batch` samples from the cursor, in that order; a healing
replica takes none (its gradient is zeroed anyway); a committed step advances the cursor by
`participants * replica_batch`. The cursor travels with the state a healing replica fetches, so
after any sequence of failures the committed steps tile the sample stream exactly once.

Everything here is pure arithmetic over plain data, tested by tables; the worker (`runtime.api`)
calls it and writes one `LedgerRecord` per committed step to a JSON-lines log that the local
launcher and the tests verify with `verify`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Slot:
    """One replica's share of one step: samples [lo, hi) of the global stream."""

    lo: int
    hi: int

    def rank_slice(self, rank: int, world_size: int) -> Slot:
        """The part of this replica's share that one rank inside the replica trains."""
        per_rank = (self.hi - self.lo) // world_size
        lo = self.lo + rank * per_rank
        return Slot(lo, lo + per_rank)

    def ids(self) -> range:
        return range(self.lo, self.hi)


def assign(cursor: int, participant: int | None, participants: int, replica_batch: int) -> Slot | None:
    """The slot of participant number `participant` (None: healing or not participating)."""
    if participant is None:
        return None
    if not 0 <= participant < participants:
        raise ValueError(f"participant {participant} outside 0..{participants - 1}")
    lo = cursor + participant * replica_batch
    return Slot(lo, lo + replica_batch)


def advance(cursor: int, participants: int, replica_batch: int) -> int:
    """The cursor after a committed step with `participants` data-taking replicas."""
    return cursor + participants * replica_batch


@dataclass(frozen=True)
class LedgerRecord:
    """What one replica's leader writes when a step commits.

    `step` is the step that committed (the training step number before the commit), `cursor` the
    global cursor it started from, `participants` how many replicas took data, and `lo`/`hi` this
    replica's own share (None when it was healing and took none).
    """

    step: int
    replica: int
    cursor: int
    participants: int
    replica_batch: int
    lo: int | None = None
    hi: int | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass
class LedgerVerdict:
    ok: bool
    steps: int
    samples: int
    problems: list[str] = field(default_factory=list)


def verify(records: Iterable[LedgerRecord]) -> LedgerVerdict:
    """Check that committed steps tile the sample stream exactly once.

    Every record of one step must agree on cursor and participants (replicas that committed the
    same step saw the same quorum); the steps, in order, must start where the previous one ended
    (no gap = nothing skipped, no overlap = nothing trained twice); each replica's own share must
    be the slot its participant number gives, and no two replicas may claim the same slot.
    """
    by_step: dict[int, list[LedgerRecord]] = {}
    for rec in records:
        by_step.setdefault(rec.step, []).append(rec)
    problems: list[str] = []
    expected_cursor = None
    samples = 0
    for step in sorted(by_step):
        recs = by_step[step]
        heads = {(r.cursor, r.participants, r.replica_batch) for r in recs}
        if len(heads) != 1:
            problems.append(f"step {step}: replicas disagree on (cursor, participants): {heads}")
            continue
        cursor, participants, replica_batch = heads.pop()
        if expected_cursor is not None and cursor != expected_cursor:
            kind = "skipped" if cursor > expected_cursor else "repeated"
            problems.append(
                f"step {step}: starts at sample {cursor}, previous step ended at "
                f"{expected_cursor} ({kind} samples)"
            )
        end = advance(cursor, participants, replica_batch)
        claimed: dict[tuple[int, int], int] = {}
        for r in recs:
            if r.lo is None or r.hi is None:
                continue
            if (r.lo - cursor) % replica_batch or not cursor <= r.lo < r.hi <= end:
                problems.append(f"step {step}: replica {r.replica} share [{r.lo},{r.hi}) off-slot")
            other = claimed.setdefault((r.lo, r.hi), r.replica)
            if other != r.replica:
                problems.append(
                    f"step {step}: replicas {other} and {r.replica} both trained [{r.lo},{r.hi})"
                )
        samples += end - cursor
        expected_cursor = end
    if by_step:
        steps = sorted(by_step)
        missing = sorted(set(range(steps[0], steps[-1] + 1)) - set(steps))
        if missing:
            problems.append(f"steps never committed: {missing[:10]}")
    return LedgerVerdict(ok=not problems, steps=len(by_step), samples=samples, problems=problems)


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
