"""The coordinator: the control plane's HTTP service that turns leader reports into Slurm actions.

It is the I/O shell around the pure policy (`runtime.control.policy`): requests and timers become
events, each event is stored in the journal together with the actions the policy decided, and
only then are the Slurm actions carried out (drain, requeue, release, cancel) through
`slurm.backend`, in a worker thread, with bounded retries and backoff, each attempt journaled.

Endpoints (aiohttp; no hand-written HTTP):

- `POST /v1/reports`: a `ReplicaReport` signed with that replica's key (derived from
  `run_dir/secret`, see `runtime.protocol`). It must name the replica's current job; the
  nodes it names are checked against Slurm's record of that job's allocation and replaced by it.
  Unsigned, forged, stale, replayed, malformed, oversized, foreign and unknown-replica reports
  get a 4xx, change nothing and are only counted in memory (`runtime.control.guard`).
- `POST /v1/requeue`: a `RequeueRequest` signed with the control key (`fthsdp requeue`).
- `GET /v1/replicas/{k}/directive?job=J&restarts=R&launch=L`: what the replica's supervisor does
  after its srun step ended: `relaunch`, `requeue` (exit; the coordinator requeues the job),
  `exit` (for good) or `continue` (no decision yet). Unsigned: read-only, and a directive
  only tells a supervisor of that very job what the coordinator already decided.
- `GET /v1/state`: the run's state for `fthsdp status`, signed with the control key.
- `GET /metrics`: Prometheus metrics of that state (`runtime.control.metrics`); with a bearer
  token when the control job was given one (`--metrics-token-file`).

Every connection serves one request and sits behind `runtime.control.guard` (header and body
deadlines, a connection cap that evicts half-open connections first).

Stragglers (`runtime.control.straggler.StragglerService`): every accepted report also feeds the
straggler monitor; an eviction it decides goes through the policy as a `StragglerEviction`
event (tier 2: drain with `fthsdp: straggler: <node> <factor>x`, requeue).

Timers: a tick finds replicas silent past their report timeout; a poll reads the replica jobs
from `squeue` so Slurm's own requeues are seen (and never repeated). The service binds to the
job node's address unless told otherwise; it never listens on all interfaces by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import socket
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import hostlist
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from runtime.control.guard import (
    ConnectionGuard,
    GuardConfig,
    GuardedSite,
    Refusals,
    one_request_per_connection,
    raise_open_files,
)
from runtime.control.journal import (
    GroupWriter,
    Journal,
    JournalUnavailable,
    StoredAction,
)
from runtime.control.journal import transient as transient_event
from runtime.control.metrics import aiohttp_handler
from runtime.control.policy import (
    SLURM_ACTIONS,
    Cancel,
    CoordinatorStarted,
    Drain,
    Event,
    JobObserved,
    OperatorRequeue,
    PolicyConfig,
    Release,
    ReplicaState,
    ReportReceived,
    Requeue,
    RunState,
    Tick,
    directive_for,
    step,
)
from runtime.control.spares import SpareManager
from runtime.control.spares import carry_out as spares_carry_out
from runtime.control.spares import on_poll as spares_on_poll
from runtime.control.straggler import EvictionConfig, StragglerConfig, StragglerService
from runtime.protocol import (
    CONTROL_KEY,
    JOB_ID,
    MAX_CLOCK_SKEW_S,
    MAX_INT,
    MAX_REPORT_BYTES,
    ReplicaReport,
    RequeueRequest,
    SignatureError,
    derive_key,
    replica_key_id,
    signed_headers,
    verify,
)
from slurm.backend import CommandBackend, SlurmBackend, SlurmCommandError
from slurm.errors import EnvironmentProblem, InputError
from slurm.rundir import TERMINAL_STATES, create_secret, read_job_ids, read_secret, read_spec_data

log = logging.getLogger("fthsdp.coordinator")

SECRET_FILE = "secret"
RUN_FILE = "run.json"


@dataclass(frozen=True)
class CoordinatorConfig:
    run_dir: Path
    policy: PolicyConfig
    job_ids: dict[int, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 0
    tick_s: float = 1.0
    poll_s: float = 3.0
    poll_jobs: bool = True
    action_retries: int = 5
    action_backoff_s: float = 1.0
    action_backoff_max_s: float = 30.0
    #: The run's step budget (spec `train.steps`): the straggler decision's remaining time.
    total_steps: int | None = None
    #: Straggler detection thresholds, and how an eviction is decided and done (spec
    #: `train.straggler_*`; `min_replicas` is taken from `policy`).
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    eviction: EvictionConfig = field(default_factory=EvictionConfig)
    #: Connection limits and deadlines for every sender (`runtime.control.guard`).
    guard: GuardConfig = field(default_factory=GuardConfig)
    #: When set, `GET /metrics` requires `Authorization: Bearer <token>`.
    metrics_token: str | None = None
    #: Snapshot and compact the journal after this many events (None: 1,000 or 4 per replica).
    compact_every: int | None = None
    #: A report is answered 503 (Retry-After) at once, before its signature is checked, while
    #: the event loop runs this many seconds late or a journal write waits this long: a leader
    #: (2 s timeout) would give up on it anyway, and shedding it drains the backlog.
    max_queue_s: float = 1.0


@dataclass(frozen=True)
class RunSettings:
    policy: PolicyConfig
    job_ids: dict[int, str]
    heartbeat_timeout_ms: int = 2000
    join_timeout_ms: int = 60000
    total_steps: int | None = None
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    eviction: EvictionConfig = field(default_factory=EvictionConfig)


def straggler_config(
    factor: float | None = None, window_steps: int | None = None, window_s: float | None = None
) -> StragglerConfig:
    """Detection thresholds with the given overrides; the clear level never exceeds `factor`."""
    base = StragglerConfig()
    factor = base.factor if factor is None else float(factor)
    try:
        return replace(
            base,
            factor=factor,
            clear_factor=min(base.clear_factor, factor),
            window_steps=base.window_steps if window_steps is None else int(window_steps),
            window_s=base.window_s if window_s is None else float(window_s),
        )
    except ValueError as exc:
        raise InputError("train.straggler_*", str(exc), "factor > 1, positive windows") from None


#: Failures worth retrying: Slurm busy or restarting, a command that timed out.
_TRANSIENT = (
    "Unable to contact",
    "Socket timed out",
    "Connection refused",
    "temporarily",
    "timed out",
)


def transient(exc: SlurmCommandError) -> bool:
    return exc.returncode == -1 or any(t in exc.stderr for t in _TRANSIENT)


#: Policy phases of a replica that will not train again in this run.
_FINISHED_PHASES = ("done", "out", "ended")


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
        if r.phase in _FINISHED_PHASES:
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


def load_run_settings(run_dir: Path) -> RunSettings:
    """The run's recovery settings and replica job ids, from what `fthsdp submit` wrote.

    `spec.json` gives `replicas.count` and the `[train]` knobs; `run.json` (optional, for runs
    not made by `submit`) may hold `replicas` and any other `PolicyConfig` field and wins;
    `jobs.json` maps replicas to job ids (`{"replicas": [{"replica": 0, "job_id": "12"}, ...]}`
    or `{"replicas": {"0": "12"}}`). Without job ids the coordinator learns them from reports.
    """
    settings: dict[str, Any] = {}
    lighthouse: dict[str, Any] = {}  # and total_steps, straggler: RunSettings' keyword fields
    spec = read_spec_data(run_dir)  # checked field by field: a bad file is one line, exit 2
    if spec is not None:
        train = spec.get("train", {})
        settings["replicas"] = int(spec["replicas"]["count"])
        for key in ("min_replicas", "max_restarts_per_replica", "restart_window_s"):
            if key in train:
                settings[key] = train[key]
        for key in ("heartbeat_timeout", "join_timeout"):
            if f"{key}_s" in train:
                lighthouse[f"{key}_ms"] = int(float(train[f"{key}_s"]) * 1000)
        if train.get("steps"):
            lighthouse["total_steps"] = int(train["steps"])
        lighthouse["straggler"] = straggler_config(
            train.get("straggler_factor"),
            train.get("straggler_window_steps"),
            train.get("straggler_window_s"),
        )
        eviction: dict[str, Any] = {}
        if train.get("straggler_requeue_cost_s") is not None:
            eviction["requeue_cost_estimate_s"] = float(train["straggler_requeue_cost_s"])
        if train.get("straggler_mode") in ("drain", "exclude", "report"):
            eviction["mode"] = train["straggler_mode"]
        try:
            lighthouse["eviction"] = EvictionConfig(**eviction)
        except ValueError as exc:
            raise InputError("train.straggler_requeue_cost_s", eviction, str(exc)) from None
    run_file = run_dir / RUN_FILE
    if run_file.exists():
        raw = json.loads(run_file.read_text())
        allowed = {f.name for f in fields(PolicyConfig)}
        settings.update({k: v for k, v in raw.items() if k in allowed})
    if "replicas" not in settings:
        raise InputError("RUN_DIR", str(run_dir), "a run directory with spec.json (or run.json)")
    jobs = read_job_ids(run_dir) or {}
    return RunSettings(PolicyConfig(**settings), jobs, **lighthouse)


def ensure_secret(run_dir: Path) -> bytes:
    """The run secret; created (0600) if missing, refused if others can read it."""
    path = run_dir / SECRET_FILE
    if not path.exists():
        return create_secret(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise EnvironmentProblem(f"{path} has mode {mode:o}; it must be 0600 (chmod 600 {path})")
    return read_secret(path)


def node_address() -> str:
    """This node's own address (what the replicas reach), never the wildcard address."""
    name = socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror:
        return "127.0.0.1"
    return str(infos[0][4][0]) if infos else "127.0.0.1"


