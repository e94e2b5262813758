"""The node watchdog inside a replica: notice a bad GPU before a collective timeout does.

A GPU that falls off the bus or starts reporting uncorrectable ECC errors usually shows first in
the kernel log (an Xid) or in NVML, seconds to minutes before a collective notices a peer is gone.
Each rank runs the cheap `prolog_epilog` checks (Xid, GPU count, volatile ECC) for its own node
every few seconds in a background thread; a failing verdict is a *node* fault: the leader reports
it with the evidence and the worker exits `ExitCode.NODE_FAULT`, so the coordinator drains that
node and requeues the replica instead of relaunching it in place on bad hardware.

The checks' sources follow `fthsdp check`'s options (NVML or nvidia-smi, a sysfs root, a kernel
log), read here from `FTHSDP_GPU_SOURCE`, `FTHSDP_SYSFS_ROOT` and `FTHSDP_KERNEL_LOG`, so the dev
cluster's simulated hardware drives the watchdog as it drives the prolog.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm import contract

log = logging.getLogger("fthsdp.watchdog")
DEFAULT_INTERVAL_S = 5.0
CHEAP_CHECKS = ("xid", "gpu-count", "ecc")


def check_options(env: Mapping[str, str]) -> dict[str, Any]:
    """`run_checks` keyword arguments from the environment (only those that are set)."""
    out: dict[str, Any] = {}
    if env.get(contract.HEALTH_CONFIG):
        from prolog_epilog import load_config

        out["config"] = load_config(env[contract.HEALTH_CONFIG], env.get(contract.SLURMD_NODENAME))
    if env.get(contract.GPU_SOURCE):
        out["gpu_source"] = env[contract.GPU_SOURCE]
    for key, var in (("sysfs_root", contract.SYSFS_ROOT), ("kernel_log", contract.KERNEL_LOG)):
        if env.get(var):
            out[key] = Path(env[var])
    return out


def verdict_of(result: Any) -> tuple[str, list[str]] | None:
    """(reason, evidence) for an unhealthy `SuiteResult`, None when healthy."""
    if getattr(result, "healthy", True):
        return None
    evidence = []
    for check in getattr(result, "checks", []) or []:
        if getattr(check, "status", "pass") in ("fail", "error"):
            evidence.append(f"{check.name}: {check.detail}".strip())
    reason = getattr(result, "drain_reason", None) or "fthsdp: health check failed"
    return str(reason), evidence or [str(reason)]


class NodeWatchdog:
    """Runs the cheap health checks periodically; calls `on_fault(reason, evidence)` once."""

    def __init__(
        self,
        checks: Sequence[str],
        on_fault: Callable[[str, list[str]], None],
        interval_s: float = DEFAULT_INTERVAL_S,
        run_checks: Callable[..., Any] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.checks = [c for c in checks if c in CHEAP_CHECKS]
        self.on_fault = on_fault
        self.interval_s = float(os.environ.get(contract.WATCHDOG_INTERVAL_S, interval_s))
        self._run_checks = run_checks
        self.options = dict(options) if options is not None else check_options(os.environ)
        self.verdict: tuple[str, list[str]] | None = None
        self._stop = threading.Event()
        self._since = time.time()
        self._thread = threading.Thread(target=self._loop, name="fthsdp-watchdog", daemon=True)

    def _checker(self) -> Callable[..., Any]:
        if self._run_checks is None:
            from prolog_epilog import run_checks

            self._run_checks = run_checks
        return self._run_checks

    def check_once(self) -> tuple[str, list[str]] | None:
        try:
            result = self._checker()(only=list(self.checks), since=self._since, **self.options)
        except Exception as exc:  # a broken check must not kill training
            log.warning("watchdog check failed to run: %s", exc)
            return None
        return verdict_of(result)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            found = self.check_once()
            if found is not None:
                self.verdict = found
                self.on_fault(*found)
                return

    def start(self) -> None:
        if self.checks:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
