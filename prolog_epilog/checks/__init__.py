"""One module per check; `CHECK_MODULES` maps each check name to its module."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from prolog_epilog.checks.base import CheckContext, CheckResult

CHECK_MODULES = {
    "gpu-count": "gpu_count",
    "ecc": "ecc",
    "nvlink": "nvlink",
    "infiniband": "infiniband",
    "xid": "xid",
    "pcie": "pcie",
    "thermal": "thermal",
    "dcgm": "dcgm",
    "gpu-procs": "gpu_procs",
    "disk": "disk",
}


def check_function(name: str) -> Callable[[CheckContext], CheckResult]:
    module = importlib.import_module(f"prolog_epilog.checks.{CHECK_MODULES[name]}")
    fn: Callable[[CheckContext], CheckResult] = module.run
    return fn