class Coordinator:
    """State, journal and Slurm executor of one run's control plane."""

    def __init__(
        self,
        config: CoordinatorConfig,
        backend: SlurmBackend | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.secret = ensure_secret(config.run_dir)
        self.backend: SlurmBackend = backend or CommandBackend(retries=1, timeout=20.0)
        self.clock = clock
        self.journal = Journal.in_run_dir(config.run_dir)
        self.journal.check()
        self.state, open_actions, self._seq = self.journal.rebuild(config.policy, config.job_ids)
        self._open = open_actions
        #: Group commit of the journal (created by `start`, on the running loop).
        self.writer: GroupWriter | None = None
        #: How late the event loop ran its last timer (seconds; `_watch_lag`).
        self.loop_lag_s = 0.0
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self.started_at = clock()
        self.refusals = Refusals(config.guard.log_every_s)
        self._keys: dict[str, bytes] = {}
        #: Nonces of signed GETs (not journaled: a replayed read changes nothing).
        self._read_nonces: dict[str, float] = {}
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
            if not always and not actions and _same(new, old):
                return True
            try:
                seq, stored, committed = writer.record(
                    event, actions, nonce, durable=not transient_event(event, actions)
                )
            except KeyError:
                return False
            self.state = new
            self._seq = seq
            changed = _changed(old, new, event)
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
        self._prune_reads()

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

    def read_nonce_seen(self, nonce: str) -> bool:
        return nonce in self._read_nonces

    def remember_read(self, nonce: str, sent: float) -> None:
        """Keep a signed read's nonce for as long as its signature could be replayed."""
        if len(self._read_nonces) >= 10_000:
            self._prune_reads()
        self._read_nonces[nonce] = sent

    def _prune_reads(self) -> None:
        now = self.clock()
        self._read_nonces = {
            n: t for n, t in self._read_nonces.items() if now - t <= 2 * MAX_CLOCK_SKEW_S
        }

    def key(self, key_id: str) -> bytes:
        found = self._keys.get(key_id)
        if found is None:
            found = self._keys[key_id] = derive_key(self.secret, key_id)
        return found

    async def allocation(self, job_id: str) -> tuple[str, ...] | None:
        """The nodes Slurm lists for `job_id` now (all its components); None if it is not
        queued. `SlurmCommandError` when Slurm cannot be asked."""
        loop = asyncio.get_running_loop()
        infos = await loop.run_in_executor(None, self.backend.jobs, [job_id])
        found = [i for i in infos if i.base_id == job_id]
        if not found:
            self.allocations.pop(job_id, None)
            return None
        # Slurm's order: the straggler monitor maps ranks to nodes by it.
        nodes = tuple(dict.fromkeys(n for i in found for n in _expand(i.nodes)))
        self.allocations[job_id] = nodes
        return nodes

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self) -> None:
        if self.writer is None:
            self.writer = GroupWriter(self.journal)
        await self.submit(CoordinatorStarted(self.clock()))
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
        infos = await loop.run_in_executor(None, self.backend.jobs, list(ids))
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
        loop = asyncio.get_running_loop()
        for stored in group:
            action = stored.action
            if isinstance(action, Release) and action.delay_s > 0:
                await asyncio.sleep(action.delay_s)
            resumed = stored.status == "started"
            if self.spares is not None and await spares_carry_out(self, stored, resumed):
                continue  # moved into a spare slot, or requeued with the pool's reason
            await self.attempt(stored.id, "started", "resumed after restart" if resumed else "")
            for attempt in range(self.config.action_retries):
                try:
                    outcome, detail = await loop.run_in_executor(
                        None, self._execute, action, resumed
                    )
                except (InputError, EnvironmentProblem) as exc:
                    # Refused before Slurm was asked (a bad node name, Slurm not usable):
                    # retrying cannot help.
                    await self.attempt(stored.id, "failed", str(exc))
                    log.error("giving up on %s: %s", action, exc)
                    break
                except SlurmCommandError as exc:
                    if attempt + 1 >= self.config.action_retries or not transient(exc):
                        await self.attempt(stored.id, "failed", str(exc))
                        log.error("giving up on %s: %s", action, exc)
                        break
                    await self.attempt(stored.id, "retry", str(exc))
                    delay = min(
                        self.config.action_backoff_s * 2**attempt,
                        self.config.action_backoff_max_s,
                    )
                    await asyncio.sleep(delay)
                else:
                    await self.attempt(stored.id, outcome, detail)
                    break

    def _execute(self, action: Any, resumed: bool) -> tuple[str, str]:
        """Carry out one Slurm action (in a worker thread); returns (outcome, detail)."""
        b = self.backend
        if isinstance(action, Drain):
            ok = b.drain(action.node, action.reason)
            return ("done", "drained") if ok else ("skipped", "drained by someone else")
        if isinstance(action, Requeue):
            current = _lead(b, action.job_id)
            if current and current[0].restarts > action.restarts:
                return ("skipped", f"already requeued (restart count {current[0].restarts})")
            if current and current[0].state.upper() == "PENDING":
                return ("skipped", "job is pending, nothing to requeue")
            b.requeue(action.job_id)
            return ("done", "requeued" + (" (after restart)" if resumed else ""))
        if isinstance(action, Release):
            # The backend waits for the requeued job to settle back to PENDING first.
            b.release(action.job_id, exclude=action.exclude)
            excluded = f", off {','.join(action.exclude)}" if action.exclude else ""
            return ("done", f"eligible now{excluded}")
        if isinstance(action, Cancel):
            b.cancel([action.job_id])
            return ("done", "cancelled")
        return ("skipped", f"not a Slurm action: {action}")

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
        self.stragglers.account(self.state, time.monotonic())
        if self.spares is not None:
            data["spares"] = self.spares.summary()
        return self.stragglers.view(data)

    async def after_report(self, report: ReplicaReport) -> None:
        """Straggler hook: observe the report; submit the evictions the monitor decides."""
        events = self.stragglers.on_report(report, self.state, time.monotonic(), self.clock())
        for event in events:
            log.warning("straggler eviction: replica %d (%s)", event.replica, event.detail)
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


