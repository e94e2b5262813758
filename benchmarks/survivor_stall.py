"""The healthy replicas' stall when a peer is killed at a random point inside a step.

Three replicas (one rank each) train the tiny example; each run `kill -9`s `--kills` times
(default 10), one replica after another, each at a uniformly random time within about a step
after its victim reached the listed step (`LaunchConfig.kill_jitter_s`), spaced so that the
victim is back before the next. A kill's stall is the longest gap between a survivor's commits
across it, minus the run's median step; the figure is the worst survivor's, per kill. Goal
(fast recovery): the worst of all kills <= 1 s.

Each kill is told apart by what the survivors saw: nothing (they committed the step without the
dead replica's slot and the next quorum left it out once its heartbeat expired), an aborted
step whose allreduce failed at once (the dead process's sockets were reset), or one that waited
out a timeout (the dead replica was in a quorum whose process group it never joined). Two
Lighthouse heartbeat timeouts run interleaved, `--repeat` runs each (default 5): 2 s
(fthsdp's default until 2026-12) and 0.5 s (its default since), with the aborts a short one causes
when no replica died.

    python benchmarks/survivor_stall.py [--kills N] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")

from benchmarks.harness import Run, interleave  # noqa: E402

REPLICAS = 3
STEP_SLEEP_S = 0.15
#: Steps between two kills: a restart (process start, imports, join) takes 5-10 s here.
SPACING = 50
FIRST = 30
JITTER_S = 0.2
#: The Lighthouse heartbeat timeouts compared: the former default, and the current one.
HEARTBEATS_S = (2.0, 0.5)


def progress(run_dir: Path, replica: int) -> list[dict[str, Any]]:
    path = run_dir / "progress" / f"r{replica}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def what_survivors_saw(events: list[dict[str, Any]], t0: float, t1: float) -> str:
    """The worst a survivor met over a kill's outage: an abort on a timeout, an abort at once,
    or nothing."""
    aborts = [e for e in events if e["event"] == "abort" and t0 < e["t"] <= t1]
    errors = " ".join(str(e.get("error") or "") for e in aborts)
    if "Timed out" in errors or "timeout" in errors.lower():
        return "timeout"
    return "abort" if aborts else "none"


def per_kill(
    run_dir: Path, failures: list[dict[str, Any]], median_step: float
) -> list[dict[str, Any]]:
    """Per kill: the worst survivor's stall over the outage (kill to the victim's first full
    step back), the part of it before the victim's new process joined (the fault's own cost),
    what the survivors saw, and where in its step the victim died."""
    from runtime.local.summary import down_during, outage_stall

    events = {r: progress(run_dir, r) for r in range(REPLICAS)}
    commits = {r: [e["t"] for e in evs if e["event"] == "commit"] for r, evs in events.items()}
    rank = {"none": 0, "abort": 1, "timeout": 2}
    out = []
    for f in failures:
        t_back = f.get("t_rejoin") or f["t_kill"]
        t_joined = f.get("t_joined") or t_back
        worst: float | None = None
        at_fault: float | None = None
        seen = "none"
        for r in range(REPLICAS):
            if r == f["replica"] or down_during(failures, r, f["t_kill"], t_back):
                continue
            stall = outage_stall(commits[r], f["t_kill"], t_back, median_step)
            early = outage_stall(commits[r], f["t_kill"], t_joined, median_step)
            if stall is None or early is None:
                continue
            worst = stall if worst is None else max(worst, stall)
            at_fault = early if at_fault is None else max(at_fault, early)
            saw = what_survivors_saw(events[r], f["t_kill"], t_back)
            seen = saw if rank[saw] > rank[seen] else seen
        since = [t for t in commits[f["replica"]] if t <= f["t_kill"]]
        out.append(
            {
                "replica": f["replica"],
                "step": f["step"],
                "worst_stall_s": worst,
                "at_fault_s": at_fault,
                "survivors_saw": seen,
                "into_step": (f["t_kill"] - since[-1]) / median_step if since else None,
            }
        )
    return out


def one(root: Path, heartbeat_s: float, kills: int, seed: int) -> dict[str, Any]:
    """One run with `kills` kills; its per-kill figures and whether it ended whole."""
    from runtime.env import Timeouts
    from runtime.local.config import LaunchConfig
    from runtime.local.launcher import launch

    steps = FIRST + SPACING * kills + 40
    run_dir = Path(tempfile.mkdtemp(prefix=f"hb{heartbeat_s}-", dir=root))
    summary = launch(
        LaunchConfig(
            run_dir=run_dir,
            command=[sys.executable, str(ROOT / "examples" / "train_tiny.py")],
            replicas=REPLICAS,
            ranks_per_replica=1,
            steps=steps,
            kill_schedule=tuple((k % REPLICAS, FIRST + SPACING * k) for k in range(kills)),
            kill_jitter_s=JITTER_S,
            seed=seed,
            timeouts=Timeouts(heartbeat_s=heartbeat_s),
            extra_env={"TINY_STEP_SLEEP_S": str(STEP_SLEEP_S)},
            run_timeout_s=60 + steps * 1.0,
        )
    )
    return {
        "kills": per_kill(run_dir, summary.failures, summary.median_step_s),
        "ok": summary.ok,
        "steps": summary.steps,
        "median_step_s": summary.median_step_s,
        "false_aborts": aborts_without_kill(run_dir, summary.failures),
    }


def aborts_without_kill(run_dir: Path, failures: list[dict[str, Any]]) -> int:
    """Steps a replica aborted with no kill in the 10 s before: what a short heartbeat timeout
    costs when a live replica's heartbeat is late."""
    kills = [f["t_kill"] for f in failures]
    return sum(
        1
        for r in range(REPLICAS)
        for e in progress(run_dir, r)
        if e["event"] == "abort" and not any(0 <= e["t"] - t <= 10 for t in kills)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10, help="kills per run (default 10)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if args.kills < 1 or args.repeat < 1:
        raise SystemExit("survivor_stall: --kills and --repeat must be >= 1")
    root = Path(tempfile.mkdtemp(prefix="fthsdp-survivor-stall-"))
    seeds = iter(range(1000))
    configs = {
        f"heartbeat {hb:g} s": (lambda hb=hb: one(root, hb, args.kills, next(seeds)))
        for hb in HEARTBEATS_S
    }
    run = Run(
        "survivor_stall",
        "Healthy replicas' stall, a peer killed inside the step",
        f"{REPLICAS} replicas x 1 rank of the tiny example (gloo, {STEP_SLEEP_S} s of sleep per "
        f"step, allreduce timeout 5 s), torchft's Lighthouse. Each run: {args.kills} `kill -9`s, "
        f"each replica in turn, every {SPACING} steps, each at a random point within "
        f"{JITTER_S} s (about a step) after its victim reached the step; the local launcher "
        "restarts the victim at once. Per kill: the longest gap between a survivor's commits "
        "over the outage (the kill to the victim's first full step back), minus the run's "
        "median step. Two Lighthouse heartbeat timeouts "
        f"(`train.heartbeat_timeout_s`: {', '.join(f'{h:g} s' for h in HEARTBEATS_S)}), runs "
        "interleaved; "
        "every kill of every run of a configuration is one sample.",
        args.repeat,
    )
    got = interleave(configs, args.repeat)
    for name, runs in got.items():
        kills = [k for r in runs for k in r["kills"]]
        nan = float("nan")
        run.row(
            f"{name}: worst survivor's stall per kill ({len(kills)} kills)",
            [k["worst_stall_s"] if k["worst_stall_s"] is not None else nan for k in kills],
            "s",
            "worst <= 1 s",
        )
        run.row(
            f"{name}: of it, before the victim's new process joined",
            [k["at_fault_s"] if k["at_fault_s"] is not None else nan for k in kills],
            "s",
        )
        for kind in ("none", "abort", "timeout"):
            some = [k["worst_stall_s"] for k in kills if k["survivors_saw"] == kind]
            if some:
                run.row(f"{name}: kills whose survivors saw {kind} ({len(some)})", some, "s")
        run.notes.append(
            f"- {name}: {sum(r['ok'] for r in runs)} of {len(runs)} runs ended with agreeing "
            "weights and a clean ledger; steps aborted with no kill in the 10 s before: "
            f"{sum(r['false_aborts'] for r in runs)}; median step "
            f"{statistics.median(r['median_step_s'] for r in runs):.3f} s."
        )
    run.extra["runs"] = got
    run.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
