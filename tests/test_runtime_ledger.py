"""Table tests for the data ledger's rules (runtime.ledger): a step's data is decided from the
committed state and the replica's slot alone; units a replica did not train (missing, healing,
joining) are re-issued at later steps; `verify` replays the records and proves exactly-once."""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from runtime import ledger
from runtime.ledger import LedgerRecord, LedgerState, Slot

B = 4  # replica batch in these tables


def S(lo: int) -> Slot:
    return Slot(lo, lo + B)


@pytest.mark.parametrize(
    ("state", "slots", "expected"),
    [
        # fresh run: slot r takes the r-th unit from the cursor (the static HSDP order)
        (LedgerState(), 3, [S(0), S(4), S(8)]),
        # a pending unit goes first, to the lowest slot that contributed last time
        (LedgerState(12, (S(8),), (0, 1)), 3, [S(8), S(12), S(16)]),
        # ... and not to a slot that was missing last time
        (LedgerState(12, (S(0),), (1, 2)), 3, [S(16), S(0), S(12)]),
        # two pending units, slot 1 alone contributed last time
        (LedgerState(12, (S(0), S(8)), (1,)), 3, [S(8), S(0), S(12)]),
        # no last step known (after a restore): slot order
        (LedgerState(12, (S(4),), ()), 2, [S(4), S(12)]),
    ],
)
def test_issue(state: LedgerState, slots: int, expected: list[Slot]) -> None:
    assert ledger.issue(state, slots, B) == expected
    assert [ledger.take(state, r, slots, B) for r in range(slots)] == expected


@pytest.mark.parametrize(
    ("state", "contributors", "slots", "expected"),
    [
        # everyone trained: the cursor moves by a whole global batch
        (LedgerState(), [0, 1, 2], 3, LedgerState(12, (), (0, 1, 2))),
        # slot 2 missing (dead, healing, or not yet joined): its unit is re-issued
        (LedgerState(), [0, 1], 3, LedgerState(12, (S(8),), (0, 1))),
        # the re-issued unit is trained by slot 0 at the next step; slot 2's new unit goes back
        (LedgerState(12, (S(8),), (0, 1)), [0, 1], 3, LedgerState(20, (S(16),), (0, 1))),
        # slot 2 back: pending drains, fresh units resume
        (LedgerState(20, (S(16),), (0, 1)), [0, 1, 2], 3, LedgerState(28, (), (0, 1, 2))),
        # only one replica left of three: two units back, oldest first
        (LedgerState(), [1], 3, LedgerState(12, (S(0), S(8)), (1,))),
        # more pending than slots cannot arise, but would drain in order
        (LedgerState(0, (S(0), S(4), S(8)), (0,)), [0, 1], 2, LedgerState(0, (S(8),), (0, 1))),
    ],
)
def test_commit(
    state: LedgerState, contributors: list[int], slots: int, expected: LedgerState
) -> None:
    assert ledger.commit(state, contributors, slots, B) == expected


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ledger.take(LedgerState(), 3, 3, B), "slot 3 outside"),
        (lambda: ledger.commit(LedgerState(), [], 3, B), "non-empty"),
        (lambda: ledger.commit(LedgerState(), [3], 3, B), "subset"),
        (lambda: ledger.issue(LedgerState(), 0, B), "must be >= 1"),
    ],
)
def test_rejects(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]


def test_rank_slices_tile_a_replica_share() -> None:
    parts = [Slot(32, 48).rank_slice(w, 2) for w in range(2)]
    assert parts == [Slot(32, 40), Slot(40, 48)]


def play(
    steps: Sequence[tuple[Sequence[int], Sequence[int]]],
    slots: int,
    state: LedgerState | None = None,
    first: int = 0,
) -> tuple[list[LedgerRecord], LedgerState]:
    """Records a run writes: per step (contributors, healing replicas that also committed),
    from `state` at step `first` (a fresh run by default)."""
    state = state or LedgerState()
    out: list[LedgerRecord] = []
    for step, (contributors, healing) in enumerate(steps, start=first):
        for r in [*contributors, *healing]:
            out.append(LedgerRecord.make(step, r, state, contributors, slots, B))
        state = ledger.commit(state, contributors, slots, B)
    return out, state


