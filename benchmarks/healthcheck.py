"""Benchmark: wall time of the default health suite on a simulated node, and with a hung tool.

Targets (issue 4): the full default suite (gpu-count, ecc, nvlink, infiniband, xid) through the
stand-in nvidia-smi finishes in under 1 s; with nvidia-smi hanging forever the suite returns
within the total budget + 0.5 s. Also times the in-job watchdog subset (xid, gpu-count, ecc).
Prints medians and writes benchmarks/results/healthcheck.json.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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
    root = Path(tempfile.mkdtemp(prefix="fthsdp-bench-"))
    (root / "c.toml").write_text(
        dev_config_toml(root, total_budget_s=BUDGET) + "[checks.gpu-count]\nexpected = 8\n"
    )
    cfg = load_config(root / "c.toml", node="node1")
    write_node_inputs(root, "node1")
    full = _time(lambda: run_checks(config=cfg), RUNS)
    assert run_checks(config=cfg).healthy
    watchdog = _time(lambda: run_checks(["xid", "gpu-count", "ecc"], cfg), RUNS)
    write_node_inputs(root, "node1", faults=["hang"])
    hung = _time(lambda: run_checks(config=cfg), 3)
    results: dict[str, Any] = {
        "full_suite_median_s": statistics.median(full),
        "full_suite_runs_s": full,
        "watchdog_subset_median_s": statistics.median(watchdog),
        "hung_tool_budget_s": BUDGET,
        "hung_tool_median_s": statistics.median(hung),
        "hung_tool_overrun_s": statistics.median(hung) - BUDGET,
        "targets": {"full_suite_s": 1.0, "hung_overrun_s": 0.5},
    }
    ok = results["full_suite_median_s"] < 1.0 and results["hung_tool_overrun_s"] < 0.5
    results["targets_met"] = ok
    out = Path(__file__).resolve().parent / "results" / "healthcheck.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    full_s = results["full_suite_median_s"]
    print(f"full default suite (simulated node, nvidia-smi stand-in): median {full_s:.3f} s")
    print(f"watchdog subset xid,gpu-count,ecc: median {results['watchdog_subset_median_s']:.3f} s")
    print(
        f"hung nvidia-smi, budget {BUDGET:.1f} s: median {results['hung_tool_median_s']:.3f} s "
        f"(overrun {results['hung_tool_overrun_s']:.3f} s)"
    )
    print(f"targets met: {ok}; wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
