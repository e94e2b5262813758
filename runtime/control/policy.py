"""The recovery policy: from the run's state and one event, the actions to take.

This is the decision half of the path failure -> report -> policy -> Slurm action, kept pure so
it can be tested by tables and replayed from the journal after a coordinator restart: `step`
copies the state, applies one event and returns the new state with the actions; nothing here
does I/O or reads a clock (every event carries its own time).

Tiers (docs/design-facts.md, "Recovery tiers"):

1. a process fault on healthy nodes -> the replica job's supervisor relaunches its srun step
   inside the allocation (directive `relaunch`);
2. a node fault, a failed health check, or a replica silent past its report timeout -> drain the
   node with an `fthsdp:` reason, `scontrol requeue` the replica's job and make it eligible at
   once (docs/design-facts.md, Slurm fact 2); the prolog gates the new nodes. When most replicas
   fall silent at once, that is the control plane's outage, not theirs: nothing is done for
   silence until reports come back (`_on_tick`);
3. more than `max_restarts_per_replica` failures inside `restart_window_s` -> leave the replica
   out while `min_replicas` still hold, else back off (exponentially, capped) and try again.

Idempotence is by *epoch*: each failure belongs to one run of a replica, identified by
(Slurm job id, Slurm restart count, supervisor launch number). One decision is made per epoch;
later reports of the same epoch (duplicates, the worker's and the supervisor's report of the same
death, reordered ones) are ignored, and reports of an older epoch are stale. A rise of the job's
restart count that the policy did not ask for is Slurm's own requeue: it is recorded as a failure
and the job is released, but never requeued again. A Requeue action carries the restart count
it was decided at, so the executor can see that Slurm already did it (and skip it) after a race
or a coordinator restart.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from runtime.protocol import ExitCode, ReplicaReport
from slurm.backend import DRAIN_PREFIX, drain_reason
from slurm.drain_request import printable
from slurm.records import NODE_NAME

Phase = Literal[
    "pending", "starting", "training", "healing", "restarting", "requeued", "out", "done", "ended"
]
#: Phases of a replica that will not train again in this run.
FINISHED_PHASES: tuple[Phase, ...] = ("done", "out", "ended")
DirectiveKind = Literal["continue", "relaunch", "requeue", "exit"]
FaultKind = Literal["process", "node", "user"]

#: Slurm job states after which the job will not run again by itself.
_ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")
_MAX_INCARNATIONS = 32


@dataclass(frozen=True)
class PolicyConfig:
    """The run's recovery settings (from the spec's `[train]` section)."""

    replicas: int
    min_replicas: int = 1
    max_restarts_per_replica: int = 5
    restart_window_s: float = 3600.0
    #: A training replica whose leader has not reported for this long is treated as lost.
    report_timeout_s: float = 30.0
    #: A (re)started replica that has not reported for this long is treated as lost.
    start_timeout_s: float = 300.0
    backoff_base_s: float = 5.0
    backoff_max_s: float = 300.0
    drain_on_silence: bool = True


@dataclass
class ReplicaState:
    replica: int
    job_id: str | None = None
    old_jobs: list[str] = field(default_factory=list)
    restarts: int = 0
    launch: int = 0
    phase: Phase = "pending"
    phase_since: float = 0.0
    nodes: list[str] = field(default_factory=list)
    step: int = 0
    cursor: int | None = None
    quorum_id: int = -1
    participants: int = 0
    last_report_at: float | None = None
    #: incarnation -> [job_id, restarts, launch, last seq]
    incarnations: dict[str, list[Any]] = field(default_factory=dict)
    failures: list[float] = field(default_factory=list)
    relaunches: int = 0
    requeues: int = 0
    slurm_requeues: int = 0
    last_failure: str | None = None
    #: The decision taken for the current epoch, if any.
    handled: Literal["relaunch", "requeue", "out", "exit"] | None = None
    directive: DirectiveKind = "continue"
    directive_delay_s: float = 0.0
    #: Nodes this run drained (or asked to drain) under the replica and kept off its job. Each
    #: later release lets Slurm give back those it shows in service again (an operator healed
    #: and resumed them): a replica that met faults on many nodes of a small cluster would
    #: otherwise be shut out of it for good.
    avoided: list[str] = field(default_factory=list)

    @property
    def epoch(self) -> tuple[str | None, int, int]:
        return (self.job_id, self.restarts, self.launch)

    def to_dict(self) -> dict[str, Any]:
        """What `asdict` gives, built by hand: a snapshot and `/v1/state` turn every replica
        into a dict, and the generic recursion cost tens of milliseconds at 2,000 replicas."""
        data = dict(vars(self))
        data["old_jobs"] = list(self.old_jobs)
        data["nodes"] = list(self.nodes)
        data["incarnations"] = {k: list(v) for k, v in self.incarnations.items()}
        data["failures"] = list(self.failures)
        data["avoided"] = list(self.avoided)
        return data

    def __deepcopy__(self, memo: dict[int, Any]) -> ReplicaState:
        """A full copy made by hand: every event copies its replica, and the generic deepcopy
        of these few containers of plain values cost more than the rest of a report."""
        new = object.__new__(ReplicaState)
        new.__dict__.update(self.__dict__)
        new.old_jobs = list(self.old_jobs)
        new.nodes = list(self.nodes)
        new.incarnations = {k: list(v) for k, v in self.incarnations.items()}
        new.failures = list(self.failures)
        new.avoided = list(self.avoided)
        return new


@dataclass
class RunState:
    config: PolicyConfig
    replicas: dict[int, ReplicaState]
    drained: dict[str, str] = field(default_factory=dict)
    #: While most replicas are silent at once (the coordinator's own outage, see `_on_tick`):
    #: {"since": time, "silent": [replicas], "watched": replicas expected to report}.
    outage: dict[str, Any] | None = None

    @classmethod
    def new(cls, config: PolicyConfig, job_ids: dict[int, str] | None = None) -> RunState:
        ids = job_ids or {}
        return cls(
            config=config,
            replicas={
                k: ReplicaState(replica=k, job_id=ids.get(k)) for k in range(config.replicas)
            },
        )

    def active(self) -> int:
        return sum(1 for r in self.replicas.values() if r.phase not in ("out", "done"))

    @classmethod
    def from_dict(cls, config: PolicyConfig, data: dict[str, Any]) -> RunState:
        """A state saved by `to_dict` (a journal snapshot), under the current `config`."""
        state = cls.new(config)
        names = {f.name for f in fields(ReplicaState)}
        for raw in data["replicas"]:
            r = ReplicaState(**{k: v for k, v in raw.items() if k in names})
            if r.replica in state.replicas:
                state.replicas[r.replica] = r
        state.drained = {str(d["node"]): str(d["reason"]) for d in data["drained"]}
        state.outage = data.get("outage")
        return state

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "replicas": [r.to_dict() for _, r in sorted(self.replicas.items())],
            "drained": [{"node": n, "reason": why} for n, why in sorted(self.drained.items())],
            "outage": self.outage,
        }


# -- events -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportReceived:
    report: ReplicaReport
    at: float


@dataclass(frozen=True)
class JobObserved:
    """What `squeue` says about a replica's job (polled by the coordinator)."""

    replica: int
    job_id: str
    restarts: int
    state: str
    at: float
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Tick:
    """Time passes: look for replicas that fell silent."""

    at: float


