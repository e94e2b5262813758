"""Closed-form reliability figures the simulator and its users lean on.

These are the textbook's first-order laws (ml-systems vol. 2, ch. 7): a series system of N
identical parts fails N times as often as one part, and the checkpoint interval that balances
write cost against redone work is Young/Daly's square root. The Monte Carlo model uses them to
pick a checkpoint interval when none is given; the tests pin them to the textbook's own numbers
so a unit slip (hours vs seconds) shows up at once.
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


def young_daly_interval_s(write_s: float, mtbf_s: float) -> float:
    """Young/Daly checkpoint interval tau = sqrt(2 * T_write * MTBF), in seconds.

    An infinite MTBF (no failures) gives an infinite interval: never checkpoint.
    """
    if write_s < 0 or math.isnan(write_s):
        raise InputError("checkpoint_write_s", write_s, "must be >= 0")
    if not mtbf_s > 0:
        raise InputError("mtbf_s", mtbf_s, "must be > 0")
    return math.sqrt(2.0 * write_s * mtbf_s)


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


def spare_slots_needed(failures_per_s: float, refill_s: float, availability: float = 0.95) -> int:
    """Spare slots so that a failure finds a free one with probability >= `availability`.

    Each failure takes a slot for as long as its refill waits (allocation + the queue), so the
    slots in use are an M/G/inf queue: Poisson with mean m = lambda * T_refill. The answer is the
    smallest K with P(Poisson(m) <= K - 1) >= availability; close to ceil(m + z * sqrt(m)) + 1
    (z = 1.64 for 95 %), the rule of thumb in docs/simulator.md.
    """
    if not (failures_per_s >= 0 and math.isfinite(failures_per_s)):
        raise InputError("failures_per_s", failures_per_s, "must be a finite number >= 0")
    if not (refill_s >= 0 and math.isfinite(refill_s)):
        raise InputError("refill_s", refill_s, "must be a finite number >= 0")
    if not 0 < availability < 1:
        raise InputError("availability", availability, "must be between 0 and 1 (exclusive)")
    m = failures_per_s * refill_s
    if failures_per_s == 0:
        return 0  # no failure ever needs a slot
    term = math.exp(-m)  # P(Poisson(m) = 0)
    cdf, k = term, 0
    while cdf < availability:
        k += 1
        term *= m / k
        cdf += term
        if k > 100_000:  # pragma: no cover - absurd inputs; the loop must end
            raise InputError("refill_s", refill_s, "needs fewer than 100,000 slots")
    return k + 1
