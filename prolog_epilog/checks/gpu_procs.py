"""gpu-procs (optional): processes already on the GPUs when a job is about to start.

A process left over from the previous job (a hung dataloader, an orphaned NCCL rank) holds GPU
memory and can hold the GPU's attention; the next job then OOMs or runs slowly. At prolog time
nothing should be running on the GPUs this node gives out.
"""

from __future__ import annotations

from typing import Any

from prolog_epilog.checks.base import CheckContext, CheckResult
from prolog_epilog.records import GpuProcess


def judge(procs: list[GpuProcess], cfg: dict[str, Any]) -> CheckResult:
    if not procs:
        return CheckResult("gpu-procs", "pass", "no processes on the GPUs")
    pids = ", ".join(f"{p.pid}@{p.bus_id}" for p in procs[:6])
    return CheckResult(
        "gpu-procs",
        cfg["on_found"],
        f"{len(procs)} processes on the GPUs: {pids}",
        f"{len(procs)} stray GPU procs",
    )


def run(ctx: CheckContext) -> CheckResult:
    return judge(ctx.source.processes(ctx.remaining()), ctx.config.section("gpu-procs"))
