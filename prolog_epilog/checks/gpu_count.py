"""gpu-count: every GPU the node should have is visible.

The commonest fault in a large GPU fleet is a GPU that fell off the bus (Xid 79): the node still
runs, but with 7 GPUs, and a job asking for 8 hangs in NCCL setup. Expected comes from the config,
else the node's GRES count in Slurm, else the `/dev/nvidia[0-9]*` device files (which the driver
creates at load time, so they still count a GPU that NVML can no longer see). A Slurm answer in a
shape fthsdp cannot read is an `error` of this check, not a node without GRES: only where Slurm
cannot be asked at all (not installed, not configured, not reachable) do the device files decide.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from prolog_epilog.checks.base import CheckContext, CheckResult
from prolog_epilog.records import GpuInfo


def judge(gpus: list[GpuInfo], expected: int | None) -> CheckResult:
    seen = len(gpus)
    if expected is None:
        return CheckResult("gpu-count", "warn", f"{seen} GPUs visible; expected count unknown")
    if seen < expected:
        missing = expected - seen
        return CheckResult(
            "gpu-count",
            "fail",
            f"{seen} of {expected} GPUs visible ({missing} missing)",
            f"{seen}/{expected} GPUs",
        )
    if seen > expected:
        return CheckResult(
            "gpu-count", "warn", f"{seen} GPUs visible, more than the {expected} expected"
        )
    return CheckResult("gpu-count", "pass", f"{seen}/{expected} GPUs")


def gres_gpu_count(gres: str) -> int | None:
    """`gpu:h100:8(S:0-1),nic:2` -> 8; None when the string names no GPUs."""
    total, found = 0, False
    for item in gres.split(","):
        item = re.sub(r"\(.*?\)", "", item).strip()
        parts = item.split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        m = re.match(r"^(\d+)", parts[-1])
        if m:
            total += int(m.group(1))
            found = True
    return total if found else None


@functools.lru_cache(maxsize=8)
def _slurm_gres_count(node: str, timeout: float) -> int | None:
    """The node's GPU count in Slurm's GRES; None when Slurm cannot be asked here (not
    installed, not configured, not reachable), does not know the node, or gives it no GPU GRES.
    `SlurmOutputError` when Slurm answered in a shape that cannot be read."""
    from slurm.backend import NodeNotFound, SlurmCommandError, SlurmOutputError, make_backend

    try:
        info = make_backend(timeout=timeout, retries=1).node(node)
    except NodeNotFound:
        return None
    except SlurmOutputError:
        raise
    except SlurmCommandError:
        return None
    return gres_gpu_count(info.gres)


def _dev_count(dev: Path = Path("/dev")) -> int | None:
    try:
        n = sum(1 for p in dev.iterdir() if re.fullmatch(r"nvidia\d+", p.name))
    except OSError:
        return None
    return n or None


def expected_count(ctx: CheckContext) -> int | None:
    configured = int(ctx.config.section("gpu-count").get("expected", 0))
    if configured > 0:
        return configured
    count = _slurm_gres_count(ctx.config.node, min(5.0, ctx.remaining()))
    return count if count is not None else _dev_count()


def run(ctx: CheckContext) -> CheckResult:
    from slurm.backend import SlurmOutputError

    gpus = ctx.source.gpus(ctx.remaining())
    try:
        expected = expected_count(ctx)
    except SlurmOutputError as exc:
        detail = f"{len(gpus)} GPUs visible; expected count unreadable from Slurm: {exc}"
        return CheckResult("gpu-count", "error", detail[:400], "slurm unreadable")
    return judge(gpus, expected)