def test_verify_clean_run_with_a_healing_replica_and_a_late_joiner() -> None:
    # 3 slots; replica 2 joins at step 3 (heals there, trains from step 4); replica 1 dies at
    # step 5 and heals back at step 7
    steps = [
        ([0, 1], []),
        ([0, 1], []),
        ([0, 1], []),
        ([0, 1], [2]),
        ([0, 1, 2], []),
        ([0, 2], []),
        ([0, 2], []),
        ([0, 2], [1]),
        ([0, 1, 2], []),
        ([0, 1, 2], []),
    ]
    records, end = play(steps, 3)
    verdict = ledger.verify(records)
    assert verdict.ok, verdict.problems
    assert verdict.steps == 10
    # every issued sample trained exactly once, nothing left over once all three are back
    assert end.pending == () and verdict.pending == 0
    assert verdict.samples == end.cursor
    trained = sorted(Slot(r.lo, r.hi) for r in records if r.lo is not None)
    assert [u.lo for u in trained] == list(range(0, end.cursor, B))
    # the healing and joining replicas recorded their steps without a share
    assert all(r.lo is None for r in records if r.replica not in r.contributors)


def test_verify_counts_units_still_pending_at_the_end() -> None:
    records, end = play([([0, 1, 2], []), ([0, 2], [])], 3)
    verdict = ledger.verify(records)
    assert verdict.ok, verdict.problems
    assert end.pending == (S(16),) and verdict.pending == B
    assert verdict.samples == end.cursor - B


@pytest.mark.parametrize("seed", range(20))
def test_random_failures_keep_exactly_once(seed: int) -> None:
    """Any sequence of contributor sets tiles the stream; pending never exceeds one unit/slot."""
    rng = random.Random(seed)
    slots = rng.randint(1, 5)
    state = LedgerState()
    records: list[LedgerRecord] = []
    for step in range(60):
        contributors = sorted(rng.sample(range(slots), rng.randint(1, slots)))
        records += [LedgerRecord.make(step, r, state, contributors, slots, B) for r in range(slots)]
        state = ledger.commit(state, contributors, slots, B)
        assert len(state.pending) <= slots
    verdict = ledger.verify(records)
    assert verdict.ok, verdict.problems
    assert verdict.samples + verdict.pending == state.cursor


WHOLE: tuple[list[int], list[int]] = ([0, 1, 2], [])


def _state_at(records: list[LedgerRecord], step: int) -> LedgerState:
    return next(r.state() for r in records if r.step == step)


def test_a_rollback_to_a_checkpoint_counts_the_discarded_steps_not_a_repeat() -> None:
    """Every replica lost at step 6, restored from the checkpoint of step 3 (its ledger state
    with it); the replayed steps 3-5 go otherwise (replica 1 is late). Judged against the
    restored history, every sample once; the three discarded steps are `rolled_back`."""
    first, _ = play([WHOLE, WHOLE, ([0, 2], []), WHOLE, WHOLE, WHOLE], 3)
    again, end = play([([0, 2], [1]), WHOLE, WHOLE, WHOLE], 3, _state_at(first, 3), first=3)
    verdict = ledger.verify(first + again)
    assert verdict.ok, verdict.problems
    assert verdict.rolled_back == 3 and verdict.steps == 7
    assert verdict.samples + verdict.pending == end.cursor


def test_a_fresh_start_replayed_the_same_way_is_rolled_back_too() -> None:
    """A run that started over from sample 0 with the same contributors writes the same heads
    again: the same replica's record of a step twice is the evidence."""
    first, _ = play([WHOLE] * 4, 3)
    again, end = play([WHOLE] * 6, 3)
    verdict = ledger.verify(first + again)
    assert verdict.ok, verdict.problems
    assert verdict.rolled_back == 4 and verdict.samples == end.cursor


def test_a_replica_on_its_own_stale_ledger_is_found_at_every_step() -> None:
    """Replica 2 contributed from step 2 on with the ledger state it had at step 1 (a heal that
    did not bring the peer's state): it trained other units than the run issued its slot."""
    run, _ = play([WHOLE] * 5, 3)
    stale = [
        _edit(r, **json.loads(r0.head()), lo=None, hi=None)
        for r, r0 in zip(
            [r for r in run if r.replica == 2 and r.step >= 2],
            [r for r in run if r.replica == 2 and r.step >= 1],
            strict=False,
        )
    ]
    records = [r for r in run if not (r.replica == 2 and r.step >= 2)] + stale
    verdict = ledger.verify(records)
    found = [p for p in verdict.problems if "replica 2 recorded" in p]
    assert [p.split(":")[0] for p in found] == ["step 2", "step 3", "step 4"], verdict.problems


def test_a_step_committed_twice_from_one_state_counts_a_contributor_without_its_record() -> None:
    """Step 2 from one state, twice: replicas 1 and 2 commit it with all three slots, while
    replica 0, whose allreduce failed after theirs completed, stays at step 2 and commits it
    again with a fresh replica 2 (contributors 0 and 2). That second commit is then lost (both
    die) and the run goes on from the first. Replica 0 trained the unit the history gave its
    slot: a rollback, not a disagreement."""
    before, s2 = play([WHOLE, WHOLE], 3)
    on_history, s3 = play([([0, 1, 2], [])], 3, s2, first=2)
    on_history = [r for r in on_history if r.replica != 0]
    side, _ = play([([0, 2], [])], 3, s2, first=2)
    after, end = play([WHOLE, WHOLE], 3, s3, first=3)
    verdict = ledger.verify(before + side + on_history + after)
    assert verdict.ok, verdict.problems
    assert verdict.rolled_back == 1 and verdict.samples + verdict.pending == end.cursor