def _same(a: RunState, b: RunState) -> bool:
    """Equal states, compared field by field (no dict conversion: a 1,000-replica run ticks
    every second, and polls compare once per job)."""
    return a.drained == b.drained and a.replicas == b.replicas


def _expand(nodes: str) -> list[str]:
    """Slurm's hostlist of a job; empty for a pending job (`""`, `"(null)"`, `"None assigned"`)."""
    if not nodes or nodes.startswith("(") or " " in nodes:
        return []
    return list(hostlist.expand_hostlist(nodes))


@functools.lru_cache(maxsize=4096)
def _expand_once(nodes: str) -> tuple[str, ...]:
    """`_expand`, remembered: every poll sees the same hostlists again."""
    return tuple(_expand(nodes))


def _lead(backend: SlurmBackend, job_id: str) -> list[Any]:
    """The squeue record of a job (its het component 0), as a list of at most one."""
    return [j for j in backend.jobs([job_id]) if j.base_id == job_id and j.het_offset == 0][:1]


# -- HTTP ------------------------------------------------------------------------------------

COORDINATOR_KEY = web.AppKey("coordinator", Coordinator)


class _Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _refuse(
    coord: Coordinator,
    request: web.Request,
    status: int,
    reason: str,
    retry_after_s: float | None = None,
) -> web.Response:
    """Answer a refusal; it is counted in memory only (no journal row, no fsync)."""
    coord.refusals.add(f"{status} {request.path}", reason, request.remote)
    headers = {"Retry-After": str(round(retry_after_s))} if retry_after_s is not None else None
    return web.json_response({"error": reason}, status=status, headers=headers)