@dataclass(frozen=True)
class CoordinatorStarted:
    """The coordinator (re)started: silence while it was down is not the replicas' fault."""

    at: float
    #: The drain mode it runs in (`slurm.privileges`), and why: journaled with its start.
    drain_mode: str | None = None
    drain_why: str = ""


@dataclass(frozen=True)
class OperatorRequeue:
    replica: int
    at: float
    drain_node: str | None = None
    reason: str = "requeued by operator"


@dataclass(frozen=True)
class StragglerEviction:
    """The straggler monitor (`runtime.control.straggler`) decided to evict a slow replica.

    Tier 2 without a failure: drain `node` (None = only requeue, the node is not drained) with
    `fthsdp: straggler: <detail>`, requeue the replica's job. Not counted toward tier 3.
    """

    replica: int
    at: float
    node: str | None
    detail: str
    #: Keep the job off this node without draining it (eviction mode "exclude").
    exclude: str | None = None


Event = (
    ReportReceived | JobObserved | Tick | CoordinatorStarted | OperatorRequeue | StragglerEviction
)


# -- actions ----------------------------------------------------------------------------------


#: What a drain asks root's hooks to act on when the coordinator may not drain itself
#: (`slurm.drain_request.KINDS`): the policy's check, with every other check a "fault".
DRAIN_KINDS = {"straggler": "straggler", "silent": "silent", "manual": "operator"}


