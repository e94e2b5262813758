"""Reliability formulas: how often a system fails, and how often to checkpoint against it.

One home for the laws that both the simulator and the worker's checkpointer use, so the two never
disagree on a formula. A series system of N identical parts fails N times as often as one part
(ml-systems vol. 2, ch. 7), and an MTBF is the inverse of a failure rate. The checkpoint interval
that balances write cost against redone work is Daly's higher-order refinement of Young's
sqrt(2 * T_write * MTBF): Young's first-order law overestimates the interval once the write
time is not negligible against the MTBF. The simulator uses it to pick a checkpoint interval when
none is given; the worker's checkpointer sets its cadence with it, against the rate at which
the whole run's state is lost (`run_loss_mtbf_s`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slurm import contract
from slurm.errors import InputError

SECONDS_PER_DAY = 86_400.0


def cluster_mtbf_hours(component_mtbf_hours: float, components: int) -> float:
    """MTBF of a series system of `components` identical parts: MTBF_part / N."""
    if not component_mtbf_hours > 0:
        raise InputError("component_mtbf_hours", component_mtbf_hours, "must be > 0")
    if components < 1:
        raise InputError("components", components, "must be >= 1")
    return component_mtbf_hours / components


def mtbf_from_rate_s(failures_per_s: float) -> float:
    """Mean time between failures for a failure rate: 1 / rate, infinite for a rate of 0."""
    return math.inf if failures_per_s == 0 else 1.0 / failures_per_s


def run_loss_mtbf_s(
    node_failures_per_s: float,
    replicas: int,
    replica_restart_s: float,
    correlated_per_s: float = 0.0,
    correlated_span: int | None = None,
) -> float:
    """Mean time between events that lose every replica's state at once (a restore from disk).

    With one replica every node failure does. With R replicas an independent node failure loses
    the run only when every other replica is already out: rate ~ lambda * rho**(R-1), rho the
    chance that a replica is out (first-order; a replica fails at lambda / R and is out for
    `replica_restart_s`). A correlated event (a power or cooling loss, a rack) that takes out
    `correlated_span` replicas (default: all) needs only the R - span others out.
    """
    if replicas < 1:
        raise InputError("replicas", replicas, "must be >= 1")
    for name, value in (
        ("node_failures_per_s", node_failures_per_s),
        ("replica_restart_s", replica_restart_s),
        ("correlated_per_s", correlated_per_s),
    ):
        if not 0 <= value < math.inf:
            raise InputError(name, value, "must be a finite number >= 0")
    span = replicas if correlated_span is None else min(correlated_span, replicas)
    if replicas == 1:
        return mtbf_from_rate_s(node_failures_per_s + correlated_per_s)
    x = node_failures_per_s / replicas * replica_restart_s
    rho = x / (1.0 + x)
    loss_rate = node_failures_per_s * rho ** (replicas - 1) + correlated_per_s * rho ** (
        replicas - span
    )
    return mtbf_from_rate_s(loss_rate)


def young_daly_interval_s(write_s: float, mtbf_s: float) -> float:
    """The compute time between checkpoints, in seconds: Daly's higher-order approximation.

    tau = sqrt(2 * d * M) * (1 + sqrt(d / (2M)) / 3 + d / (9 * 2M)) - d for a write time d below
    2M, else M (Daly 2006), with Young's sqrt(2 * d * M) as its leading term. An infinite MTBF
    (no failures) gives an infinite interval: never checkpoint.
    """
    if write_s < 0 or math.isnan(write_s):
        raise InputError("checkpoint_write_s", write_s, "must be >= 0")
    if not mtbf_s > 0:
        raise InputError("mtbf_s", mtbf_s, "must be > 0")
    if math.isinf(mtbf_s):
        return math.inf
    if write_s >= 2 * mtbf_s:
        return mtbf_s
    x = write_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * write_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - write_s


@dataclass(frozen=True)
class RunFailureModel:
    """What a run expects to fail: the input of its default checkpoint cadence.

    The defaults are the env contract's (`slurm.contract`), which the spec's `train.*` share.
    """

    nodes: int = 1
    failures_per_1000_nodes_day: float = contract.DEFAULT_NODE_FAILURES_PER_1000_DAY
    run_losses_per_day: float = contract.DEFAULT_RUN_LOSSES_PER_DAY
    requeue_cost_s: float = contract.DEFAULT_REQUEUE_COST_S

    def run_loss_mtbf_s(self, replicas: int) -> float:
        return run_loss_mtbf_s(
            self.nodes * self.failures_per_1000_nodes_day / 1000.0 / SECONDS_PER_DAY,
            replicas,
            self.requeue_cost_s,
            self.run_losses_per_day / SECONDS_PER_DAY,
        )
