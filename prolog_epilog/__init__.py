"""Node health checks for Slurm Prolog, Epilog and HealthCheckProgram; drain bad nodes.

The public API is small: `run_checks(...)` returns a `SuiteResult` (`healthy`, `checks`,
`drain_reason`); `load_config` / `HealthConfig` read the TOML config; check names are in
`CHECK_NAMES`. The in-job watchdog calls `run_checks(only=["xid", "gpu-count", "ecc"])` every few
seconds, so importing this package stays cheap (no torch, no NVML until a GPU check runs);
when its kernel log follower sees a new driver line it runs the Xid check in `FAST_MODE`.
"""

from __future__ import annotations

from prolog_epilog.checks.base import CheckResult
from prolog_epilog.checks.xid import FAST_MODE
from prolog_epilog.config import CHECK_NAMES, HealthConfig, load_config
from prolog_epilog.runner import SuiteResult, run_checks

__all__ = [
    "CHECK_NAMES",
    "FAST_MODE",
    "CheckResult",
    "HealthConfig",
    "SuiteResult",
    "load_config",
    "run_checks",
]
