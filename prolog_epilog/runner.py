"""Run a set of checks in parallel, each under its own timeout, within a total budget.

Every check runs in its own daemon thread. The runner waits for each until the earlier of its
own timeout and the suite's budget, then reports whatever has not finished as
`error: timed out after Ns`, and returns: a check stuck in an uninterruptible NVML call or on a
dying GPU cannot hold up slurmd, and a daemon thread does not keep the process alive at exit.
A check that raises becomes an `error` result with a one-line detail; the traceback goes to the
log only. Whether errors make the node unhealthy is `general.on_error`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prolog_epilog.checks import CHECK_MODULES, check_function
from prolog_epilog.checks.base import CheckContext, CheckResult
from prolog_epilog.config import CHECK_NAMES, GPU_SOURCES, HealthConfig, load_config
from prolog_epilog.gpu_source import GpuSource, make_source
from prolog_epilog.state import StateStore
from prolog_epilog.tools import ToolError, kill_tools
from slurm.backend import drain_reason
from slurm.errors import InputError

log = logging.getLogger("fthsdp.health")

#: When several checks fail, the drain reason names the first in this order.
REASON_PRIORITY = (
    "xid",
    "gpu-count",
    "ecc",
    "nvlink",
    "infiniband",
    "dcgm",
    "pcie",
    "thermal",
    "gpu-procs",
    "disk",
)


@dataclass(frozen=True)
class SuiteResult:
    checks: list[CheckResult]
    healthy: bool
    drain_reason: str | None
    elapsed_s: float = 0.0
    node: str = ""
    gpu_source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def by_name(self) -> dict[str, CheckResult]:
        return {c.name: c for c in self.checks}

    def to_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "checks": [c.to_dict() for c in self.checks],
            "drain_reason": self.drain_reason,
            "node": self.node,
            "elapsed_s": round(self.elapsed_s, 4),
        }


def parse_check_list(text: str | Sequence[str] | None) -> list[str] | None:
    """`a,b` or [a, b] -> validated names (order kept, duplicates dropped); None stays None."""
    if text is None:
        return None
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for raw in items:
        name = raw.strip()
        if not name:
            continue
        if name not in CHECK_NAMES:
            raise InputError("checks", name, f"allowed: {', '.join(CHECK_NAMES)}")
        if name not in out:
            out.append(name)
    return out


def verdict(results: list[CheckResult], on_error: str) -> tuple[bool, str | None]:
    """(healthy, drain reason) for a list of results: pure, tested by tables."""
    bad = [r for r in results if r.status == "fail" or (r.status == "error" and on_error == "fail")]
    if not bad:
        return True, None
    rank = {name: i for i, name in enumerate(REASON_PRIORITY)}
    first = min(bad, key=lambda r: (r.status != "fail", rank.get(r.name, 99)))
    detail = first.reason or first.detail
    if first.status == "error":
        detail = f"error: {detail}"
    if len(bad) > 1:
        detail = f"{detail} [+{','.join(r.name for r in bad if r is not first)}]"
    return False, drain_reason(first.name, detail)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def run_checks(
    only: Sequence[str] | None = None,
    config: HealthConfig | None = None,
    *,
    gpu_source: str = "auto",
    sysfs_root: Path | None = None,
    kernel_log: Path | None = None,
    since: float | None = None,
    mode: str = "check",
    source: GpuSource | None = None,
) -> SuiteResult:
    """Run `only` (default: the config's suite) and return the verdict; never raises for a check."""
    start = time.monotonic()
    cfg = config or load_config()
    names = parse_check_list(list(only)) if only is not None else cfg.default_checks
    assert names is not None
    if gpu_source not in GPU_SOURCES:
        raise InputError("gpu_source", gpu_source, f"allowed: {', '.join(GPU_SOURCES)}")
    kind = gpu_source if gpu_source != "auto" else cfg.general["gpu_source"]
    src = source or make_source(kind, cfg.path("nvidia_smi"))
    budget = float(cfg.general["total_budget_s"])
    suite_deadline = start + budget
    state = StateStore(cfg.path("state_dir"))
    results: dict[str, CheckResult] = {}
    # A check whose tools were killed at its deadline still finishes its thread (the tool exits
    # -9); the timeout it was given is the verdict, so that late result never replaces it.
    timed_out: dict[str, CheckResult] = {}
    threads: list[tuple[str, threading.Thread, float, float]] = []

    for name in names:
        timeout = min(cfg.timeout(name), budget)
        deadline = min(start + timeout, suite_deadline)
        ctx = CheckContext(
            config=cfg,
            source=src,
            sysfs_root=Path(sysfs_root) if sysfs_root else Path(cfg.path("sysfs_root")),
            kernel_log=str(kernel_log) if kernel_log else cfg.path("kernel_log"),
            since=since,
            state=state,
            mode=mode,
            deadline=deadline,
        )

        def body(name: str = name, ctx: CheckContext = ctx) -> None:
            t0 = time.monotonic()
            try:
                res = check_function(name)(ctx)
            except ToolError as exc:
                res = CheckResult(name, "error", str(exc), str(exc)[:40])
            except Exception as exc:
                log.exception("check %s crashed", name)
                res = CheckResult(name, "error", _one_line(exc), "check crashed")
            results[name] = CheckResult(
                res.name, res.status, res.detail, res.reason, time.monotonic() - t0
            )

        thread = threading.Thread(target=body, name=f"check-{name}", daemon=True)
        thread.start()
        threads.append((name, thread, deadline, timeout))

    for name, thread, deadline, timeout in sorted(threads, key=lambda t: t[2]):
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive() or name not in results:
            if thread.ident is not None:
                kill_tools(thread.ident)
            waited = min(timeout, budget)
            timed_out[name] = CheckResult(
                name, "error", f"timed out after {waited:g}s", "timed out", time.monotonic() - start
            )
            log.error("check %s timed out after %gs", name, waited)
    ordered = [timed_out.get(n) or results[n] for n in names]
    healthy, reason = verdict(ordered, cfg.general["on_error"])
    return SuiteResult(
        ordered,
        healthy,
        reason,
        time.monotonic() - start,
        cfg.node,
        getattr(src, "kind", kind),
    )


__all__ = ["CHECK_MODULES", "SuiteResult", "parse_check_list", "run_checks", "verdict"]
