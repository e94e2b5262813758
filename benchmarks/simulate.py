"""Benchmark the scale simulator: the paper's ~100K-GPU job (98,304 GPUs), 30 days, 100 runs.

Target (issue 7): the synchronous and the FT-HSDP simulation together under 10 s on the 2-core
dev machine. Prints the median wall time over a few repetitions, events simulated per second
(failures, absorbed failures and rejoins), and the ETTR figures, and writes them to
benchmarks/results/simulate.json.

    PYTHONPATH=$PWD python benchmarks/simulate.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from runtime.sim import PRESETS, compare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--days", type=float, default=30.0)
    args = parser.parse_args()

    params = PRESETS["paper-100k"].with_changes(runs=args.runs, days=args.days)
    times: list[float] = []
    events = 0
    record: dict[str, object] = {}
    for i in range(args.repeat):
        p = params.with_changes(seed=i)
        start = time.perf_counter()
        comparison = compare(p)[0]
        times.append(time.perf_counter() - start)
        events = comparison.sync.events + comparison.fthsdp.events
        record = comparison.record(p)
    median = statistics.median(times)
    sync, ft = record["sync"], record["fthsdp"]
    assert isinstance(sync, dict) and isinstance(ft, dict)
    result = {
        "gpus": params.gpus,
        "replicas": params.replicas,
        "days": args.days,
        "runs": args.runs,
        "repeat": args.repeat,
        "wall_s_median": median,
        "wall_s_all": times,
        "events": events,
        "events_per_s": events / median,
        "sync_ettr": sync["ettr"],
        "sync_stall_s_mean": sync["stall_s_mean"],
        "fthsdp_ettr": ft["ettr"],
        "fthsdp_stall_s_mean": ft["stall_s_mean"],
        "target_s": 10.0,
        "meets_target": median < 10.0,
    }
    print(
        f"simulate: {params.gpus:,} GPUs, {args.days:g} days x {args.runs} runs, sync + FT-HSDP "
        f"(R={params.replicas}): median {median:.2f} s over {args.repeat} "
        f"({', '.join(f'{t:.2f}' for t in times)}); {events:,} events, "
        f"{events / median:,.0f} events/s; target < 10 s: {'ok' if median < 10 else 'MISSED'}"
    )
    print(
        f"ETTR sync {sync['ettr'] * 100:.1f} % "
        f"(stall {sync['stall_s_mean'] / 60:.1f} min/failure), "
        f"FT-HSDP {ft['ettr'] * 100:.1f} % (stall {ft['stall_s_mean'] / 60:.1f} min/failure)"
    )
    out = Path(__file__).resolve().parent / "results" / "simulate.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
