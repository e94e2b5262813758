"""The spare pool's I/O in the coordinator: Slurm's view of the slots, moves, refills.

`SpareManager` reads each slot job and its nodes from Slurm, applies the pure decisions
(`runtime.control.spare_slots`) and writes the result to `spares.json`
(`runtime.control.spares`); it cancels the failed job a replica leaves and queues refill slots.

Two hooks connect it to the coordinator's event core: `carry_out` intercepts a Requeue (move
into a free slot, else the plain requeue through the Slurm executor) and a Release of a job that
moved; `on_poll` keeps the pool topped up and moves a replica still waiting in the queue into a
slot that became free. The coordinator is seen through `PoolHost`, the few things the pool needs
of it, so this module does not import the coordinator.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from runtime.control.executor import NotYet, SlurmExecutor
from runtime.control.journal.schema import StoredAction
from runtime.control.policy import FINISHED_PHASES, Event, JobObserved, Release, Requeue, RunState
from runtime.control.spare_slots import (
    HISTORY,
    SlotView,
    assign,
    choose_slot,
    plan_upkeep,
    pool_summary,
)
from runtime.warm_handoff import handoff_path, read_ready
from slurm.backend import SlurmBackend, SlurmCommandError
from slurm.errors import EnvironmentProblem, InputError
from slurm.hostlist import job_nodes
from slurm.rundir import (
    REPLICA_SCRIPT,
    SPARE_SCRIPT,
    SPARES_FILE,
    Fallback,
    Move,
    Pool,
    PoolFileError,
    Slot,
    read_pool,
    read_run,
    write_pool,
)

log = logging.getLogger("fthsdp.spares")

#: Node flags or base states that make a spare unusable.
_BAD_NODE = ("DRAIN", "DOWN", "FAIL", "NOT_RESPONDING", "MAINTENANCE", "REBOOT")


class PoolHost(Protocol):
    """What the pool's hooks use of the coordinator (`runtime.control.coordinator`)."""

    @property
    def spares(self) -> SpareManager | None: ...
    @property
    def executor(self) -> SlurmExecutor: ...
    @property
    def state(self) -> RunState: ...
    @property
    def job_states(self) -> Mapping[str, str | None]: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    async def attempt(self, action_id: int, outcome: str, detail: str = "") -> None: ...
    async def submit(self, event: Event, nonce: str | None = None, always: bool = True) -> bool: ...


def _bad(flags: Iterable[str], state: str) -> bool:
    words = {f.upper() for f in flags} | {w for w in state.upper().replace("+", " ").split()}
    return any(b in w for w in words for b in _BAD_NODE)