@dataclass(frozen=True)
class Drain:
    node: str
    reason: str
    replica: int | None = None
    #: The replica's job when decided: without drain rights the request goes into its Comment.
    job_id: str | None = None
    #: `slurm.drain_request.KINDS`: why, for the hooks' policy (see `DRAIN_KINDS`).
    kind: str = "fault"


@dataclass(frozen=True)
class Requeue:
    replica: int
    job_id: str
    #: Slurm's restart count when decided; a higher count at execution means it is done.
    restarts: int
    #: For a replica that fell silent, when it was last heard from: its node may have died
    #: then, and only once Slurm has had time to notice is the node's silence to Slurm proof.
    last_heard: float | None = None


@dataclass(frozen=True)
class Release:
    replica: int
    job_id: str
    delay_s: float = 0.0
    #: Nodes the job must not come back on (a straggler's node in "exclude" mode).
    exclude: tuple[str, ...] = ()
    #: Nodes kept off the job before that may go back to it, once Slurm shows them in service.
    forget: tuple[str, ...] = ()


@dataclass(frozen=True)
class Cancel:
    replica: int
    job_id: str


@dataclass(frozen=True)
class Directive:
    """What the replica's supervisor is told when its step ends."""

    replica: int
    directive: DirectiveKind
    epoch: tuple[str | None, int, int]
    delay_s: float = 0.0


@dataclass(frozen=True)
class Note:
    replica: int | None
    text: str


Action = Drain | Requeue | Release | Cancel | Directive | Note
SLURM_ACTIONS = (Drain, Requeue, Release, Cancel)


# -- the policy -------------------------------------------------------------------------------


def decide(state: RunState, event: Event) -> list[Action]:
    """The actions for `event` in `state` (the state itself is not changed)."""
    return step(state, event)[1]


def step(state: RunState, event: Event) -> tuple[RunState, list[Action]]:
    """Apply one event to a copy of `state`; return the new state and the actions to take."""
    new = _copy_for(state, event)
    return new, apply(new, event)


def _copy_for(state: RunState, event: Event) -> RunState:
    """A copy of what `event` may change: the replicas it concerns (and the drained map), or
    everything for a restart. Copying all replicas for every report and every tick would make
    a 1,000-replica run pay O(replicas) per event."""
    if isinstance(event, CoordinatorStarted):
        return copy.deepcopy(state)
    if isinstance(event, Tick) and state.outage is not None:
        return copy.deepcopy(state)  # an outage that ends resets every replica's silence
    if isinstance(event, Tick):
        touched = [k for k, r in state.replicas.items() if _silence(state.config, r, event.at)]
    else:
        replica = getattr(event, "replica", None)
        if isinstance(event, ReportReceived):
            replica = event.report.replica
        if not isinstance(replica, int):
            return copy.deepcopy(state)
        touched = [replica] if replica in state.replicas else []
    replicas = dict(state.replicas)
    for k in touched:
        replicas[k] = replicas[k].__deepcopy__({})
    # Shared, not copied: the policy replaces the drained map when it adds to it (`_drain`), so
    # a run with thousands of drained nodes does not copy them for every report.
    return RunState(state.config, replicas, state.drained, state.outage)


