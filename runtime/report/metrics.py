"""What a recorded metric may be: its name, how many per step, its value.

One set of bounds for both ways a step's scalars reach the report: the native API's
`ft.record(loss=...)` (`runtime.api`, which turns tensors into numbers first) and a foreign
torchft trainer's JSONL progress file, whose lines may carry a `metrics` object. The bounds keep
the progress files and the page small; torch-free, so the report's reader can use them.
"""

from __future__ import annotations

import math
import re
from typing import Any

#: At most this many metrics per step, each named like this.
MAX_METRICS = 16
METRIC_NAME = re.compile(r"[A-Za-z0-9_.]{1,32}")


class MetricError(ValueError):
    """A bad metric: one line naming it, its value and what is allowed."""


def check_metrics(scalars: dict[str, Any], where: str = "ft.record") -> dict[str, float]:
    """`scalars` as plain floats, or `MetricError` (prefixed with `where`) for the first bad
    name or value: at most `MAX_METRICS`, names matching `METRIC_NAME`, finite numbers."""
    if not scalars:
        raise MetricError(f"{where}: no metric given; call it as ft.record(loss=value)")
    if len(scalars) > MAX_METRICS:
        raise MetricError(f"{where}: {len(scalars)} metrics given; at most {MAX_METRICS} per call")
    out: dict[str, float] = {}
    for name, value in scalars.items():
        if not isinstance(name, str) or not METRIC_NAME.fullmatch(name):
            raise MetricError(f"{where}: metric name {name!r}; allowed: 1-32 of A-Z a-z 0-9 _ .")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise MetricError(
                f"{where}: metric {name} = {value!r} ({type(value).__name__}); a number"
            )
        number = float(value)
        if not math.isfinite(number):
            raise MetricError(f"{where}: metric {name} = {number}; a finite number")
        out[name] = number
    return out
