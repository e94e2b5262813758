"""The hot-spare pool: replica-sized slot jobs that hold health-checked nodes idle for the run.

Why slots and not a shrinking pool job: Slurm cannot hand a node from one job to another (job
expansion is gone from 23.02 on), and a node released by `scontrol update NumNodes=` goes back
to the scheduler, where anyone's pending job may take it first. A job step runs only inside its
own job's allocation. So each slot is its own job shaped like one replica (same partition, GRES,
constraint, switches; gated by the Prolog like any job), and a failed replica moves *into* a slot:
the slot's batch script (`agent`) waits for an assignment in `RUN_DIR/spares.json` and then runs
that replica's own script in the slot's allocation. The replica's job id becomes the slot's; its
old job is cancelled, and one refill slot is queued (it waits like anyone's job).

The pool's data (`Pool`, `Slot`, read and written as `spares.json`, 0600, written only by
`fthsdp submit` and then by the coordinator) is the run directory's (`slurm.rundir.spares`).
Here: the pure decisions (`choose_slot`, `plan_upkeep`), and the I/O around them (`SpareManager`
in the coordinator, `agent` in a slot).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm.backend import CommandBackend, SlurmBackend, SlurmCommandError
from slurm.errors import EnvironmentProblem, InputError
from slurm.rundir import (
    LOG_DIR,
    REPLICA_SCRIPT,
    SLOT_JOB_ID,
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

if TYPE_CHECKING:  # the coordinator imports this module, not the other way round at run time
    from runtime.control.coordinator import Coordinator
    from runtime.control.journal import StoredAction

log = logging.getLogger("fthsdp.spares")

#: Slurm states of a slot job that still holds (or will hold) its nodes.
_LIVE = ("PENDING", "CONFIGURING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED")
#: Node flags or base states that make a spare unusable.
_BAD_NODE = ("DRAIN", "DOWN", "FAIL", "NOT_RESPONDING", "MAINTENANCE", "REBOOT")
#: How many moves and fallbacks spares.json keeps (the journal keeps them all).
_HISTORY = 50


# -- pure decisions ---------------------------------------------------------------------------


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
        return self.state is not None and self.state.upper() in _LIVE


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
    return replace(pool, slots=slots, moves=(*pool.moves, move)[-_HISTORY:])


def pool_summary(pool: Pool, views: Mapping[str, SlotView]) -> dict[str, Any]:
    """What `fthsdp status` shows: each slot's job, state, nodes, health and replica."""
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


# -- the coordinator's side -------------------------------------------------------------------


def _bad(flags: Iterable[str], state: str) -> bool:
    words = {f.upper() for f in flags} | {w for w in state.upper().replace("+", " ").split()}
    return any(b in w for w in words for b in _BAD_NODE)


class SpareManager:
    """The pool's I/O in the coordinator: reads Slurm, writes spares.json, cancels and submits.

    Every method is blocking (run it in an executor); one lock orders the writers."""

    def __init__(self, run_dir: Path, backend: SlurmBackend, clock: Any = time.time) -> None:
        self.run_dir = Path(run_dir)
        self.backend = backend
        self.clock = clock
        self._lock = threading.Lock()
        self._last_views: dict[str, SlotView] = {}
        self._polls = 0

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
        nodes_of = {j: _expand(i.nodes) for j, i in found.items()}
        wanted = sorted({n for ns in nodes_of.values() for n in ns})
        listed = self.backend.nodes(wanted) if wanted else []
        bad = {n.name for n in listed if _bad(n.flags, n.state)}
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
                pool = replace(pool, fallbacks=(*pool.fallbacks, fall)[-_HISTORY:])
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
        retired = (*pool.retired, *plan.cancel)[-_HISTORY:]
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
            return pool_summary(self.pool(), self._last_views)
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


def _expand(nodes: str) -> list[str]:
    import hostlist

    if not nodes or nodes.startswith("(") or " " in nodes:
        return []
    return list(hostlist.expand_hostlist(nodes))


# -- coordinator hooks (called from runtime.control.coordinator) -------------------------------


async def carry_out(coord: Coordinator, stored: StoredAction, resumed: bool) -> bool:
    """A Requeue or Release of the run's pool: True when handled here (the caller skips it).

    Requeue: move the replica into a free slot (journaled as done, with the slot), then tell the
    policy its job is the slot's (a `JobObserved`, so a replay rebuilds it). No slot free: the
    plain requeue, journaled with why. Release of a job that moved: skipped, with where to."""
    from runtime.control.policy import JobObserved, Release, Requeue

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
    try:
        script = _script_of(coord.config.run_dir, action.replica)
        move, why = await loop.run_in_executor(
            None, spares.move, action.replica, action.job_id, script
        )
    except (SlurmCommandError, PoolFileError, EnvironmentProblem, InputError) as exc:
        log.error("spare pool unusable, plain requeue: %s", exc)
        move, why = None, f"spare pool unusable ({exc}): plain requeue"
    if move is None:
        await coord.attempt(stored.id, "started", why)
        try:
            outcome, detail = await loop.run_in_executor(None, coord._execute, action, resumed)
        except (SlurmCommandError, InputError, EnvironmentProblem):
            return False  # the caller's loop retries and journals the error
        await coord.attempt(stored.id, outcome, f"{detail}; {why}")
        return True
    await coord.attempt(
        stored.id, "done", f"moved to spare slot {move.to_job} on {','.join(move.nodes)}"
    )
    await coord.submit(
        JobObserved(action.replica, move.to_job, 0, "RUNNING", coord.clock(), move.nodes)
    )
    return True


