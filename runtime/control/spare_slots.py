"""The spare pool's pure decisions: which slot a failed replica takes, and how the pool is kept.

Plain functions over the pool as `spares.json` holds it (`runtime.control.spares`) and each slot
job as Slurm shows it now (`SlotView`): `choose_slot` picks the slot a replica moves into,
`plan_upkeep` says which slots to retire, forget and refill, `assign` records a move, and
`pool_summary` is what `fthsdp status` shows. No I/O, so every rule is tested by tables
(tests/test_control_spare_slots.py); the coordinator's `SpareManager` does the reading and writing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from runtime.control.spares import LIVE_STATES
from slurm.rundir import Move, Pool, Slot

#: How many moves and fallbacks spares.json keeps (the journal keeps them all).
HISTORY = 50


@dataclass(frozen=True)
class SlotView:
    """A slot job as Slurm sees it now: its state (None: no longer listed) and nodes, and which
    of those nodes are drained, down or failing."""

    job_id: str
    state: str | None
    nodes: tuple[str, ...] = ()
    bad_nodes: tuple[str, ...] = ()

    @property
    def live(self) -> bool:
        return self.state is not None and self.state.upper() in LIVE_STATES


def choose_slot(pool: Pool, views: Mapping[str, SlotView], exclude: str = "") -> Slot | None:
    """The slot a failed replica moves to: running, idle, every node healthy; oldest first
    (submit order, so the pool's first nodes go first). None: the pool has none free now."""
    for slot in pool.slots:
        v = views.get(slot.job_id)
        if slot.replica is not None or slot.job_id == exclude or v is None:
            continue
        if v.state == "RUNNING" and v.nodes and not v.bad_nodes:
            return slot
    return None


@dataclass(frozen=True)
class Upkeep:
    #: Idle slots to cancel (a node of theirs failed its health check).
    cancel: tuple[str, ...]
    #: Slots to forget: their job ended or is gone (cancelled ones included).
    drop: tuple[str, ...]
    #: Refill slots to queue so that `target` are available again.
    submit: int


def plan_upkeep(pool: Pool, views: Mapping[str, SlotView]) -> Upkeep:
    """Keep `target` slots available: forget ended slots, retire idle ones on a bad node, and
    queue refills for what is missing. A slot whose job Slurm was not asked about yet counts as
    available (never over-submit on missing data); hosting slots are the replicas' own jobs now
    and are only forgotten once they end."""
    cancel, drop = [], []
    available = 0
    for slot in pool.slots:
        v = views.get(slot.job_id)
        if v is not None and not v.live:
            drop.append(slot.job_id)
            continue
        if slot.replica is not None:
            continue
        if v is not None and v.bad_nodes:
            cancel.append(slot.job_id)
            drop.append(slot.job_id)
            continue
        available += 1
    return Upkeep(tuple(cancel), tuple(drop), max(0, pool.target - available))


def assign(pool: Pool, slot: Slot, replica: int, script: str, from_job: str,
           nodes: tuple[str, ...], at: float) -> Pool:  # fmt: skip
    """The pool with `replica` (whose job was `from_job`) running in `slot`."""
    slots = tuple(
        replace(s, replica=replica, script=script, since=at) if s.job_id == slot.job_id else s
        for s in pool.slots
    )
    move = Move(replica, from_job, slot.job_id, nodes, at)
    return replace(pool, slots=slots, moves=(*pool.moves, move)[-HISTORY:])


def pool_summary(
    pool: Pool, views: Mapping[str, SlotView], warm: Mapping[str, bool] | None = None
) -> dict[str, Any]:
    """What `fthsdp status` shows: each slot's job, state, nodes, health and replica, and
    whether its processes are warm (`warm`: a warm slot's step waits for a replica)."""
    rows = []
    for s in pool.slots:
        v = views.get(s.job_id)
        rows.append(
            {
                "job_id": s.job_id,
                "state": v.state if v else None,
                "nodes": list(v.nodes) if v else [],
                "health": ("unknown" if v is None else "bad" if v.bad_nodes else "ok"),
                "bad_nodes": list(v.bad_nodes) if v else [],
                "replica": s.replica,
                "warm": bool(warm and warm.get(s.job_id)),
            }
        )
    idle = sum(
        1 for r in rows if r["replica"] is None and r["state"] == "RUNNING" and r["health"] == "ok"
    )
    last = pool.fallbacks[-1] if pool.fallbacks else None
    return {
        "target": pool.target,
        "slots": rows,
        "idle": idle,
        "in_use": sum(1 for r in rows if r["replica"] is not None),
        "moves": [asdict(m) for m in pool.moves[-5:]],
        "last_fallback": asdict(last) if last else None,
        "retired": list(pool.retired[-5:]),
    }
