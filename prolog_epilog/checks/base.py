"""What every check shares: the result record, the context it runs in, and `Findings`.

A check is a module with `run(ctx) -> CheckResult` (I/O: asks the context's sources) and pure
`judge(...)` functions over records (tested by tables). `Findings` collects per-GPU/per-port
problems with a severity and turns them into one result: the worst severity wins, the detail
lists every problem, and the short `reason` (what goes into the drain reason, where sinfo shows
only 20 characters) names the first failing one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prolog_epilog.config import HealthConfig
from prolog_epilog.gpu_source import GpuSource
from prolog_epilog.state import StateStore

STATUSES = ("pass", "skip", "warn", "error", "fail")
_RANK = {"pass": 0, "skip": 0, "warn": 1, "error": 2, "fail": 3}


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str  # pass | warn | fail | error | skip
    detail: str
    reason: str = ""  # short text for the drain reason (fail/error only)
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "detail": self.detail,
            "elapsed_s": round(self.elapsed_s, 4),
        }


@dataclass
class CheckContext:
    config: HealthConfig
    source: GpuSource
    sysfs_root: Path
    kernel_log: str
    since: float | None
    state: StateStore
    mode: str = "check"
    deadline: float = field(default_factory=lambda: time.monotonic() + 10.0)

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


@dataclass
class Findings:
    name: str
    problems: list[tuple[str, str, str]] = field(default_factory=list)  # (status, detail, short)

    def add(self, status: str, detail: str, short: str | None = None) -> None:
        self.problems.append((status, detail, short or detail))

    def result(self, ok_detail: str) -> CheckResult:
        if not self.problems:
            return CheckResult(self.name, "pass", ok_detail)
        worst = max(self.problems, key=lambda p: _RANK[p[0]])[0]
        ordered = sorted(self.problems, key=lambda p: -_RANK[p[0]])
        detail = "; ".join(p[1] for p in ordered)
        reason = ordered[0][2] if worst in ("fail", "error") else ""
        if len(ordered) > 1 and reason:
            reason += f" (+{len(ordered) - 1})"
        return CheckResult(self.name, worst, detail[:400], reason)


def threshold_hit(value: int | float | None, limit: int | float) -> bool:
    """True if `value` exceeds `limit`; a negative limit disables the threshold."""
    return value is not None and limit >= 0 and value > limit
