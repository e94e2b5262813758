"""`prolog_epilog.checks.gpu_count`: the GPUs seen against the expected count and the GRES."""

from __future__ import annotations

from prolog_epilog.checks import gpu_count
from prolog_epilog.records import (
    GpuInfo,
)


def test_gpu_count_and_gres():
    gpus = [GpuInfo(i, f"b{i}") for i in range(7)]
    assert gpu_count.judge(gpus, 8).status == "fail"
    assert gpu_count.judge(gpus, 7).status == "pass"
    assert gpu_count.judge(gpus, None).status == "warn"
    assert gpu_count.gres_gpu_count("gpu:h100:8(S:0-1),nic:2") == 8
    assert gpu_count.gres_gpu_count("gpu:4,gpu:a100:4") == 8
    assert gpu_count.gres_gpu_count("(null)") is None