def test_a_rollback_to_a_state_the_run_never_had_is_a_gap() -> None:
    first, _ = play([WHOLE] * 4, 3)
    shifted = replace(_state_at(first, 2), cursor=_state_at(first, 2).cursor + B)
    again, _ = play([WHOLE] * 3, 3, shifted, first=2)
    verdict = ledger.verify(first + again)
    assert any("skipped" in p for p in verdict.problems), verdict.problems


def _edit(rec: LedgerRecord, **fields: object) -> LedgerRecord:
    data = {k: getattr(rec, k) for k in LedgerRecord.__dataclass_fields__}
    data.update(fields)
    return LedgerRecord(**data)  # type: ignore[arg-type]


def _bad(kind: str) -> list[LedgerRecord]:
    records, _ = play([([0, 1], []), ([0, 1], []), ([0, 1], [])], 2)
    if kind == "repeated":  # step 1 started from step 0's state again
        return [*records[:2], *(_edit(r, cursor=0, last=[]) for r in records[2:4]), *records[4:]]
    if kind == "skipped":  # step 2 starts past where step 1 ended
        return [*records[:4], *(_edit(r, cursor=r.cursor + 8) for r in records[4:])]
    if kind == "disagree":  # replica 1 trained step 1 from the state of a step 0 it took alone
        alone = ledger.commit(records[1].state(), [1], 2, B)
        own = LedgerRecord.make(1, 1, alone, [0, 1], 2, B)
        return [*records[:3], own, *records[4:]]
    if kind == "off-slot":  # replica 1 trained replica 0's unit
        return [*records[:3], _edit(records[3], lo=records[2].lo, hi=records[2].hi), *records[4:]]
    if kind == "did not contribute":  # a healing replica claims a share
        healed, _ = play([([0], [1]), ([0, 1], [])], 2)
        return [healed[0], _edit(healed[1], lo=4, hi=8), *healed[2:]]
    if kind == "never committed":
        return [*records[:2], *records[4:]]
    if kind == "twice":  # a pending unit that was already trained
        return [_edit(r, pending=[[0, 4]], cursor=8) if r.step == 2 else r for r in records[:4]] + [
            _edit(r, pending=[[0, 4]]) for r in records[4:]
        ]
    raise AssertionError(kind)


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("repeated", "repeated"),
        ("skipped", "skipped"),
        ("disagree", "disagree"),
        ("off-slot", "off-slot"),
        ("did not contribute", "did not contribute"),
        ("never committed", "never committed"),
        ("twice", "trained twice"),
    ],
)
def test_verify_finds(kind: str, problem: str) -> None:
    verdict = ledger.verify(_bad(kind))
    assert not verdict.ok
    assert any(problem in p for p in verdict.problems), verdict.problems


def test_state_and_log_roundtrip_skip_a_torn_line(tmp_path: Path) -> None:
    state = LedgerState(12, (S(0), S(8)), (1,))
    assert LedgerState.from_json(state.to_json()) == state
    rec = LedgerRecord.make(3, 1, state, [1], 3, B)
    assert (rec.lo, rec.hi, rec.participants) == (0, 4, 1)
    path = tmp_path / "r1.jsonl"
    path.write_text(rec.to_json() + "\n" + '{"step": 4, "repl')
    assert ledger.read_log([path]) == [rec]


@pytest.mark.parametrize(
    ("ages", "since_ago", "alive"),
    [
        ((), 10.0, False),  # no log at all: nothing holds the run's state
        ((100.0, 50.0), 10.0, False),  # every log older than the start: a whole-run loss
        ((100.0, 2.0), 10.0, True),  # one replica committed after the start: it is alive
        ((5.0,), 10.0, True),
    ],
)
def test_a_log_written_since_a_start_means_a_replica_with_state_is_alive(
    tmp_path: Path, ages: tuple[float, ...], since_ago: float, alive: bool
) -> None:
    now = time.time()
    for i, age in enumerate(ages):
        path = tmp_path / f"r{i:02d}.jsonl"
        path.write_text('{"step": 3}\n')
        os.utime(path, (now - age, now - age))
    (tmp_path / "notes.txt").write_text("not a ledger log")
    assert ledger.appended_since(tmp_path, now - since_ago) is alive
