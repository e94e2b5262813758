"""Reliability formulas: how often a system fails, and how often to checkpoint against it.

One home for the laws that both the simulator and the worker's checkpointer use, so the two never
disagree on a formula. A series system of N identical parts fails N times as often as one part
(ml-systems vol. 2, ch. 7), and an MTBF is the inverse of a failure rate. The checkpoint interval
that balances write cost against redone work is Daly's higher-order refinement of Young's
sqrt(2 * T_write * MTBF): Young's first-order law overestimates the interval once the write
time is not negligible against the MTBF. The simulator uses it to pick a checkpoint interval when
none is given; the checkpointer logs it as a suggestion after each save.
"""

from __future__ import annotations

import math

from slurm.errors import InputError


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