class SpareManager:
    """The pool's I/O in the coordinator: reads Slurm, writes spares.json, cancels and submits.

    Every method is blocking (run it in an executor); one lock orders the writers."""

    def __init__(
        self, run_dir: Path, backend: SlurmBackend, clock: Callable[[], float] = time.time
    ) -> None:
        self.run_dir = Path(run_dir)
        self.backend = backend
        self.clock = clock
        self._lock = threading.Lock()
        self._last_views: dict[str, SlotView] = {}
        self._polls = 0
        #: Nodes the run decided to drain (the policy's `RunState.drained`): unusable for a
        #: slot like a drained node, since without drain rights the drain is only requested
        #: and the node may still be up, where a refill slot could land.
        self.suspects: frozenset[str] = frozenset()

    @classmethod
    def load(cls, run_dir: Path, backend: SlurmBackend) -> SpareManager | None:
        """A manager when the run has a pool (spares.json); a bad file stops the coordinator."""
        try:
            pool = read_pool(run_dir)
        except PoolFileError as exc:
            raise EnvironmentProblem(str(exc)) from None
        return None if pool is None else cls(run_dir, backend)

    def pool(self) -> Pool:
        pool = read_pool(self.run_dir)
        if pool is None:
            raise EnvironmentProblem(f"{self.run_dir / SPARES_FILE} disappeared")
        return pool

    def views(self, pool: Pool) -> dict[str, SlotView]:
        """Each slot job's state and nodes from squeue, with the nodes' health from Slurm."""
        ids = [s.job_id for s in pool.slots]
        if not ids:
            return {}
        infos = [i for i in self.backend.jobs(ids) if i.het_offset == 0]
        found = {i.base_id: i for i in infos if i.base_id in ids}
        nodes_of = {j: job_nodes(i.nodes) for j, i in found.items()}
        wanted = sorted({n for ns in nodes_of.values() for n in ns})
        listed = self.backend.nodes(wanted) if wanted else []
        bad = {n.name for n in listed if _bad(n.flags, n.state)} | (self.suspects & set(wanted))
        views = {}
        for j in ids:
            nodes = tuple(nodes_of.get(j, ()))
            state = found[j].state.upper() if j in found else None
            views[j] = SlotView(j, state, nodes, tuple(n for n in nodes if n in bad))
        self._last_views = views
        return views

    def move(self, replica: int, from_job: str, script: str) -> tuple[Move | None, str]:
        """Put `replica` (whose job `from_job` failed) into a free slot: assign, cancel the old
        job, queue a refill. Returns the move (None: no slot free, with why)."""
        with self._lock:
            pool = self.pool()
            done = pool.moved_from(from_job)
            if done is not None:
                return done, "moved already"  # a resumed action after a coordinator restart
            views = self.views(pool)
            slot = choose_slot(pool, views, exclude=from_job)
            if slot is None:
                why = _empty_reason(pool, views)
                fall = Fallback(replica, from_job, self.clock(), why)
                pool = replace(pool, fallbacks=(*pool.fallbacks, fall)[-HISTORY:])
                write_pool(self.run_dir, pool)
                return None, why
            nodes = views[slot.job_id].nodes
            pool = assign(pool, slot, replica, script, from_job, nodes, self.clock())
            write_pool(self.run_dir, pool)  # the slot's agent starts the replica from here
            log.warning("replica %d: job %s -> spare slot %s on %s", replica, from_job,
                        slot.job_id, ",".join(nodes))  # fmt: skip
            try:
                self.backend.cancel([from_job])
            except SlurmCommandError as exc:  # the old job may already have ended
                log.warning("cancel of job %s: %s", from_job, exc)
            self._upkeep(pool, views)
            return pool.moved_from(from_job), f"spare slot {slot.job_id}"

    def upkeep(self) -> list[str]:
        """Retire unhealthy idle slots and queue refills; returns what was done, for the log."""
        with self._lock:
            pool = self.pool()
            return self._upkeep(pool, self.views(pool))

    def _upkeep(self, pool: Pool, views: Mapping[str, SlotView]) -> list[str]:
        plan = plan_upkeep(pool, views)
        done: list[str] = []
        if plan.cancel:
            try:
                self.backend.cancel(list(plan.cancel))
                done.append(f"retired slots {','.join(plan.cancel)} (node failed a check)")
            except SlurmCommandError as exc:
                log.warning("cancel of slots %s: %s", plan.cancel, exc)
                plan = replace(plan, drop=tuple(j for j in plan.drop if j not in plan.cancel))
        slots = tuple(s for s in pool.slots if s.job_id not in plan.drop)
        retired = (*pool.retired, *plan.cancel)[-HISTORY:]
        new = []
        for _ in range(plan.submit):
            try:
                new.append(Slot(self.backend.submit(self.run_dir / SPARE_SCRIPT)))
            except SlurmCommandError as exc:
                log.warning("refill of the spare pool failed: %s", exc)
                break
        if new:
            done.append(f"queued refill slots {','.join(s.job_id for s in new)}")
        changed = new or plan.drop
        if changed:
            write_pool(self.run_dir, replace(pool, slots=slots + tuple(new), retired=retired))
        return done

    def summary(self) -> dict[str, Any]:
        """The pool for `/v1/state` (the last views read; no Slurm call on a status request)."""
        try:
            pool = self.pool()
            warm = {
                s.job_id: read_ready(handoff_path(self.run_dir, s.job_id)) is not None
                for s in pool.slots
            }
            return pool_summary(pool, self._last_views, warm)
        except (PoolFileError, EnvironmentProblem) as exc:
            return {"error": str(exc)}