async def _signed(request: web.Request, coord: Coordinator, keys: str) -> tuple[str, str, bytes]:
    """(key id, nonce, body) of an authentic, fresh, not replayed request signed with a key
    `keys` allows ("control", or "replica" for any replica's own key); `_Refused` otherwise.

    The headers are checked before the body is read, and the body is read under a deadline.
    """
    try:
        key_id, timestamp, _, _ = signed_headers(request.headers)
    except SignatureError as exc:
        raise _Refused(401, str(exc)) from None
    length = request.content_length
    if length is not None and length > MAX_REPORT_BYTES:
        raise _Refused(413, f"body of {length} bytes")
    try:
        body = await asyncio.wait_for(request.read(), coord.config.guard.body_timeout_s)
    except web.HTTPRequestEntityTooLarge:
        raise _Refused(413, "body over the limit") from None
    except TimeoutError:
        raise _Refused(408, "body not received in time") from None
    except (ConnectionError, HttpProcessingError) as exc:
        # The sender went away or sent a broken body: counted, never a traceback in the log.
        raise _Refused(400, f"body not received ({type(exc).__name__})") from None
    try:
        nonce = verify(
            coord.key(key_id),
            request.method,
            request.raw_path,
            body,
            request.headers,
            coord.clock(),
        )
    except SignatureError as exc:
        raise _Refused(401, str(exc)) from None
    allowed = key_id == CONTROL_KEY if keys == "control" else key_id.startswith("replica-")
    if not allowed:
        raise _Refused(403, f"key {key_id} may not call {request.method} {request.path}")
    if coord.read_nonce_seen(nonce) or coord.journal.nonce_seen(nonce):
        raise _Refused(409, "replayed nonce")
    if request.method == "GET":
        coord.remember_read(nonce, int(timestamp))
    return key_id, nonce, body


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise _Refused(400, "body is not JSON") from None
    if not isinstance(data, dict):
        raise _Refused(400, "body is not a JSON object")
    return data


