"""The simulator's inputs: component costs of a failure, the failure rate and the job's shape.

Every figure the paper reports as an outcome (44 % / 80 % effective training time, 10 min / 3 min
stall per failure) is deliberately *absent* here: the model only gets the costs of the steps a
recovery goes through (detection, Slurm allocation, NCCL initialisation, checkpoint load or peer
state fetch, the slow first step) and how often hardware fails, and the outcomes have to come out
of the simulation. `PRESETS["paper-100k"]` holds the paper's component figures
(docs/design-facts.md), with the midpoint of each range the paper gives; the few costs the paper
does not state (detection, checkpoint load, checkpoint write, quorum timeout) are marked as
assumptions in `notes`.

`SimParams.validated()` is the one place bad input is rejected, with `slurm.errors.InputError`
naming the field, so the CLI and library callers get the same one-line error.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from runtime.sim.control import MEASURED_REPORT_COST_S, ControlLoad, control_load
from runtime.sim.reliability import (
    SECONDS_PER_DAY,
    mtbf_from_rate_s,
    run_loss_mtbf_s,
    young_daly_interval_s,
)
from slurm import contract
from slurm.errors import InputError

#: What a spare slot holds (`SimParams.spare_kind`).
SPARE_KINDS = ("cold", "warm")


def power_law_interpolate(
    n: float, anchors: tuple[tuple[float, float], tuple[float, float]]
) -> float:
    """Interpolate (and extrapolate) a cost through two (size, seconds) anchors on a log-log line.

    NCCL initialisation grows faster than linearly with the number of ranks (17 s at 16K GPUs,
    200 s at 98K in the paper). A straight line through those two points goes negative below
    ~14K GPUs, which a replica of 8K GPUs would hit; a power law stays positive and passes
    through both anchors exactly.
    """
    (n0, s0), (n1, s1) = anchors
    if n <= 0:
        raise InputError("gpus", n, "must be > 0")
    exponent = math.log(s1 / s0) / math.log(n1 / n0)
    return s0 * (n / n0) ** exponent


@dataclass(frozen=True)
class SimParams:
    """One simulated configuration. Times are seconds unless the name says otherwise."""

    gpus: int = 98_304
    gpus_per_node: int = 8
    replicas: int = 12
    # Independent node failures: failures per 1000 nodes per day (Llama 3 reported ~2.3 at 32K).
    failures_per_1000_nodes_day: float = contract.DEFAULT_NODE_FAILURES_PER_1000_DAY
    # Correlated failures: events per day for the whole job, each taking out a rack that spans
    # `rack_span_replicas` replicas (1 when replicas are rack-aligned, more when striped).
    rack_failures_per_day: float = 0.0
    rack_span_replicas: int = 1
    detection_s: float = 30.0
    alloc_partial_s: float = 30.0
    alloc_full_s: float = 240.0
    nccl_anchors: tuple[tuple[float, float], tuple[float, float]] = (
        (16_384, 17.0),
        (98_304, 200.0),
    )
    checkpoint_load_s: float = 60.0
    catchup_s: float = 20.0
    first_step_s: float = 180.0
    step_s: float = 20.0
    quorum_stall_s: float = 60.0
    checkpoint_write_s: float = 20.0
    checkpoint_interval_s: float | None = None  # None: Young/Daly per mode
    # The control plane: each reporter (a replica's leader, or each node with per-node
    # watchdogs) reports every `report_interval_s`; one report costs the coordinator
    # `report_cost_s` (runtime.sim.control, measured by benchmarks/control_load.py).
    report_interval_s: float = 1.0
    reporters_per_replica: int = 1
    report_cost_s: float = MEASURED_REPORT_COST_S
    # Replacement capacity (docs/simulator.md, "Hot spares"). `queue_wait_s`: mean wait
    # (exponential) for nodes when a failed replica has to go back to the queue of a busy
    # cluster; 0 = nodes are free at once (the paper's "partial reallocation in 20-40 s").
    # `spare_nodes`: nodes held idle by the run, in whole replicas (slots of nodes/replicas);
    # a replica moves into a free slot in `spare_move_s` instead of `alloc_partial_s` + the
    # wait, and the used slot is refilled through the queue (alloc_partial_s + a wait).
    queue_wait_s: float = 0.0
    spare_nodes: int = 0
    spare_move_s: float = 2.0
    # A cold slot holds the nodes only: after the move the replica's processes start there (its
    # own NCCL communicators at replica scale, then the catch-up). A warm slot runs them already,
    # communicators made, waiting for a replica to take over: only the catch-up is left.
    spare_kind: str = "cold"
    days: float = 30.0
    runs: int = 100
    seed: int = 0
    notes: dict[str, str] = field(default_factory=dict, compare=False)

    # ---- derived figures -------------------------------------------------------------------
    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    @property
    def replica_gpus(self) -> int:
        return self.gpus // self.replicas

    @property
    def spare_slots(self) -> int:
        """Whole-replica slots the spare nodes make (a slot replaces a whole replica)."""
        return self.spare_nodes // max(self.nodes // self.replicas, 1)

    @property
    def horizon_s(self) -> float:
        return self.days * SECONDS_PER_DAY

    @property
    def node_failure_rate_per_s(self) -> float:
        return self.failures_per_1000_nodes_day / 1000.0 / SECONDS_PER_DAY

    @property
    def failure_rate_per_s(self) -> float:
        """Rate of failure events hitting the job (independent node failures plus rack events)."""
        return (
            self.nodes * self.node_failure_rate_per_s + self.rack_failures_per_day / SECONDS_PER_DAY
        )

    @property
    def job_mtbf_s(self) -> float:
        return mtbf_from_rate_s(self.failure_rate_per_s)

    @property
    def first_step_excess_s(self) -> float:
        """What the slow first step after a (re)start costs beyond a normal step."""
        return max(self.first_step_s - self.step_s, 0.0)

    def nccl_init_s(self, gpus: int) -> float:
        return power_law_interpolate(gpus, self.nccl_anchors)

    def replica_restart_s(self) -> float:
        """Failure to rejoin for one replica while peers train: partial allocation, peer fetch."""
        return (
            self.detection_s
            + self.alloc_partial_s
            + self.nccl_init_s(self.replica_gpus)
            + self.catchup_s
        )

    def job_restart_s(self) -> float:
        """Failure to restart for the whole job from its checkpoint: full allocation, load.

        Replicas initialise their communicators in parallel, so NCCL init is at replica scale;
        with one replica that is the job's scale (the synchronous case).
        """
        return (
            self.detection_s
            + self.alloc_full_s
            + self.nccl_init_s(self.replica_gpus)
            + self.checkpoint_load_s
        )

    def job_loss_mtbf_s(self) -> float:
        """Mean time between events that lose the whole job's state (roll back to a checkpoint):
        `reliability.run_loss_mtbf_s` with rack events as the correlated ones."""
        return run_loss_mtbf_s(
            self.nodes * self.node_failure_rate_per_s,
            self.replicas,
            self.replica_restart_s(),
            self.rack_failures_per_day / SECONDS_PER_DAY,
            self.rack_span_replicas,
        )

    def checkpoint_interval_for(self, replicas: int) -> float:
        """The training time between checkpoints: given, or Young/Daly for this mode's MTBF."""
        if self.checkpoint_interval_s is not None:
            return self.checkpoint_interval_s
        mtbf = dataclasses.replace(self, replicas=replicas).job_loss_mtbf_s()
        if math.isinf(mtbf):
            return math.inf
        return young_daly_interval_s(self.checkpoint_write_s, mtbf)

    def control_load(self, replicas: int | None = None) -> ControlLoad:
        """What this configuration (with `replicas`, default its own) asks of one coordinator."""
        return control_load(
            replicas or self.replicas,
            self.reporters_per_replica,
            self.report_interval_s,
            self.report_cost_s,
        )

    def with_changes(self, **changes: Any) -> SimParams:
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("notes")
        out["nccl_anchors"] = [list(a) for a in self.nccl_anchors]
        out["job_mtbf_s"] = self.job_mtbf_s if math.isfinite(self.job_mtbf_s) else None
        return out

    # ---- validation ------------------------------------------------------------------------
    def validated(self) -> SimParams:
        """Return self, or raise InputError naming the first bad field."""
        _positive_int("gpus", self.gpus)
        _positive_int("gpus_per_node", self.gpus_per_node)
        _positive_int("replicas", self.replicas)
        _positive_int("runs", self.runs)
        _positive_int("rack_span_replicas", self.rack_span_replicas)
        _positive_int("reporters_per_replica", self.reporters_per_replica)
        for name in ("report_interval_s", "report_cost_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise InputError(name, value, "must be a finite number > 0")
        if self.gpus % self.gpus_per_node:
            raise InputError(
                "gpus", self.gpus, f"must be a multiple of gpus_per_node={self.gpus_per_node}"
            )
        if self.replicas > self.nodes or self.nodes % self.replicas:
            raise InputError(
                "replicas",
                self.replicas,
                f"must divide the job's {self.nodes} nodes into whole-node replicas",
            )
        for name in (
            "failures_per_1000_nodes_day",
            "rack_failures_per_day",
            "detection_s",
            "alloc_partial_s",
            "alloc_full_s",
            "checkpoint_load_s",
            "catchup_s",
            "first_step_s",
            "step_s",
            "quorum_stall_s",
            "checkpoint_write_s",
            "queue_wait_s",
            "spare_move_s",
        ):
            _non_negative(name, getattr(self, name))
        if self.spare_kind not in SPARE_KINDS:
            raise InputError("spare_kind", self.spare_kind, f"one of {', '.join(SPARE_KINDS)}")
        if isinstance(self.spare_nodes, bool) or not isinstance(self.spare_nodes, int):
            raise InputError("spare_nodes", self.spare_nodes, "must be a whole number >= 0")
        if self.spare_nodes < 0:
            raise InputError("spare_nodes", self.spare_nodes, "must be a whole number >= 0")
        if not (self.days > 0 and math.isfinite(self.days)):
            raise InputError("days", self.days, "must be > 0")
        if self.checkpoint_interval_s is not None and not self.checkpoint_interval_s > 0:
            raise InputError("checkpoint_interval_s", self.checkpoint_interval_s, "must be > 0")
        for i, (n, s) in enumerate(self.nccl_anchors):
            if not (n > 0 and s > 0):
                raise InputError(f"nccl_anchors[{i}]", (n, s), "sizes and seconds must be > 0")
        if self.nccl_anchors[0][0] == self.nccl_anchors[1][0]:
            raise InputError("nccl_anchors", self.nccl_anchors, "needs two different sizes")
        if self.seed < 0:
            raise InputError("seed", self.seed, "must be >= 0")
        return self


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(name, value, "must be a whole number >= 1")


def _non_negative(name: str, value: float) -> None:
    if not (value >= 0 and math.isfinite(value)):
        raise InputError(name, value, "must be a finite number >= 0")


def failures_per_1000_nodes_day_from_mtbf(mtbf_minutes: float, nodes: int) -> float:
    """Turn "the job sees a failure every M minutes" into a per-node rate."""
    if not (mtbf_minutes > 0 and math.isfinite(mtbf_minutes)):
        raise InputError("mtbf_minutes", mtbf_minutes, "must be a finite number > 0")
    per_day = 1440.0 / mtbf_minutes
    return per_day / nodes * 1000.0


_PAPER_NODES = 98_304 // 8

PRESETS: dict[str, SimParams] = {
    "paper-100k": SimParams(
        gpus=98_304,
        gpus_per_node=8,
        replicas=12,
        # "a failure every ~18 minutes at ~100K GPUs", expressed per node so --gpus rescales it.
        failures_per_1000_nodes_day=failures_per_1000_nodes_day_from_mtbf(18.0, _PAPER_NODES),
        detection_s=30.0,
        alloc_partial_s=30.0,  # paper: 20-40 s
        alloc_full_s=240.0,  # paper: 3-5 min
        nccl_anchors=((16_384, 17.0), (98_304, 200.0)),  # paper
        checkpoint_load_s=60.0,
        catchup_s=20.0,  # paper: a peer fetch is kept under one step
        first_step_s=180.0,  # paper: 2-4 min
        step_s=20.0,  # paper: ~20 s per step at this scale
        quorum_stall_s=60.0,  # a torchft-style 60 s timeout before the quorum moves on
        checkpoint_write_s=20.0,  # blocking part of a checkpoint write (one step's worth)
        notes={
            "assumed": "detection_s, checkpoint_load_s, checkpoint_write_s, quorum_stall_s",
            "source": "arXiv 2602.00277 (docs/design-facts.md, headline figures)",
        },
    ),
}


def params_from_options(
    preset: str | None = "paper-100k",
    *,
    mtbf_minutes: float | None = None,
    failures_per_1000_nodes_day: float | None = None,
    **overrides: Any,
) -> SimParams:
    """A preset with the given fields replaced; the failure rate as a job MTBF or a node rate.

    `overrides` left at None keep the preset's value. `mtbf_minutes` is the mean time between
    failures of the whole job at its (possibly overridden) size; it is stored as a per-node rate.
    """
    if preset is None:
        base = SimParams()
    elif preset in PRESETS:
        base = PRESETS[preset]
    else:
        raise InputError("preset", preset, f"one of: {', '.join(sorted(PRESETS))}")
    if mtbf_minutes is not None and failures_per_1000_nodes_day is not None:
        raise InputError(
            "mtbf_minutes", mtbf_minutes, "give either it or failures_per_1000_nodes_day, not both"
        )
    p = base.with_changes(**{k: v for k, v in overrides.items() if v is not None})
    if failures_per_1000_nodes_day is not None:
        p = p.with_changes(failures_per_1000_nodes_day=failures_per_1000_nodes_day)
    p = p.validated()
    if mtbf_minutes is not None:
        rate = failures_per_1000_nodes_day_from_mtbf(mtbf_minutes, p.nodes)
        p = p.with_changes(failures_per_1000_nodes_day=rate).validated()
    return p
