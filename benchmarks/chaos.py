"""The seeded chaos campaign: every fault kind on one dev-cluster run per seed, and the figures.

Each seed is one run of `tests/test_story_chaos.py` (3 one-node replicas of
`examples/train_tiny.py` + the control job, health gated, submitted by the job user through the
site install; root, slurm-wlm and munge needed) with `FTHSDP_CHAOS_KINDS` = every kind (xid79,
ecc, kill, slow, down, control, control-down, coordinator, slurmctld, second) and one fault of
each, in the order the seed draws. The test asserts the invariants (exactly-once ledger over
every step, agreeing weights, every requeue attributed to its fault, the admin drain untouched,
no job left); this script collects its per-fault figures from `FTHSDP_CHAOS_OUT`: per kind,
faults injected and survived, steps lost, the healthy replicas' longest stall, and the time
until the run was whole again, as medians over the seeds.

    python benchmarks/chaos.py [--seeds 1,2,3,4,5] [--faults 10]

A seed that fails is rerun alone with `FTHSDP_CHAOS_SEED=N FTHSDP_CHAOS_KINDS=... pytest
tests/test_story_chaos.py`; the command is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from chaos_harness import KINDS  # noqa: E402

from benchmarks.harness import Run  # noqa: E402

#: One seed's run, on a loaded machine, with every kind: the story's own timeout (600 s + 240 s
#: a fault) plus set-up.
SEED_LIMIT_S = 3600


def one_seed(seed: int, faults: int, kinds: list[str], out: Path) -> tuple[int, dict[str, Any]]:
    env = {
        **os.environ,
        "FTHSDP_CHAOS_SEED": str(seed),
        "FTHSDP_CHAOS_FAULTS": str(faults),
        "FTHSDP_CHAOS_KINDS": ",".join(kinds),
        "FTHSDP_CHAOS_OUT": str(out),
    }
    cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
           "tests/test_story_chaos.py", "-m", "slurm"]  # fmt: skip
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, env=env, check=False, timeout=SEED_LIMIT_S)
    print(f"chaos seed {seed}: exit {r.returncode} after {time.monotonic() - t0:.0f}s")
    if r.returncode != 0:
        rerun = " ".join(f"{k}={env[k]}" for k in ("FTHSDP_CHAOS_SEED", "FTHSDP_CHAOS_FAULTS",
                                                   "FTHSDP_CHAOS_KINDS"))  # fmt: skip
        print(f"chaos seed {seed} failed; rerun: {rerun} {' '.join(cmd[1:])}")
    data = json.loads(out.read_text()) if out.exists() else {}
    return r.returncode, data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3,4,5", help="comma-separated seeds")
    parser.add_argument("--faults", type=int, default=len(KINDS), help="faults per seed")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    kinds = [k for k in args.kinds.split(",") if k]
    run = Run(
        "chaos",
        "Seeded chaos campaign",
        f"The dev cluster (4 nodes, health-gated), one run per seed of 3 one-node replicas of "
        f"`examples/train_tiny.py` + the control job, submitted by the job user through the "
        f"site install (`tests/test_story_chaos.py`); {args.faults} faults per run of the kinds "
        f"{', '.join(kinds)}, in the seed's order, each a few steps after the run was last "
        f"whole; one replica's node (not the control job's) under an administrator's drain "
        f"throughout. Seeds "
        f"{', '.join(map(str, seeds))}.",
        len(seeds),
    )
    results: list[dict[str, Any]] = []
    failed: list[int] = []
    with tempfile.TemporaryDirectory(prefix="fthsdp-bench-chaos-") as tmp:
        for seed in seeds:
            rc, data = one_seed(seed, args.faults, kinds, Path(tmp) / f"seed-{seed}.json")
            results.append({"seed": seed, "exit": rc, **data})
            if rc != 0:
                failed.append(seed)
    outcomes = [o for r in results for o in r.get("outcomes", [])]
    for kind in kinds:
        mine = [o for o in outcomes if o["fault"]["kind"] == kind]
        if not mine:
            continue
        survived = sum(o["recovered_s"] is not None for o in mine)
        run.row(f"{kind}: faults survived of injected ({len(mine)})", [survived], "", digits=0)
        run.row(f"{kind}: steps lost", [o["steps_lost"] for o in mine], " steps", "0", 0)
        run.row(
            f"{kind}: healthy replicas' longest stall",
            [o["stall_s"] if o["stall_s"] is not None else float("nan") for o in mine],
            "s",
            digits=1,
        )
        run.row(
            f"{kind}: fault → run whole again",
            [o["recovered_s"] if o["recovered_s"] is not None else float("nan") for o in mine],
            "s",
            digits=1,
        )
    beside = [o for o in outcomes if o.get("beside_control")]
    if beside:
        run.notes.append(
            "- Faults whose node also held the control job (the control plane went down with "
            "it): "
            + ", ".join(f"{o['fault']['kind']} (stall {_s(o['stall_s'])})" for o in beside)
            + "."
        )
    ok = len(seeds) - len(failed)
    run.row("seeds whose every invariant held", [ok], f" of {len(seeds)}", str(len(seeds)), 0)
    for kind, text in KINDS.items():
        if kind in kinds:
            run.notes.append(f"- `{kind}`: {text}.")
    if failed:
        run.notes.append(f"- Seeds that failed (rerun each alone to see why): {failed}.")
    run.extra["seeds"] = results
    run.write()
    return 1 if failed else 0


def _s(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1f} s"


if __name__ == "__main__":
    raise SystemExit(main())