async def _checked_nodes(coord: Coordinator, report: ReplicaReport) -> ReplicaReport:
    """The report with Slurm's allocation of its job as `nodes`, and its `failed_node` one of
    them; `_Refused` if it names a node outside the allocation.

    A fatal report asks Slurm now (it may drain a node); a status report takes the last poll's
    answer (asking once for a job not seen yet), and its own `nodes` are never used.
    """
    job_id = report.job_id
    assert job_id is not None
    if report.kind != "fatal":
        known = coord.allocations.get(job_id)
        if known is None:
            with contextlib.suppress(SlurmCommandError, EnvironmentProblem, OSError):
                known = await coord.allocation(job_id)  # once per job; polls refresh it
                coord.allocations.setdefault(job_id, ())
        return replace(report, nodes=list(known or ()))
    try:
        nodes = await coord.allocation(job_id)
    except SlurmCommandError as exc:
        raise _Refused(503, f"cannot read job {job_id} from Slurm: {exc}") from None
    if nodes is None:
        raise _Refused(409, f"job {job_id} is not in Slurm's queue")
    foreign = sorted(set(report.nodes) - set(nodes))
    if foreign:
        raise _Refused(403, f"nodes {foreign[:3]} are not in job {job_id}'s allocation")
    failed = report.failed_node
    if failed is not None and failed not in nodes:
        # Even for a one-node job: a name outside the allocation is never read as "my node".
        raise _Refused(403, f"node {failed} is not in job {job_id}'s allocation {nodes[:8]}")
    return replace(report, nodes=list(nodes), failed_node=failed)


