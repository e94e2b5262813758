"""Benchmark: wall time of the default health suite on a simulated node, and with a hung tool.

Targets (issue 4): the full default suite (gpu-count, ecc, nvlink, infiniband, xid) through the
stand-in nvidia-smi finishes in under 1 s; with nvidia-smi hanging forever the suite returns
within the total budget + 0.5 s. Also times the in-job watchdog subset (xid, gpu-count, ecc).
The three run interleaved, `--repeat` times (default 5); medians and ranges go to
benchmarks/figures/healthcheck.json (and benchmarks/results/).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import Run, interleave, repeats_arg
from prolog_epilog import load_config, run_checks
from prolog_epilog.simulated_hardware import dev_config_toml, write_node_inputs

RUNS = 7
BUDGET = 2.0


def _time(fn: Callable[[], object], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    repeats = repeats_arg()
    root = Path(tempfile.mkdtemp(prefix="fthsdp-bench-"))
    (root / "c.toml").write_text(
        dev_config_toml(root, total_budget_s=BUDGET) + "[checks.gpu-count]\nexpected = 8\n"
    )
    cfg = load_config(root / "c.toml", node="node1")
    hung_root = Path(tempfile.mkdtemp(prefix="fthsdp-bench-hung-"))
    (hung_root / "c.toml").write_text(
        dev_config_toml(hung_root, total_budget_s=BUDGET) + "[checks.gpu-count]\nexpected = 8\n"
    )
    hung_cfg = load_config(hung_root / "c.toml", node="node1")
    write_node_inputs(root, "node1")
    write_node_inputs(hung_root, "node1", faults=["hang"])
    if not run_checks(config=cfg).healthy:
        raise SystemExit("healthcheck: the healthy simulated node is not healthy")

    def timed(fn: Callable[[], object]) -> Callable[[], float]:
        return lambda: _time(fn, 1)[0]

    run = Run(
        "healthcheck",
        "Node health checks",
        "The full default suite against a simulated node (nvidia-smi stand-in printing the real "
        "`-q`/CSV formats, a sysfs InfiniBand tree, a kernel log), in-process; the in-job "
        f"watchdog subset; and the full suite with `nvidia-smi` hanging (total budget "
        f"{BUDGET:.1f} s). The three run interleaved.",
        repeats,
    )
    got = interleave(
        {
            "full": timed(lambda: run_checks(config=cfg)),
            "watchdog": timed(lambda: run_checks(["xid", "gpu-count", "ecc"], cfg)),
            "hung": timed(lambda: run_checks(config=hung_cfg)),
        },
        repeats,
    )
    run.row("full default suite", got["full"], "s", "< 1 s")
    run.row("watchdog subset `xid,gpu-count,ecc`", got["watchdog"], "s", "cheap")
    run.row(f"one hung `nvidia-smi`, budget {BUDGET:.1f} s", got["hung"], "s")
    run.row("hung: overrun of the budget", [t - BUDGET for t in got["hung"]], "s", "< 0.5 s")
    run.notes.append(
        "- Not measured: the NVML source and real `nvidia-smi` on a GPU (CPU-only machine)."
    )
    run.write()
    ok = statistics.median(got["full"]) < 1.0 and max(got["hung"]) - BUDGET < 0.5
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