def apply(new: RunState, event: Event) -> list[Action]:
    """Apply one event to `new` in place (journal replay); returns the actions to take."""
    actions: list[Action] = []
    if isinstance(event, ReportReceived):
        _on_report(new, event, actions)
    elif isinstance(event, JobObserved):
        _on_job(new, event, actions)
    elif isinstance(event, Tick):
        _on_tick(new, event, actions)
    elif isinstance(event, CoordinatorStarted):
        for r in new.replicas.values():
            if r.last_report_at is not None:
                r.last_report_at = max(r.last_report_at, event.at)
            r.phase_since = max(r.phase_since, event.at)
        if event.drain_mode:
            actions.append(Note(None, f"drain mode {event.drain_mode}: {event.drain_why}"))
    elif isinstance(event, OperatorRequeue):
        _on_operator(new, event, actions)
    elif isinstance(event, StragglerEviction):
        _on_straggler(new, event, actions)
    return actions


def classify(report: ReplicaReport) -> FaultKind:
    """Which tier a fatal report calls for."""
    if report.failure == "node" or report.exit_code == ExitCode.NODE_FAULT:
        return "node"
    if report.failure == "process":
        return "process"
    if report.exit_code in (ExitCode.USER_ERROR, ExitCode.BAD_ENV):
        return "user"
    return "process"


def _set_phase(r: ReplicaState, phase: Phase, at: float) -> None:
    if r.phase != phase:
        r.phase = phase
        r.phase_since = at


def _report_epoch(r: ReplicaState, rep: ReplicaReport) -> tuple[str | None, int, int] | None:
    """The epoch a report belongs to, or None if it is from a job this replica left behind."""
    job = rep.job_id or r.job_id
    if job is not None and job in r.old_jobs:
        return None
    known = r.incarnations.get(rep.incarnation)
    if rep.launch is None and rep.restarts is None and known is not None:
        return (known[0], known[1], known[2])
    if job != r.job_id:
        return (job, rep.restarts or 0, rep.launch or 0)
    restarts = rep.restarts if rep.restarts is not None else r.restarts
    if rep.launch is not None:
        return (job, restarts, rep.launch)
    if rep.restarts is not None and rep.restarts != r.restarts:
        return (job, restarts, 0)
    # A worker that does not say its launch: a new incarnation's status report after a decision
    # is the relaunched (or requeued) run; anything else belongs to the current epoch.
    if known is None and rep.kind == "status" and r.handled == "relaunch":
        return (job, r.restarts, r.launch + 1)
    if known is None and rep.kind == "status" and r.handled == "requeue":
        return (job, r.restarts + 1, 0)
    return r.epoch


def _newer(r: ReplicaState, epoch: tuple[str | None, int, int]) -> int:
    """1 if `epoch` is after the replica's current one, 0 if equal, -1 if before."""
    if epoch[0] != r.job_id:
        return 1
    a, b = (epoch[1], epoch[2]), (r.restarts, r.launch)
    return (a > b) - (a < b)


def _enter_epoch(r: ReplicaState, epoch: tuple[str | None, int, int], at: float) -> None:
    if epoch[0] != r.job_id and r.job_id is not None:
        r.old_jobs.append(r.job_id)
    r.job_id, r.restarts, r.launch = epoch
    r.handled = None
    r.directive = "continue"
    r.directive_delay_s = 0.0
    if r.phase not in ("out", "done"):
        _set_phase(r, "starting", at)