async def post_report(request: web.Request) -> web.Response:
    coord = request.app[COORDINATOR_KEY]
    retry = coord.admission()
    if retry is not None:
        # Before anything else: a report that would only queue costs one cheap answer.
        return _refuse(coord, request, 503, "coordinator busy", retry)
    try:
        key_id, nonce, body = await _signed(request, coord, "replica")
        try:
            report = ReplicaReport.from_dict(_json_object(body))
        except (ValueError, TypeError) as exc:
            raise _Refused(400, f"malformed report: {exc}") from None
        if key_id != replica_key_id(report.replica):
            raise _Refused(403, f"key {key_id} may not report for replica {report.replica}")
        r = coord.state.replicas.get(report.replica)
        if r is None:
            raise _Refused(404, f"unknown replica {report.replica}")
        if report.job_id is None:
            raise _Refused(400, "malformed report: field 'job_id' is required")
        if report.job_id != r.job_id:
            # A leftover process of an earlier run, or another user's job: it must not steer.
            raise _Refused(409, f"job {report.job_id} is not replica's job {r.job_id}")
        report = await _checked_nodes(coord, report)
    except _Refused as exc:
        return _refuse(coord, request, exc.status, exc.reason)
    try:
        if not await coord.submit(ReportReceived(report, coord.clock()), nonce=nonce):
            return _refuse(coord, request, 409, "replayed nonce")
    except JournalUnavailable as exc:
        return _refuse(coord, request, 503, f"journal unavailable: {exc}", 30.0)
    await coord.after_report(report)
    r = coord.state.replicas[report.replica]
    return web.json_response({"ok": True, "directive": r.directive, "phase": r.phase})


