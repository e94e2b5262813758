"""Benchmark the scale simulator: the paper's ~100K-GPU job (98,304 GPUs), 30 days, 100 runs.

Target (issue 7): the synchronous and the FT-HSDP simulation together under 10 s on the 2-core
dev machine. Runs `--repeat` times (default 5, a different seed each); the wall time, events
simulated per second and the ETTR figures go to benchmarks/figures/simulate.json (and
benchmarks/results/) as medians and ranges.

    PYTHONPATH=$PWD python benchmarks/simulate.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import Run, interleave, repeats_arg
from runtime.sim import PRESETS, compare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=repeats_arg())
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--days", type=float, default=30.0)
    args = parser.parse_args()

    params = PRESETS["paper-100k"].with_changes(runs=args.runs, days=args.days)
    records: list[dict[str, Any]] = []
    events: list[float] = []
    seeds = iter(range(10**6))

    def once() -> float:
        p = params.with_changes(seed=next(seeds))
        start = time.perf_counter()
        comparison = compare(p)[0]
        elapsed = time.perf_counter() - start
        events.append(comparison.sync.events + comparison.fthsdp.events)
        records.append(comparison.record(p))
        return elapsed

    run = Run(
        "simulate",
        "Scale simulator",
        f"{params.gpus:,} GPUs, {args.days:g} days, {args.runs} Monte Carlo runs, synchronous and "
        f"FT-HSDP ({params.replicas} replicas of {params.replica_gpus:,}), `paper-100k` preset, "
        "a different seed each repeat. The ETTRs come out of component costs (allocation, NCCL "
        "init, checkpoint load, first step, lost work, quorum stall), not from the headline "
        "figures; see `docs/simulator.md`.",
        args.repeat,
    )
    times = interleave({"compare": once}, args.repeat)["compare"]
    run.row("wall time, sync + FT-HSDP", times, "s", "< 10 s", 2)
    run.row(
        "events simulated per second",
        [e / t for e, t in zip(events, times, strict=True)],
        "/s",
        digits=0,
    )
    run.row("synchronous ETTR", [r["sync"]["ettr"] * 100 for r in records], "%", "44 % ± 4 (paper)")
    run.row("FT-HSDP ETTR", [r["fthsdp"]["ettr"] * 100 for r in records], "%", "80 % ± 4 (paper)")
    run.row(
        "stall per failure, synchronous",
        [r["sync"]["stall_s_mean"] / 60 for r in records],
        "min",
        "≈ 10 min (paper)",
        1,
    )
    run.row(
        "stall per failure, FT-HSDP",
        [r["fthsdp"]["stall_s_mean"] / 60 for r in records],
        "min",
        "≈ 3 min (paper)",
        1,
    )
    cp = records[-1]["control_plane"]
    run.notes.append(
        f"- Control plane: {cp['reporters']} leaders reporting every "
        f"{cp['report_interval_s']:g} s take {cp['utilisation'] * 100:.2f} % of one coordinator "
        f"(capacity {cp['capacity_reports_per_s']:,.0f} reports/s at the measured cost)."
    )
    run.write()


if __name__ == "__main__":
    main()