async def on_poll(coord: Coordinator, every: int = 3) -> None:
    """Every `every`-th poll: upkeep (retire, refill), then move a replica that waits in the
    queue (an earlier fallback) into a slot that became free."""
    spares = coord.spares
    assert spares is not None
    spares._polls += 1
    if spares._polls % every:
        return
    if all(r.phase in ("done", "out", "ended") for r in coord.state.replicas.values()):
        return  # the run is over: no refills for a pool nobody will use
    loop = asyncio.get_running_loop()
    try:
        for line in await loop.run_in_executor(None, spares.upkeep):
            log.warning("spare pool: %s", line)
    except (SlurmCommandError, PoolFileError, EnvironmentProblem) as exc:
        log.warning("spare pool upkeep: %s", exc)
        return
    from runtime.control.policy import JobObserved

    for k, r in coord.state.replicas.items():
        job = r.job_id
        if job is None or coord.job_states.get(job) != "PENDING" or r.phase == "out":
            continue
        if choose_slot(spares.pool(), spares._last_views, exclude=job) is None:
            return
        try:
            script = _script_of(coord.config.run_dir, k)
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


# -- the slot's side --------------------------------------------------------------------------


def agent(run_dir: Path, job_id: str, poll_s: float = 0.5, control_every_s: float = 15.0,
          unlisted_grace_s: float = 120.0) -> int:  # fmt: skip
    """Hold the slot until the coordinator assigns a replica, then become that replica's script.

    Leaves (exit 0) when the control job has ended, or when the pool no longer lists this slot
    after `unlisted_grace_s` (submit and refills write spares.json right after sbatch)."""
    started = time.monotonic()
    next_control = started
    control_id = _control_job(run_dir)
    backend = CommandBackend(retries=1, timeout=20.0)
    while True:
        try:
            pool = read_pool(run_dir)
        except PoolFileError as exc:
            print(f"fthsdp spare: {exc}", file=sys.stderr)
            pool = None
        slot = pool.slot(job_id) if pool else None
        if slot is not None and slot.replica is not None and slot.script is not None:
            return _become(run_dir, slot, job_id)
        if slot is None and pool is not None and time.monotonic() - started > unlisted_grace_s:
            print(f"fthsdp spare: job {job_id} is not in the pool: leaving", file=sys.stderr)
            return 0
        if control_id and time.monotonic() >= next_control:
            next_control = time.monotonic() + control_every_s
            if _ended(backend, control_id):
                print(f"fthsdp spare: control job {control_id} ended: leaving", file=sys.stderr)
                return 0
        time.sleep(poll_s)


def replica_logs(run_dir: Path, script: str, job_id: str) -> tuple[Path, Path]:
    """The stdout and stderr files a replica's script gets in job `job_id` (`--output` and
    `--error` of its `#SBATCH` block, `%j` filled in)."""
    stem = Path(run_dir) / LOG_DIR / f"{script.removesuffix('.sbatch')}-{job_id}"
    return stem.with_name(stem.name + ".out"), stem.with_name(stem.name + ".err")


def _become(run_dir: Path, slot: Slot, job_id: str) -> int:
    assert slot.script is not None and REPLICA_SCRIPT.fullmatch(slot.script)
    path = Path(run_dir) / slot.script
    st = path.stat()
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        print(f"fthsdp spare: {path} is not this user's private script", file=sys.stderr)
        return 2
    logs = replica_logs(run_dir, slot.script, job_id)
    print(
        f"fthsdp spare: running replica {slot.replica} ({slot.script}); its output goes to "
        f"{logs[0]} and {logs[1]}",
        file=sys.stderr,
    )
    sys.stderr.flush()
    # The replica's output belongs in its own logs (named as if Slurm had started its script in
    # this job), not in this slot's.
    for fd, log in zip((1, 2), logs, strict=True):
        try:
            target = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:  # the replica runs on; its output stays here
            print(f"fthsdp spare: cannot open {log} ({exc}); output stays here", file=sys.stderr)
            sys.stderr.flush()
            continue
        os.dup2(target, fd)
        os.close(target)
    os.execv("/bin/bash", ["/bin/bash", str(path)])
    return 0  # pragma: no cover - execv does not return


def _control_job(run_dir: Path) -> str | None:
    try:
        record = read_run(run_dir)
    except (InputError, OSError):
        return None
    return record.control.job_id if record.control else None


def _ended(backend: SlurmBackend, job_id: str) -> bool:
    try:
        found = [i for i in backend.jobs([job_id]) if i.base_id == job_id and i.het_offset == 0]
    except (SlurmCommandError, EnvironmentProblem):
        return False  # unknown is not ended
    return not found or found[0].state.upper() not in _LIVE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.control.spares")
    sub = parser.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("agent", help="run in a spare slot job: wait for a replica to host")
    a.add_argument("--run-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not SLOT_JOB_ID.fullmatch(job_id):
        print("fthsdp spare: SLURM_JOB_ID is not set: run this inside a slot job", file=sys.stderr)
        return 2
    return agent(args.run_dir, job_id)


if __name__ == "__main__":
    sys.exit(main())