async def post_requeue(request: web.Request) -> web.Response:
    coord = request.app[COORDINATOR_KEY]
    try:
        _, nonce, body = await _signed(request, coord, "control")
        try:
            req = RequeueRequest.from_dict(_json_object(body))
        except (ValueError, TypeError) as exc:
            raise _Refused(400, f"malformed requeue: {exc}") from None
        r = coord.state.replicas.get(req.replica)
        if r is None:
            raise _Refused(404, f"unknown replica {req.replica}")
        if req.drain is not None:
            nodes = None
            if r.job_id is not None:
                try:
                    nodes = await coord.allocation(r.job_id)
                except SlurmCommandError as exc:
                    raise _Refused(503, f"cannot read job {r.job_id}: {exc}") from None
            if not nodes or req.drain not in nodes:
                raise _Refused(
                    403, f"node {req.drain} is not in job {r.job_id}'s allocation {nodes}"
                )
    except _Refused as exc:
        return _refuse(coord, request, exc.status, exc.reason)
    event = OperatorRequeue(req.replica, coord.clock(), req.drain, req.reason[:80])
    try:
        if not await coord.submit(event, nonce=nonce):
            return _refuse(coord, request, 409, "replayed nonce")
    except JournalUnavailable as exc:
        return _refuse(coord, request, 503, f"journal unavailable: {exc}", 30.0)
    return web.json_response({"ok": True, "job_id": coord.state.replicas[req.replica].job_id})


async def get_directive(request: web.Request) -> web.Response:
    coord = request.app[COORDINATOR_KEY]
    try:
        replica = int(request.match_info["k"])
        job = request.query.get("job") or None
        restarts = int(request.query.get("restarts", "0"))
        launch = int(request.query.get("launch", "0"))
        if job is not None and not JOB_ID.fullmatch(job):
            raise ValueError(job)
        if not (0 <= restarts <= MAX_INT and 0 <= launch <= MAX_INT):
            raise ValueError(restarts)
    except ValueError:
        return _refuse(coord, request, 400, "bad replica/job/restarts/launch")
    if replica not in coord.state.replicas:
        return _refuse(coord, request, 404, f"unknown replica {replica}")
    directive, delay = directive_for(coord.state, replica, job, restarts, launch)
    return web.json_response({"directive": directive, "delay_s": delay})


async def get_state(request: web.Request) -> web.Response:
    coord = request.app[COORDINATOR_KEY]
    try:
        _, _, body = await _signed(request, coord, "control")
        if body:
            raise _Refused(400, "GET /v1/state takes no body")
    except _Refused as exc:
        return _refuse(coord, request, exc.status, exc.reason)
    return web.json_response(coord.state_view())


def make_app(coord: Coordinator) -> web.Application:
    app = web.Application(
        client_max_size=MAX_REPORT_BYTES, middlewares=[one_request_per_connection]
    )
    app[COORDINATOR_KEY] = coord
    app.router.add_post("/v1/reports", post_report)
    app.router.add_post("/v1/requeue", post_requeue)
    app.router.add_get("/v1/replicas/{k}/directive", get_directive)
    app.router.add_get("/v1/state", get_state)
    metrics = aiohttp_handler(coord.registry, coord.state_view)
    token = coord.config.metrics_token

    async def get_metrics(request: web.Request) -> web.Response:
        if token is not None:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return _refuse(coord, request, 401, "metrics need the bearer token")
        return await metrics(request)

    app.router.add_get("/metrics", get_metrics)
    return app


@dataclass
class RunningCoordinator:
    coordinator: Coordinator
    runner: web.AppRunner
    url: str

    async def close(self) -> None:
        await self.runner.cleanup()
        await self.coordinator.stop()


async def start_coordinator(
    config: CoordinatorConfig, backend: SlurmBackend | None = None
) -> RunningCoordinator:
    """Start the service on `config.host:config.port` (port 0 = a free one)."""
    coord = Coordinator(config, backend)
    await coord.start()
    runner = web.AppRunner(
        make_app(coord), access_log=None, max_line_size=4096, max_field_size=4096, max_headers=32
    )
    await runner.setup()
    cap = raise_open_files(config.guard.max_connections)
    guard = ConnectionGuard(config.guard, coord.refusals, cap)
    site = GuardedSite(runner, config.host, config.port, guard)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        await coord.stop()
        raise
    port = int(runner.addresses[0][1]) if runner.addresses else config.port
    host = config.host if ":" not in config.host else f"[{config.host}]"
    return RunningCoordinator(coord, runner, f"http://{host}:{port}")