def _on_report(state: RunState, ev: ReportReceived, actions: list[Action]) -> None:
    rep = ev.report
    r = state.replicas.get(rep.replica)
    if r is None:
        actions.append(Note(None, f"report for unknown replica {rep.replica} ignored"))
        return
    epoch = _report_epoch(r, rep)
    if epoch is None:
        return
    order = _newer(r, epoch)
    if order < 0:
        return  # a stale report from an earlier run of this replica
    seen = r.incarnations.get(rep.incarnation)
    if seen is not None and (seen[0], seen[1], seen[2]) == epoch and rep.seq <= seen[3]:
        return  # duplicate or reordered-behind report of one incarnation
    if order > 0:
        _enter_epoch(r, epoch, ev.at)
    r.incarnations[rep.incarnation] = [epoch[0], epoch[1], epoch[2], rep.seq]
    if len(r.incarnations) > _MAX_INCARNATIONS:
        r.incarnations.pop(next(iter(r.incarnations)))
    if rep.nodes:
        r.nodes = list(rep.nodes)
    if r.phase in ("out", "done"):
        return
    if rep.kind == "status":
        if r.handled is not None:
            return  # in flight before the failure we already acted on
        # A new incarnation starts from what it restored or healed to, which may be behind the
        # step an earlier one reached (a whole-run loss restores from disk): its step replaces
        # the old one. Within one incarnation a reordered report never moves it back.
        r.step = rep.step if seen is None else max(r.step, rep.step)
        r.cursor = rep.cursor if rep.cursor is not None else r.cursor
        r.quorum_id = rep.quorum_id
        r.participants = rep.participants
        r.last_report_at = ev.at
        _set_phase(r, "healing" if rep.healing else "training", ev.at)
        return
    kind = classify(rep)
    detail = rep.last_error or (rep.evidence[0] if rep.evidence else f"exit {rep.exit_code}")
    if r.handled == "relaunch" and kind == "node":
        # Escalation: the same death turned out to be the node's; requeue instead.
        _failure(state, r, "node", rep.failed_node, detail, ev.at, actions, count=False)
        return
    if r.handled is not None:
        return
    _failure(state, r, kind, rep.failed_node, detail, ev.at, actions)


def _failure(
    state: RunState,
    r: ReplicaState,
    kind: FaultKind,
    node: str | None,
    detail: str,
    at: float,
    actions: list[Action],
    count: bool = True,
    check: str = "fault",
    last_heard: float | None = None,
) -> None:
    cfg = state.config
    r.last_failure = f"{kind}: {detail}"[:200]
    if kind == "user":
        r.handled = "exit"
        _directive(r, "exit", 0.0, actions)
        _set_phase(r, "out", at)
        actions.append(Note(r.replica, f"user error, not restarted: {detail}"))
        return
    if count:
        r.failures = [t for t in r.failures if at - t <= cfg.restart_window_s] + [at]
    recent = len(r.failures)
    delay = 0.0
    if recent > cfg.max_restarts_per_replica:
        if state.active() - 1 >= cfg.min_replicas:
            if kind == "node" and node:
                _drain(state, r, node, check, detail, actions)
            r.handled = "out"
            _directive(r, "exit", 0.0, actions)
            _set_phase(r, "out", at)
            actions.append(
                Note(r.replica, f"left out after {recent} failures in {cfg.restart_window_s:.0f}s")
            )
            return
        over = recent - cfg.max_restarts_per_replica
        delay = min(cfg.backoff_base_s * 2 ** (over - 1), cfg.backoff_max_s)
        actions.append(
            Note(r.replica, f"{recent} failures but min_replicas needs it: back off {delay:.0f}s")
        )
    if kind == "process":
        r.handled = "relaunch"
        r.relaunches += 1
        _directive(r, "relaunch", delay, actions)
        _set_phase(r, "restarting", at)
        return
    _requeue(state, r, node, check, detail, delay, at, actions, last_heard=last_heard)


