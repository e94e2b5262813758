"""disk (optional): free space in /dev/shm and /tmp (configurable paths).

NCCL and PyTorch dataloaders put shared-memory segments in /dev/shm; a full /dev/shm left by a
previous job makes the next one die at its first collective with an unhelpful bus error.
"""

from __future__ import annotations

import shutil
from typing import Any

from prolog_epilog.checks.base import CheckContext, CheckResult, Findings


def judge(usage: dict[str, tuple[int, int]], cfg: dict[str, Any]) -> CheckResult:
    """usage: path -> (total bytes, free bytes)."""
    f = Findings("disk")
    for path, (total, free) in sorted(usage.items()):
        pct = 100.0 * free / total if total else 0.0
        gb = free / 1e9
        if pct < cfg["min_free_pct"] or gb < cfg["min_free_gb"]:
            f.add("fail", f"{path} {gb:.1f} GB free ({pct:.0f}%)", f"{path} full")
    return f.result(", ".join(f"{p} ok" for p in sorted(usage)) or "no paths")


def run(ctx: CheckContext) -> CheckResult:
    cfg = ctx.config.section("disk")
    usage = {}
    for path in cfg["paths"]:
        try:
            u = shutil.disk_usage(path)
        except OSError:
            continue
        usage[path] = (u.total, u.free)
    return judge(usage, cfg)
