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