def _empty_reason(pool: Pool, views: Mapping[str, SlotView]) -> str:
    states = [views[s.job_id].state or "gone" for s in pool.slots if s.job_id in views]
    used = sum(1 for s in pool.slots if s.replica is not None)
    return (
        f"no spare free ({len(pool.slots)} slots: {used} in use, idle/queued states "
        f"{','.join(st.lower() for st in states) or 'none'}): plain requeue, the replica waits "
        "for the scheduler"
    )


async def carry_out(coord: PoolHost, stored: StoredAction, resumed: bool) -> bool:
    """A Requeue or Release of the run's pool: True when handled here (the caller skips it).

    Requeue: move the replica into a free slot (journaled as done, with the slot), then tell the
    policy its job is the slot's (a `JobObserved`, so a replay rebuilds it). No slot free: the
    plain requeue, journaled with why. Release of a job that moved: skipped, with where to."""
    spares = coord.spares
    assert spares is not None
    action = stored.action
    loop = asyncio.get_running_loop()
    if isinstance(action, Release):
        try:
            moved = spares.pool().moved_from(action.job_id)
        except (PoolFileError, EnvironmentProblem):
            return False
        if moved is None:
            return False
        await coord.attempt(stored.id, "skipped", f"replica moved to spare slot {moved.to_job}")
        return True
    if not isinstance(action, Requeue):
        return False
    spares.suspects = frozenset(coord.state.drained)
    try:
        script = _script_of(spares.run_dir, action.replica)
        move, why = await loop.run_in_executor(
            None, spares.move, action.replica, action.job_id, script
        )
    except (SlurmCommandError, PoolFileError, EnvironmentProblem, InputError) as exc:
        log.error("spare pool unusable, plain requeue: %s", exc)
        move, why = None, f"spare pool unusable ({exc}): plain requeue"
    if move is None:
        await coord.attempt(stored.id, "started", why)
        try:
            outcome, detail = await loop.run_in_executor(
                None, coord.executor.execute, action, resumed
            )
        except (SlurmCommandError, InputError, EnvironmentProblem, NotYet):
            return False  # the caller's loop waits or retries, and journals why
        await coord.attempt(stored.id, outcome, f"{detail}; {why}")
        return True
    await coord.attempt(
        stored.id, "done", f"moved to spare slot {move.to_job} on {','.join(move.nodes)}"
    )
    await coord.submit(
        JobObserved(action.replica, move.to_job, 0, "RUNNING", coord.clock(), move.nodes)
    )
    return True


async def on_poll(coord: PoolHost, every: int = 3) -> None:
    """Every `every`-th poll: upkeep (retire, refill), then move a replica that waits in the
    queue (an earlier fallback) into a slot that became free."""
    spares = coord.spares
    assert spares is not None
    spares._polls += 1
    if spares._polls % every:
        return
    if all(r.phase in FINISHED_PHASES for r in coord.state.replicas.values()):
        return  # the run is over: no refills for a pool nobody will use
    loop = asyncio.get_running_loop()
    spares.suspects = frozenset(coord.state.drained)
    try:
        for line in await loop.run_in_executor(None, spares.upkeep):
            log.warning("spare pool: %s", line)
    except (SlurmCommandError, PoolFileError, EnvironmentProblem) as exc:
        log.warning("spare pool upkeep: %s", exc)
        return
    for k, r in coord.state.replicas.items():
        job = r.job_id
        if job is None or coord.job_states.get(job) != "PENDING" or r.phase == "out":
            continue
        if choose_slot(spares.pool(), spares._last_views, exclude=job) is None:
            return
        try:
            script = _script_of(spares.run_dir, k)
            move, _ = await loop.run_in_executor(None, spares.move, k, job, script)
        except (SlurmCommandError, PoolFileError, EnvironmentProblem, InputError) as exc:
            log.warning("spare pool: replica %d stays in the queue: %s", k, exc)
            return
        if move is not None:
            await coord.submit(JobObserved(k, move.to_job, 0, "RUNNING", coord.clock(), move.nodes))


def _script_of(run_dir: Path, replica: int) -> str:
    """The replica's script name as jobs.json records it."""
    for rec in read_run(run_dir).replicas:
        if rec.replica == replica and REPLICA_SCRIPT.fullmatch(rec.script):
            return rec.script
    raise InputError("replica", replica, "a replica with a script in jobs.json")