def _drain(
    state: RunState,
    r: ReplicaState,
    node: str,
    check: str,
    detail: str,
    actions: list[Action],
) -> str | None:
    """Decide the drain of the replica's `node`; returns the Slurm node meant (None: no node of
    the replica's could be named), which its requeued job is also kept off."""
    if node not in r.nodes and r.nodes:
        # A worker may name its host rather than its Slurm node; a one-node replica is unambiguous.
        if len(r.nodes) != 1:
            actions.append(Note(r.replica, f"failed node {node!r} is not one of {r.nodes}"))
            return None
        node = r.nodes[0]
    # The policy chose the kind (`check`); the detail (a leader's text, perhaps a health
    # check's drain reason) is only shown: printable ASCII, and a kind it names is part of it.
    # So no report picks a kind (`manual` is never resumed by itself) or sends escapes to sinfo.
    text = printable(detail)
    if text.startswith(DRAIN_PREFIX):
        text = text[len(DRAIN_PREFIX) :].strip()
    reason = drain_reason(check, text)
    kind = DRAIN_KINDS.get(check, "hung" if text.startswith("hung:") else "fault")
    if state.drained.get(node) != reason:
        state.drained = {**state.drained, node: reason}  # replaced: earlier states share it
        actions.append(Drain(node, reason, r.replica, r.job_id, kind))
    return node if NODE_NAME.fullmatch(node) else None


def _requeue(
    state: RunState,
    r: ReplicaState,
    node: str | None,
    check: str,
    detail: str,
    delay: float,
    at: float,
    actions: list[Action],
    exclude: tuple[str, ...] = (),
    last_heard: float | None = None,
) -> None:
    """Requeue the replica's job; a suspect `node` is drained (or its drain requested) and kept
    off the requeued job in every case: a drain may be refused, or done only later by root's
    Epilog, and the job must not land on that node again meanwhile."""
    if node:
        suspect = _drain(state, r, node, check, detail, actions)
        if suspect is not None and suspect not in exclude:
            exclude = (*exclude, suspect)
        if suspect is not None and suspect not in r.avoided:
            r.avoided.append(suspect)
    r.handled = "requeue"
    r.requeues += 1
    _directive(r, "requeue", delay, actions)
    if r.job_id is None:
        actions.append(Note(r.replica, "node fault but the job id is unknown: cannot requeue"))
    else:
        actions.append(Requeue(r.replica, r.job_id, r.restarts, last_heard))
        forget = tuple(n for n in r.avoided if n not in exclude)
        actions.append(Release(r.replica, r.job_id, delay, exclude, forget))
    _set_phase(r, "requeued", at)


def _directive(r: ReplicaState, kind: DirectiveKind, delay: float, actions: list[Action]) -> None:
    r.directive = kind
    r.directive_delay_s = delay
    actions.append(Directive(r.replica, kind, r.epoch, delay))


def _on_job(state: RunState, ev: JobObserved, actions: list[Action]) -> None:
    r = state.replicas.get(ev.replica)
    if r is None or ev.job_id in r.old_jobs:
        return
    if ev.nodes:
        r.nodes = list(ev.nodes)
    slurm_state = ev.state.upper()
    if ev.job_id != r.job_id:
        _enter_epoch(r, (ev.job_id, ev.restarts, 0), ev.at)
    elif ev.restarts < r.restarts:
        return  # an observation older than what we know
    elif ev.restarts > r.restarts:
        ours = r.handled == "requeue"
        was_out = r.phase in ("out", "done")
        _enter_epoch(r, (ev.job_id, ev.restarts, 0), ev.at)
        if not ours and not was_out:
            # Slurm requeued the job by itself (node failure): count it, never requeue again.
            r.slurm_requeues += 1
            r.failures = [t for t in r.failures if ev.at - t <= state.config.restart_window_s]
            r.failures.append(ev.at)
            r.last_failure = f"slurm requeued the job (restart {ev.restarts})"
            actions.append(Note(r.replica, r.last_failure))
            if slurm_state == "PENDING":
                actions.append(Release(r.replica, ev.job_id, forget=tuple(r.avoided)))
    if r.phase in ("out", "done"):
        if r.phase == "out" and slurm_state in ("PENDING", "RUNNING") and r.handled == "out":
            actions.append(Cancel(r.replica, ev.job_id))
            r.handled = "exit"
        return
    if slurm_state == "PENDING" and r.phase not in ("requeued", "pending"):
        _set_phase(r, "pending", ev.at)
    elif slurm_state == "RUNNING" and r.phase in ("pending", "requeued") and r.handled is None:
        _set_phase(r, "starting", ev.at)
    elif slurm_state in _ENDED and r.handled != "requeue":
        _set_phase(r, "done" if slurm_state == "COMPLETED" else "ended", ev.at)


