"""Per-step cost of fault tolerance: FT-HSDP vs static HSDP vs torchft's own DDP wrapper.

Same model (examples/train_tiny.py), same data order, no failures. FT-HSDP's step time is the
median interval between a replica's commits (quorum, forward/backward, FT allreduce, commit vote,
optimizer); the baselines' is the median wall time of one step. Target: FT-HSDP / plain HSDP
<= 1.10. Prints the figures and writes benchmarks/results/overhead.json.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")

STEPS = int(os.environ.get("BENCH_STEPS", "60"))
# a model large enough that a step is mostly compute, as in real training (override to taste)
os.environ.setdefault("TINY_DIM", "256")
os.environ.setdefault("TINY_HIDDEN", "1024")
WARMUP = 10


def ft_step_s(run_dir: Path, replicas: int, ranks: int) -> float:
    from runtime.local_launcher import LaunchConfig, launch

    summary = launch(
        LaunchConfig(
            run_dir=run_dir,
            command=[sys.executable, str(ROOT / "examples" / "train_tiny.py")],
            replicas=replicas,
            ranks_per_replica=ranks,
            steps=STEPS,
            min_replicas=replicas,
        )
    )
    if not summary.ok:
        raise SystemExit(f"FT-HSDP run failed: {summary}")
    gaps = []
    for r in range(replicas):
        lines = (run_dir / "progress" / f"r{r}.jsonl").read_text().splitlines()
        ts = [e["t"] for e in map(json.loads, lines) if e["event"] == "commit"][WARMUP:]
        gaps += [b - a for a, b in itertools.pairwise(ts)]
    return statistics.median(gaps)


def baseline_step_s(mode: str, run_dir: Path, replicas: int, ranks: int) -> float:
    from runtime.baselines import spawn
    from runtime.local_launcher import LaunchConfig, LocalLauncher

    lighthouse = None
    launcher = None
    if mode == "ddp":
        launcher = LocalLauncher(LaunchConfig(run_dir=run_dir, command=[], min_replicas=replicas))
        launcher._start_lighthouse()
        lighthouse = launcher.lighthouse_addr
    try:
        times = spawn(mode, run_dir, replicas, ranks, STEPS, lighthouse=lighthouse)
    finally:
        if launcher is not None:
            launcher.shutdown()
    per_rank = len(times) // (replicas * ranks)
    kept = [t for i, t in enumerate(times) if i % per_rank >= WARMUP]
    return statistics.median(kept)


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="fthsdp-overhead-"))
    rows = {
        "plain_hsdp_2x2": baseline_step_s("plain", tmp / "plain22", 2, 2),
        "ft_hsdp_2x2": ft_step_s(tmp / "ft22", 2, 2),
        "plain_hsdp_2x1": baseline_step_s("plain", tmp / "plain21", 2, 1),
        "ft_hsdp_2x1": ft_step_s(tmp / "ft21", 2, 1),
        "torchft_ddp_2x1": baseline_step_s("ddp", tmp / "ddp21", 2, 1),
    }
    result = {
        "steps": STEPS,
        "model": {"dim": int(os.environ["TINY_DIM"]), "hidden": int(os.environ["TINY_HIDDEN"])},
        "median_step_s": rows,
        "ratio_ft_vs_plain_2x2": rows["ft_hsdp_2x2"] / rows["plain_hsdp_2x2"],
        "ratio_ft_vs_plain_2x1": rows["ft_hsdp_2x1"] / rows["plain_hsdp_2x1"],
        "ratio_ft_vs_torchft_ddp_2x1": rows["ft_hsdp_2x1"] / rows["torchft_ddp_2x1"],
        "target_ratio_vs_plain": 1.10,
    }
    for name, value in rows.items():
        print(f"{name:18s} median step {value * 1000:7.1f} ms")
    for key in ("ratio_ft_vs_plain_2x2", "ratio_ft_vs_plain_2x1", "ratio_ft_vs_torchft_ddp_2x1"):
        print(f"{key:30s} {result[key]:.2f}")
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "overhead.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
