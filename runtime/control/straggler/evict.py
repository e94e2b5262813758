"""The evict-or-tolerate decision for a detected straggler, as a pure function.

The decision (`decide`) evicts only when the measured run-wide slowdown times the expected
remaining time exceeds the measured cost of a requeue (the median of this run's own past
requeues, else the configured estimate); within a per-run cap; never when that would leave fewer
than `min_replicas` participating, or while another eviction is still in flight. An eviction is
the control plane's tier-2 path (requeue the replica's job) with the drain reason
`fthsdp: straggler: <node> <factor>x`, or with the node only excluded for this run.

"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any, Literal

from runtime.control.straggler.detect import StragglerVerdict
from slurm.backend import drain_reason

EvictionMode = Literal["drain", "exclude", "report"]
DecisionAction = Literal["evict", "report"]


@dataclass(frozen=True)
class EvictionConfig:
    mode: EvictionMode = "drain"
    max_evictions: int = 2
    min_replicas: int = 1
    #: Used until this run has measured a requeue of its own (fault -> replacement participating).
    requeue_cost_estimate_s: float = 120.0

    def __post_init__(self) -> None:
        if self.mode not in ("drain", "exclude", "report"):
            raise ValueError(f"mode must be drain, exclude or report, got {self.mode!r}")
        if self.max_evictions < 0 or self.min_replicas < 1 or self.requeue_cost_estimate_s < 0:
            raise ValueError("max_evictions >= 0, min_replicas >= 1, requeue cost >= 0")


@dataclass(frozen=True)
class RunContext:
    """What the decision needs to know about the run right now."""

    #: Replicas currently participating (training or healing; not requeued, pending or out).
    participants: int
    evictions_so_far: int = 0
    #: An eviction (or any requeue) is still in flight: act on one straggler at a time.
    eviction_in_flight: bool = False
    #: Durations of this run's past requeues, fault -> replacement participating (seconds).
    past_requeue_costs_s: tuple[float, ...] = ()
    #: Steps left in the run, when the run has a step budget.
    remaining_steps: int | None = None
    #: The run's current step time (everyone waits for the straggler); median over replicas.
    run_step_time_s: float | None = None
    #: Other replicas recovering now (starting, healing, or training again for less than
    #: `recovery_hold_s`): their recovery loads the machines and every step waits for them.
    recovering: tuple[int, ...] = ()


@dataclass(frozen=True)
class StragglerDecision:
    replica: int
    action: DecisionAction
    node: str | None
    factor: float | None
    #: Drain the node (mode "drain"); else the node is only excluded for this run.
    drain: bool = False
    reason: str = ""
    why: str = ""
    slowdown: float | None = None
    remaining_s: float | None = None
    gain_s: float | None = None
    cost_s: float | None = None
    #: What the verdict rests on (`evidence`): for the log line and the state view.
    evidence: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def requeue_cost(ctx: RunContext, config: EvictionConfig) -> float:
    """The run's own measured requeue cost (median), else the configured estimate."""
    if ctx.past_requeue_costs_s:
        return float(statistics.median(ctx.past_requeue_costs_s))
    return config.requeue_cost_estimate_s


def run_slowdown(verdict: StragglerVerdict, run_step_time_s: float | None) -> float | None:
    """Fraction by which the straggler lengthens the run's steps: (T_now - T_normal) / T_normal.

    The excess is the straggler's compute time over its peers' median; `T_now` is the run's
    measured step time, but never less than the straggler's compute (a replica's reported step
    time may leave out the time it waited for the straggler at the quorum), and `T_normal` is
    `T_now` minus the excess.
    """
    if verdict.compute_s is None or verdict.peer_median_s is None:
        return None
    excess = max(0.0, verdict.compute_s - verdict.peer_median_s)
    step = max(run_step_time_s or 0.0, verdict.compute_s)
    return excess / (step - excess) if step > excess else None


def evidence(verdict: StragglerVerdict) -> str:
    """One line of what a verdict rests on: `4.1x over 22 steps in 9s (compute 0.410s, peers
    0.100s)`. An eviction's reason names the factor only; an operator asking why a replica was
    evicted (and a test whose run evicted one it did not expect) needs the window and the times
    behind it."""
    parts = [f"{verdict.factor or 0.0:.1f}x"]
    if verdict.steps is not None:
        parts.append(f"over {verdict.steps} steps in {verdict.duration_s or 0.0:.0f}s")
    times = []
    if verdict.compute_s is not None:
        times.append(f"compute {verdict.compute_s:.3f}s")
    if verdict.peer_median_s is not None:
        times.append(f"peers {verdict.peer_median_s:.3f}s")
    if verdict.since_step is not None:
        times.append(f"since step {verdict.since_step}")
    text = " ".join(parts)
    return f"{text} ({', '.join(times)})" if times else text


def decide(
    verdict: StragglerVerdict, ctx: RunContext, config: EvictionConfig | None = None
) -> StragglerDecision:
    """Evict a straggler when that pays, else report it; `verdict` must be a straggler's."""
    config = config or EvictionConfig()
    factor = verdict.factor
    node = verdict.slow_node
    base = StragglerDecision(verdict.replica, "report", node, factor, evidence=evidence(verdict))

    def report(why: str, **kw: Any) -> StragglerDecision:
        return replace(base, why=why, **kw)

    if verdict.state != "straggler":
        return report(f"not a straggler ({verdict.state})")
    if config.mode == "report":
        return report("eviction disabled (mode=report)")
    if node is None:
        return report("slow node unknown (no per-rank times or layout)")
    if ctx.recovering:
        who = ", ".join(map(str, ctx.recovering))
        return report(f"holding off: replica {who} is recovering")
    if ctx.eviction_in_flight:
        return report("another eviction or requeue is in flight")
    if ctx.evictions_so_far >= config.max_evictions:
        return report(f"eviction cap reached ({ctx.evictions_so_far}/{config.max_evictions})")
    if ctx.participants - 1 < config.min_replicas:
        return report(
            f"evicting would leave {ctx.participants - 1} < min_replicas={config.min_replicas}"
        )
    slowdown = run_slowdown(verdict, ctx.run_step_time_s)
    cost = requeue_cost(ctx, config)
    if slowdown is None or ctx.remaining_steps is None:
        return report("slowdown or remaining time unknown", slowdown=slowdown, cost_s=cost)
    step_s = max(ctx.run_step_time_s or 0.0, verdict.compute_s or 0.0)
    normal_step_s = step_s / (1.0 + slowdown)
    remaining_s = max(0, ctx.remaining_steps) * normal_step_s
    gain = slowdown * remaining_s
    base = replace(base, slowdown=slowdown, remaining_s=remaining_s, gain_s=gain, cost_s=cost)
    if gain <= cost:
        return report(f"does not pay: {gain:.0f}s lost <= {cost:.0f}s requeue")
    shown = factor if factor is not None else 1.0 + slowdown
    return replace(
        base,
        action="evict",
        drain=config.mode == "drain",
        reason=drain_reason("straggler", f"{node} {shown:.1f}x"),
        why=f"pays: {gain:.0f}s lost > {cost:.0f}s requeue",
    )