def _silence(cfg: PolicyConfig, r: ReplicaState, at: float) -> float | None:
    """Seconds a replica has been silent past its limit at `at`, or None if it is not."""
    if r.handled is not None:
        return None
    if r.phase in ("training", "healing"):
        since = r.last_report_at if r.last_report_at is not None else r.phase_since
        limit = cfg.report_timeout_s
    elif r.phase in ("starting", "restarting"):
        since = max(r.phase_since, r.last_report_at or 0.0)
        limit = cfg.start_timeout_s
    else:
        return None
    silent = at - since
    return silent if silent > limit else None


def _watched(r: ReplicaState) -> bool:
    """A replica expected to report every few seconds: training, no decision pending."""
    return r.handled is None and r.phase in ("training", "healing")


def _quiet(cfg: PolicyConfig, r: ReplicaState, at: float) -> bool:
    """A watched replica that has not reported for half its report timeout: past the limit
    already, or about to be within the same report-timeout window."""
    if not _watched(r):
        return False
    since = r.last_report_at if r.last_report_at is not None else r.phase_since
    return at - since > cfg.report_timeout_s / 2


def mass_silence(state: RunState, at: float) -> tuple[list[int], int] | None:
    """(quiet replicas, replicas expected to report) when most of them are quiet at once: at
    least 2 and more than half of the training replicas. One leader that stops reporting is
    its node's or its process's fault; most of them stopping within one report-timeout window
    is the coordinator not hearing them (its network, its node, a flood at its port)."""
    cfg = state.config
    watched = [r for r in state.replicas.values() if _watched(r)]
    quiet = [r.replica for r in watched if _quiet(cfg, r, at)]
    if len(quiet) >= 2 and 2 * len(quiet) > len(watched):
        return quiet, len(watched)
    return None


def _on_tick(state: RunState, ev: Tick, actions: list[Action]) -> None:
    """Silence past a replica's timeout is its node's fault (tier 2), unless most replicas
    are silent at once: then it is the control plane's outage, journaled as a note and shown
    in the state (`outage`), and nothing is drained or requeued for silence until reports come
    back. When it ends, every replica's silence counts from then on (as after a restart)."""
    cfg = state.config
    mass = mass_silence(state, ev.at)
    if state.outage is not None:
        if mass is not None:
            return
        lasted = ev.at - float(state.outage["since"])
        still = [k for k in state.outage["silent"] if _quiet(cfg, state.replicas[k], ev.at)]
        state.outage = None
        for r in state.replicas.values():
            if r.last_report_at is not None:
                r.last_report_at = max(r.last_report_at, ev.at)
            r.phase_since = max(r.phase_since, ev.at)
        actions.append(
            Note(
                None,
                f"control plane: reports are back after {lasted:.0f}s of mass silence; "
                f"silence counts again from now (still silent: {still[:16]})",
            )
        )
        return
    silent = {k: _silence(cfg, r, ev.at) for k, r in state.replicas.items()}
    if mass is not None and any(v is not None for v in silent.values()):
        quiet, watched = mass
        state.outage = {"since": ev.at, "silent": quiet, "watched": watched}
        actions.append(
            Note(
                None,
                f"control plane: {len(quiet)} of {watched} replicas silent at once (more than "
                f"{cfg.report_timeout_s / 2:.0f}s): the coordinator's outage, not theirs; "
                "nothing drained or requeued for silence until reports come back",
            )
        )
        return
    for r in state.replicas.values():
        seconds = silent[r.replica]
        if seconds is None:
            continue
        node = r.nodes[0] if (r.nodes and cfg.drain_on_silence) else None
        why = f"no report for {seconds:.0f}s"
        heard = ev.at - seconds
        _failure(state, r, "node", node, why, ev.at, actions, check="silent", last_heard=heard)


