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
no-straggler run.

    PYTHONPATH=$PWD python benchmarks/straggler.py [--steps 160] [--window 20]
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

from runtime.env import Timeouts
from runtime.local_launcher import LaunchConfig, LocalLauncher

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--keep", type=Path, default=None, help="Keep the run dirs under this folder.")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fthsdp-straggler-") as tmp:
        base = args.keep or Path(tmp)
        baseline, bdir = run(args.steps, args.window, slow=False, base=base)
        if not (bdir / "progress" / "r0.jsonl").exists():
            raise SystemExit(f"baseline run produced no progress: {baseline.error}")
        slow, sdir = run(args.steps, args.window, slow=True, base=base)
        b0 = commits(bdir, 0)
        baseline_step = statistics.median(step_intervals(b0, 0, float("inf"))[5:])
        evictions = [d for d in slow.straggler_decisions if d["action"] == "evict"]
        r0 = commits(sdir, 0)
        r1 = commits(sdir, 1)
        result: dict[str, Any] = {
            "steps": args.steps,
            "window_steps": args.window,
            "slow_factor": 2.0,
            "baseline_step_s": baseline_step,
            "baseline_ok": baseline.ok,
            "slow_run_ok": slow.ok,
            "evictions": len(evictions),
            "decisions": slow.straggler_decisions,
            "restarts": slow.restarts,
            "weights_agree": slow.weights_agree,
            "ledger_ok": slow.ledger_ok,
        }
        if evictions:
            ev = evictions[0]
            first_inc = r1[0]["incarnation"]
            slow_commits = [e for e in r1 if e["incarnation"] == first_inc]
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
                result["after_vs_baseline"] = result["after_step_s"] / baseline_step - 1.0
            result["detection_within_window_plus_one"] = result["detection_steps"] <= (
                args.window + 1
            )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "straggler.json").write_text(json.dumps(result, indent=2, default=str))
    for key, value in result.items():
        if key != "decisions":
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
