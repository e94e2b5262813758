"""Straggler benchmark: a local run with one replica slowed 2x, detected, evicted and restarted.

Two local runs of `examples/train_tiny.py` (3 replicas x 1 rank, a fixed 0.1 s of "compute" per
step so the step time is not just CPU noise on a shared 2-core machine):

1. baseline: no straggler;
2. replica 1 runs 2x slow from its start (its first incarnation's "node" is bad); the launcher
   runs the same detector and decision as the coordinator (`runtime.control.straggler`) and
   evicts it by restarting it on a healthy "node".

Measured from the workers' own progress files (healthy replica 0's commit times): the run's step
time in the baseline, during the straggler (until the eviction), and after the replacement is a
full participant; the time and steps from the straggler's first step to its eviction. Targets
(issue 8): detection within the window plus one step; post-eviction step time within 10 % of the
no-straggler run. The two runs are interleaved, `--repeat` times (default 5).

    PYTHONPATH=$PWD python benchmarks/straggler.py [--steps 140] [--window 20] [--repeat 5]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.harness import Run, interleave, repeats_arg  # noqa: E402
from runtime.env import Timeouts  # noqa: E402
from runtime.local.config import LaunchConfig  # noqa: E402
from runtime.local.launcher import LocalLauncher  # noqa: E402


def commits(run_dir: Path, replica: int) -> list[dict[str, Any]]:
    path = run_dir / "progress" / f"r{replica}.jsonl"
    out = []
    for line in path.read_text().splitlines():
        ev = json.loads(line)
        if ev.get("event") == "commit":
            out.append(ev)
    return out


def step_intervals(events: list[dict[str, Any]], lo: float, hi: float) -> list[float]:
    ts = [e["t"] for e in events if lo <= e["t"] <= hi and not e.get("healing")]
    return [b - a for a, b in itertools.pairwise(ts)]


def run(steps: int, window: int, slow: bool, base: Path) -> tuple[Any, Path]:
    run_dir = base / ("slow" if slow else "baseline")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cfg = LaunchConfig(
        run_dir=run_dir,
        command=[sys.executable, str(ROOT / "examples" / "train_tiny.py")],
        replicas=3,
        ranks_per_replica=1,
        steps=steps,
        min_replicas=2,
        timeouts=Timeouts(heartbeat_s=2.0, allreduce_s=10.0, quorum_s=20.0, join_s=30.0),
        extra_env={"TINY_STEP_SLEEP_S": "0.1", "PYTHONPATH": str(ROOT)},
        slow_replica=1 if slow else None,
        slow_factor=2.0,
        straggler_window_steps=window,
        run_timeout_s=600.0,
    )
    return LocalLauncher(cfg).run(), run_dir


def measure(baseline: Any, bdir: Path, slow: Any, sdir: Path, window: int) -> dict[str, Any]:
    """The figures of one repeat (a baseline run and a slowed run)."""
    if not (bdir / "progress" / "r0.jsonl").exists():
        raise SystemExit(f"straggler: baseline run produced no progress: {baseline.error}")
    b0 = commits(bdir, 0)
    baseline_step = statistics.median(step_intervals(b0, 0, float("inf"))[5:])
    evictions = [d for d in slow.straggler_decisions if d["action"] == "evict"]
    r0, r1 = commits(sdir, 0), commits(sdir, 1)
    result: dict[str, Any] = {
        "baseline_step_s": baseline_step,
        "baseline_ok": baseline.ok,
        "slow_run_ok": slow.ok,
        "evictions": len(evictions),
        "restarts": slow.restarts,
        "weights_agree": slow.weights_agree,
        "ledger_ok": slow.ledger_ok,
    }
    if evictions:
        ev = evictions[0]
        first_inc = r1[0]["incarnation"]
        onset = LaunchConfig.slow_after_step  # the "node" degrades here, not at step 0
        slow_commits = [e for e in r1 if e["incarnation"] == first_inc and e["step"] >= onset]
        t_start = slow_commits[0]["t"]
        rejoined = [e for e in r1 if e["incarnation"] != first_inc and not e.get("healing")]
        t_back = rejoined[0]["t"] if rejoined else float("inf")
        during = step_intervals(r0, t_start, ev["t"])
        after = step_intervals(r0, t_back, float("inf"))
        result.update(
            during_step_s=statistics.median(during[2:]) if len(during) > 2 else None,
            after_step_s=statistics.median(after[2:]) if len(after) > 2 else None,
            detection_s=ev["t"] - t_start,
            detection_steps=ev["step"] - slow_commits[0]["step"],
            eviction_to_participating_s=t_back - ev["t"],
            factor_measured=ev["factor"],
        )
        if result["after_step_s"] is not None:
            result["after_vs_baseline"] = result["after_step_s"] / baseline_step
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=140)
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=repeats_arg())
    ap.add_argument("--keep", type=Path, default=None, help="Keep the run dirs under this folder.")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fthsdp-straggler-") as tmp:
        base = args.keep or Path(tmp)
        count = itertools.count()
        configs = {
            "baseline": lambda: run(args.steps, args.window, False, base / str(next(count))),
            "slow": lambda: run(args.steps, args.window, True, base / str(next(count))),
        }
        bench = Run(
            "straggler",
            "Straggler detection and eviction",
            f"Local launcher, 3 replicas × 1 rank of `examples/train_tiny.py` (0.1 s of work per "
            f"step), {args.steps} steps, straggler window {args.window} steps: a run with no "
            'straggler (the baseline) and the same run with replica 1 slowed 2× (its "node" '
            "is slow; the restart lands on a healthy one), interleaved; the after/baseline ratio "
            "is taken within one repeat.",
            args.repeat,
        )
        got = interleave(configs, args.repeat)
        rows = [
            measure(b[0], b[1], sl[0], sl[1], args.window)
            for b, sl in zip(got["baseline"], got["slow"], strict=True)
        ]

    def col(key: str) -> list[float]:
        return [float(r[key]) for r in rows if r.get(key) is not None]

    bench.row("median step, no straggler (baseline)", col("baseline_step_s"), "s")
    bench.row("median step with replica 1 at 2× (until eviction)", col("during_step_s"), "s")
    bench.row("median step after the replacement participates", col("after_step_s"), "s")
    bench.row("after / baseline", col("after_vs_baseline"), "x", "≤ 1.10")
    bench.row("slowdown factor measured by the detector", col("factor_measured"), "x")
    bench.row(
        "detection, steps after the slowdown began",
        col("detection_steps"),
        "steps",
        f"≤ window + 1 = {args.window + 1}",
        0,
    )
    bench.row("detection, seconds", col("detection_s"), "s", digits=1)
    bench.row(
        "eviction → replacement participating", col("eviction_to_participating_s"), "s", digits=1
    )
    evicted = [r["evictions"] for r in rows]
    clean = all(r["weights_agree"] and r["ledger_ok"] for r in rows)
    bench.notes.append(
        f"- Evictions per slowed run: {evicted}; weights agree and ledger clean in every slowed "
        f"run: {'yes' if clean else 'no'}."
    )
    bench.extra["runs"] = rows
    bench.write()


if __name__ == "__main__":
    main()
