"""The coordinator's event core: one run's state, its journal, and the policy's decisions.

It is the I/O shell around the pure policy (`runtime.control.policy`): requests and timers become
events, each event is stored in the journal together with the actions the policy decided, and
only then are the Slurm actions carried out (drain, requeue, release, cancel) by the Slurm
executor (`runtime.control.executor`), in a worker thread, with bounded retries and backoff,
each attempt journaled. The HTTP face that feeds it requests is `runtime.control.http`; its
settings are `runtime.control.settings`.

Stragglers (`runtime.control.straggler.StragglerService`): every accepted report also feeds the
straggler monitor; an eviction it decides goes through the policy as a `StragglerEviction`
event (tier 2: drain with `fthsdp: straggler: <node> <factor>x`, requeue).

Timers: a tick finds replicas silent past their report timeout; a poll reads the replica jobs
from `squeue` so Slurm's own requeues are seen (and never repeated).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from runtime.control.auth import RequestAuth, ensure_secret
from runtime.control.executor import SlurmExecutor
from runtime.control.guard import Refusals
from runtime.control.job_lookup import JobLookup
from runtime.control.journal.schema import StoredAction
from runtime.control.journal.store import Journal
from runtime.control.journal.writer import GroupWriter, transient
from runtime.control.policy import (
    FINISHED_PHASES,
    SLURM_ACTIONS,
    CoordinatorStarted,
    Event,
    JobObserved,
    Release,
    ReplicaState,
    ReportReceived,
    RunState,
    Tick,
    step,
)
from runtime.control.settings import CoordinatorConfig
from runtime.control.spare_manager import SpareManager
from runtime.control.spare_manager import carry_out as spares_carry_out
from runtime.control.spare_manager import on_poll as spares_on_poll
from runtime.control.straggler.service import StragglerService
from runtime.protocol import ReplicaReport
from slurm.backend import SlurmBackend, SlurmCommandError, make_backend
from slurm.hostlist import job_nodes
from slurm.privileges import resolve as resolve_drain
from slurm.records import unreachable
from slurm.rundir import TERMINAL_STATES

log = logging.getLogger("fthsdp.coordinator")


def run_over(
    replicas: Iterable[ReplicaState], job_states: Mapping[str, str | None], open_actions: int
) -> str | None:
    """Why the run is over, or None while it is not.

    Over when no Slurm action is still open and every replica has finished: its phase says so
    (completed, left out, ended), or Slurm's last answer lists its job in a terminal state, or no
    longer lists it (`job_states[job]` is None: gone). A replica whose job Slurm was not asked
    about yet is not finished.
    """
    if open_actions:
        return None
    how: dict[str, int] = {}
    for r in replicas:
        state = job_states.get(r.job_id, "") if r.job_id else ""
        if r.phase in FINISHED_PHASES:
            what = {"done": "completed", "out": "left out"}.get(r.phase, (state or "ended").lower())
        elif r.job_id and r.job_id in job_states and state is None:
            what = "gone"
        elif state and state.upper() in TERMINAL_STATES:
            what = state.lower()
        else:
            return None
        how[what] = how.get(what, 0) + 1
    if not how:
        return None
    counts = ", ".join(f"{n} {what}" for what, n in sorted(how.items()))
    return f"every replica has finished ({counts})"


def compaction_interval(replicas: int) -> int:
    """Events between journal snapshots: a snapshot costs O(replicas), so one per 4 reports of
    every replica keeps its cost per event constant and the uncompacted tail short."""
    return max(1000, 4 * replicas)


class Coordinator:
    """State and journal of one run's control plane; its Slurm actions go to `executor`."""

    def __init__(
        self,
        config: CoordinatorConfig,
        backend: SlurmBackend | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        #: The keys signed requests are checked with (`runtime.control.auth`).
        self.auth = RequestAuth(ensure_secret(config.run_dir), clock)
        self.backend: SlurmBackend = backend or make_backend(retries=1, timeout=20.0)
        #: Reports' lookups of their jobs, asked together when they come together.
        self.job_lookup = JobLookup(lambda ids: self.backend.jobs(ids))
        #: Carries out the journaled Slurm actions (`runtime.control.executor`).
        self.executor = SlurmExecutor(
            self.backend,
            retries=config.action_retries,
            backoff_s=config.action_backoff_s,
            backoff_max_s=config.action_backoff_max_s,
        )
        self.clock = clock
        self.journal = Journal.in_run_dir(config.run_dir)
        self.journal.check()
        self.journal.filter_nonces()
        self.state, open_actions, self._seq = self.journal.rebuild(config.policy, config.job_ids)
        #: Whether this user may drain, or asks root's Epilog to (`slurm.privileges`); decided
        #: once the journal is known good, so a bad journal is the one line a start prints.
        self.privileges = resolve_drain(config.drain, timeout=20.0)
        self.executor.drain_mode = self.privileges.mode
        self._open = open_actions
        #: Group commit of the journal (created by `start`, on the running loop).
        self.writer: GroupWriter | None = None
        #: How late the event loop ran its last timer (seconds; `_watch_lag`).
        self.loop_lag_s = 0.0
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self.started_at = clock()
        self.refusals = Refusals(config.guard.log_every_s)
        #: The Lighthouse gate's counters, when this process runs one (the control service).
        self.gate_stats: Callable[[], dict[str, Any]] | None = None
        #: job id -> its nodes as Slurm last listed them (polls and report checks).
        self.allocations: dict[str, tuple[str, ...]] = {}
        #: job id -> its state in Slurm's last answer; None once Slurm no longer lists it.
        self.job_states: dict[str, str | None] = {}
        self._since_compact = 0
        self.compact_every = config.compact_every or compaction_interval(config.policy.replicas)
        # Stragglers and metrics (runtime.control.straggler / .metrics).
        past = self.journal.count_events("StragglerEviction")
        self.stragglers = StragglerService(
            config.policy.min_replicas,
            config.total_steps,
            detect=config.straggler,
            evict=replace(config.eviction, min_replicas=config.policy.min_replicas),
            past_evictions=past,
        )
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry()
        #: The run's hot-spare pool (`runtime.control.spares`), None without `[spares]`.
        self.spares = SpareManager.load(config.run_dir, self.backend)

    # -- events -------------------------------------------------------------------------------

    async def submit(self, event: Event, nonce: str | None = None, always: bool = True) -> bool:
        """Apply an event: journal it with its decision, then start the Slurm actions.

        The event goes into the journal's next group commit. Anything but a status report that
        decided nothing is awaited until it is durable, so a decision is answered and acted on
        only once it is on disk. With `always=False` an event that changes nothing is not
        journaled (ticks, polls). Returns False if the nonce was a replay; `JournalUnavailable`
        when the journal cannot be written.
        """
        writer = self.writer
        if writer is None:
            raise RuntimeError("Coordinator.start() was not called")
        async with self._lock:
            old = self.state
            new, actions = step(old, event)
            changed = _changed(old, new, event)
            if not always and not actions and _same(new, old, changed):
                return True
            try:
                seq, stored, committed = writer.record(
                    event, actions, nonce, durable=not transient(event, actions)
                )
            except KeyError:
                return False
            self.state = new
            self._seq = seq
            if (new.outage is None) != (old.outage is None):
                _log_outage(new.outage, event)
            now = time.monotonic()
            self.stragglers.note_changed(old, new, changed)
            self.stragglers.account(new, now, changed)
            self.stragglers.on_actions(actions, now)
            self._since_compact += 1
            if self._since_compact >= self.compact_every:
                self.compact()
        if committed is not None:
            await committed
        slurm = [s for s in stored if isinstance(s.action, SLURM_ACTIONS)]
        if slurm:
            self._spawn(self._carry_out(slurm))
        return True

    def compact(self) -> None:
        """Snapshot the state and drop the status reports it covers (see the journal); queued
        behind every event it covers, so it lands in their commit or a later one."""
        self._since_compact = 0
        assert self.writer is not None
        done = self.writer.compact(self.state, self._seq)
        upto = self._seq

        def logged(f: asyncio.Future[Any]) -> None:
            if not f.cancelled() and f.exception() is None:
                log.debug("journal compacted at event %d: %d reports dropped", upto, f.result())

        done.add_done_callback(logged)
        self.auth.prune()

    async def attempt(self, action_id: int, outcome: str, detail: str = "") -> None:
        """Journal one attempt at a Slurm action; returns once it is durable."""
        assert self.writer is not None
        await self.writer.attempt(action_id, outcome, detail)

    async def flush(self) -> None:
        """Return once every event applied so far is in the journal on disk."""
        if self.writer is not None:
            await self.writer.flush()

    def admission(self) -> float | None:
        """Seconds a report should wait before it is sent again, when it would only queue
        (see `CoordinatorConfig.max_queue_s`); None when it is taken."""
        backlog = self.writer.backlog_s() if self.writer is not None else 0.0
        late = max(self.loop_lag_s, backlog)
        if late <= self.config.max_queue_s:
            return None
        return min(30.0, max(1.0, 2 * late))

    async def _watch_lag(self, every_s: float = 0.05) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(every_s)
            self.loop_lag_s = max(0.0, loop.time() - start - every_s)

    async def allocation(self, job_id: str) -> tuple[str, ...] | None:
        """The nodes Slurm lists for `job_id` now (all its components); None if it is not
        queued. `SlurmCommandError` when Slurm cannot be asked. Lookups that come together (a
        mass failure's fatal reports) share one Slurm call (`JobLookup`)."""
        found = await self.job_lookup.jobs(job_id)
        if not found:
            self.allocations.pop(job_id, None)
            return None
        # Slurm's order: the straggler monitor maps ranks to nodes by it.
        nodes = tuple(dict.fromkeys(n for i in found for n in job_nodes(i.nodes)))
        self.allocations[job_id] = nodes
        return nodes

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self) -> None:
        if self.writer is None:
            self.writer = GroupWriter(self.journal)
        mode = self.privileges
        log.info("drain mode %s: %s", mode.mode, mode.reason)
        await self.submit(CoordinatorStarted(self.clock(), mode.mode, mode.reason))
        if self._open:
            log.info("resuming %d open Slurm actions from the journal", len(self._open))
            by_event: dict[int, list[StoredAction]] = {}
            for s in self._open:
                by_event.setdefault(s.event_seq, []).append(s)
            for group in by_event.values():
                self._spawn(self._carry_out(group))
        self._spawn(self._timer(self.config.tick_s, self._tick))
        self._spawn(self._watch_lag())
        if self.config.poll_jobs:
            self._spawn(self._timer(self.config.poll_s, self._poll))

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.writer is not None:
            await self.writer.close()  # commits what is queued
            self.writer = None
        self.journal.close()

    async def _timer(self, interval: float, fn: Callable[[], Any]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await fn()
            except Exception:  # a timer must survive a bad poll; the log says why
                log.exception("timer %s failed", getattr(fn, "__name__", fn))

    async def _tick(self) -> None:
        await self.submit(Tick(self.clock()), always=False)

    async def _poll(self) -> None:
        ids = {r.job_id: k for k, r in self.state.replicas.items() if r.job_id}
        if not ids:
            return
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.run_in_executor(None, self.backend.jobs, list(ids))
        except SlurmCommandError as exc:
            if not unreachable(exc):
                raise
            # slurmctld away: nothing learnt, nothing changed; the next poll asks again
            log.warning("job poll: Slurm not answering (%s)", str(exc)[:200])
            return
        listed = {i.base_id for i in infos}
        for job_id in ids:
            if job_id not in listed:
                self.job_states[job_id] = None  # purged by Slurm: it ended a while ago
        for n, info in enumerate(infos):
            if n % 64 == 63:
                await asyncio.sleep(0)  # a poll of 1,000 jobs must not hold reports back
            if info.het_offset != 0 or info.base_id not in ids:
                continue
            self.job_states[info.base_id] = info.state
            nodes = _expand_once(info.nodes)
            self.allocations[info.base_id] = nodes
            event = JobObserved(
                ids[info.base_id], info.base_id, info.restarts, info.state, self.clock(), nodes
            )
            await self.submit(event, always=False)
        if self.spares is not None:
            await spares_on_poll(self)

    def run_over(self) -> str | None:
        """Why the run is over (see `run_over`), or None; the control job ends on it."""
        open_actions = len(self.journal.actions(("decided", "started")))
        return run_over(self.state.replicas.values(), self.job_states, open_actions)

    # -- Slurm actions ------------------------------------------------------------------------

    async def _carry_out(self, group: list[StoredAction]) -> None:
        """Run one decision's Slurm actions in order, each with retries and backoff."""
        for stored in group:
            action = stored.action
            if isinstance(action, Release) and action.delay_s > 0:
                await asyncio.sleep(action.delay_s)
            resumed = stored.status == "started"
            if self.spares is not None and await spares_carry_out(self, stored, resumed):
                continue  # moved into a spare slot, or requeued with the pool's reason
            await self.executor.carry_out(stored, resumed, self.attempt)

    # -- views --------------------------------------------------------------------------------

    def state_view(self) -> dict[str, Any]:
        data = self.state.to_dict()
        reps = data["replicas"]
        data["quorum_id"] = max((r["quorum_id"] for r in reps), default=-1)
        data["participants"] = max((r["participants"] for r in reps), default=0)
        cursors = [r["cursor"] for r in reps if r["cursor"] is not None]
        data["cursor"] = max(cursors) if cursors else None
        data["open_actions"] = len(self.journal.actions(("decided", "started")))
        data["coordinator_started_at"] = self.started_at
        data["refusals"] = self.refusals.snapshot()
        if self.gate_stats is not None:
            data["lighthouse_gate"] = self.gate_stats()
        self.stragglers.account(self.state, time.monotonic())
        if self.spares is not None:
            data["spares"] = self.spares.summary()
        return self.stragglers.view(data)

    async def after_report(self, report: ReplicaReport) -> None:
        """Straggler hook: observe the report; submit the evictions the monitor decides."""
        events = self.stragglers.on_report(report, self.state, time.monotonic(), self.clock())
        for event in events:
            decision = self.stragglers.decisions.get(event.replica)
            log.warning(
                "straggler eviction: replica %d (%s): %s; %s",
                event.replica,
                event.detail,
                decision.evidence if decision else "",
                decision.why if decision else "",
            )
            await self.submit(event)


def _changed(old: RunState, new: RunState, event: Event) -> list[int]:
    """The replicas whose state `event` changed: the policy copies what an event changes and
    shares the rest, so a replica kept its object if and only if it did not change."""
    k = getattr(event, "replica", None)
    if isinstance(event, ReportReceived):
        k = event.report.replica
    if isinstance(k, int):
        return [k] if new.replicas.get(k) is not old.replicas.get(k) else []
    return [k for k, r in new.replicas.items() if old.replicas.get(k) is not r]


def _same(a: RunState, b: RunState, changed: Iterable[int]) -> bool:
    """Equal states, where `changed` (`_changed`) are the replicas whose objects differ: the
    others are shared, so only these are compared (a 1,000-replica run ticks every second,
    and polls compare once per job)."""
    if (a.drained is not b.drained and a.drained != b.drained) or a.outage != b.outage:
        return False
    if len(a.replicas) != len(b.replicas):
        return False
    return all(a.replicas.get(k) == b.replicas.get(k) for k in changed)


def _log_outage(outage: dict[str, Any] | None, event: Event) -> None:
    """One line when mass silence begins and one when it ends (the journal has them as notes)."""
    if outage is not None:
        log.error(
            "control plane problem: %d of %d replicas went silent at once; nothing is drained "
            "or requeued for silence until their reports come back (check this node's network "
            "and load, and who else connects to the coordinator's port)",
            len(outage["silent"]),
            outage["watched"],
        )
    else:
        log.warning("control plane: reports are back at %.0f; mass silence is over", event.at)


@functools.lru_cache(maxsize=4096)
def _expand_once(nodes: str) -> tuple[str, ...]:
    """`job_nodes`, remembered: every poll sees the same hostlists again."""
    return tuple(job_nodes(nodes))