def _on_operator(state: RunState, ev: OperatorRequeue, actions: list[Action]) -> None:
    r = state.replicas.get(ev.replica)
    if r is None:
        actions.append(Note(None, f"requeue of unknown replica {ev.replica} ignored"))
        return
    r.last_failure = f"operator: {ev.reason}"
    if r.phase == "out":
        r.phase = "pending"
    _requeue(state, r, ev.drain_node, "manual", ev.reason, 0.0, ev.at, actions)


def _on_straggler(state: RunState, ev: StragglerEviction, actions: list[Action]) -> None:
    r = state.replicas.get(ev.replica)
    if r is None or r.handled is not None or r.phase not in ("training", "healing"):
        where = "unknown" if r is None else f"{r.phase}, handled={r.handled}"
        actions.append(Note(ev.replica, f"straggler eviction skipped ({where})"))
        return
    r.last_failure = f"straggler: {ev.detail}"
    avoid = (ev.exclude,) if ev.exclude else ()
    _requeue(state, r, ev.node, "straggler", ev.detail, 0.0, ev.at, actions, avoid)


def directive_for(
    state: RunState, replica: int, job_id: str | None, restarts: int, launch: int
) -> tuple[DirectiveKind, float]:
    """What a supervisor whose step (job, restarts, launch) ended should do now."""
    r = state.replicas.get(replica)
    if r is None:
        return ("exit", 0.0)
    if r.phase == "out":
        return ("exit", 0.0)
    if (job_id, restarts, launch) == r.epoch and r.handled is not None:
        if r.handled in ("out", "exit"):
            return ("exit", 0.0)
        return (r.directive, r.directive_delay_s)
    if job_id in r.old_jobs or (job_id == r.job_id and (restarts, launch) < (r.restarts, r.launch)):
        return ("exit", 0.0)  # a supervisor from a run that has been superseded
    return ("continue", 0.0)


# -- (de)serialisation for the journal --------------------------------------------------------

_EVENT_TYPES: dict[str, type[Any]] = {
    c.__name__: c
    for c in (
        ReportReceived,
        JobObserved,
        Tick,
        CoordinatorStarted,
        OperatorRequeue,
        StragglerEviction,
    )
}
_ACTION_TYPES: dict[str, type[Any]] = {
    c.__name__: c for c in (Drain, Requeue, Release, Cancel, Directive, Note)
}


def event_to_dict(ev: Event) -> dict[str, Any]:
    if type(ev) is ReportReceived:
        # What `asdict` gives, built directly: a report's fields are plain values and lists of
        # them, and the generic recursion was a tenth of a report's time in the coordinator.
        report = {k: list(v) if type(v) is list else v for k, v in vars(ev.report).items()}
        return {"report": report, "at": ev.at, "type": "ReportReceived"}
    data = asdict(ev)
    data["type"] = type(ev).__name__
    return data


def event_from_dict(data: dict[str, Any]) -> Event:
    data = dict(data)
    cls = _EVENT_TYPES[data.pop("type")]
    if cls is ReportReceived:
        return ReportReceived(ReplicaReport.from_dict(data["report"]), data["at"])
    if cls is JobObserved:
        data["nodes"] = tuple(data.get("nodes", ()))
    event: Event = cls(**data)
    return event


def action_to_dict(action: Action) -> dict[str, Any]:
    data = asdict(action)
    data["type"] = type(action).__name__
    return data


def action_from_dict(data: dict[str, Any]) -> Action:
    data = dict(data)
    cls = _ACTION_TYPES[data.pop("type")]
    if cls is Directive:
        data["epoch"] = tuple(data["epoch"])
    if cls is Release:
        data["exclude"] = tuple(data.get("exclude", ()))
        data["forget"] = tuple(data.get("forget", ()))
    action: Action = cls(**data)
    return action
