"""Recovery from one failure: FT-HSDP (tuned and torchft-default timeouts) vs a synchronous job.

Three replicas (one rank each) train the tiny example; replica 2 is killed with SIGKILL at step
KILL_AT. For FT-HSDP the local launcher restarts only that replica; for the synchronous job
(static HSDP, durable checkpoint every CKPT_EVERY steps) the whole job is killed and restarted
from the last checkpoint, which is what a synchronous job does when one rank dies.

Figures: healthy-replica stall (the longest gap between a surviving replica's commits over the
outage, from the kill to the restarted replica's first full step, minus a normal step;
`runtime.local.summary.outage_stall`), time to rejoin (relaunch -> first full step; and from the
restarted process's first quorum), and ETTR over the run (useful replica-steps x median step /
(replicas x wall time)). Targets: stall < 5 s, rejoin < 1 step after load, ETTR ratio vs sync > 1.
The three configurations run interleaved, `--repeat` times (default 5); medians and ranges go to
benchmarks/figures/recovery.json (and benchmarks/results/).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")

from benchmarks.harness import Run, interleave, repeats_arg  # noqa: E402
from slurm import contract  # noqa: E402

STEPS = int(os.environ.get("BENCH_STEPS", "80"))
KILL_AT = 20
CKPT_EVERY = 10
SLEEP = os.environ.get("BENCH_STEP_SLEEP_S", "0.1")


def ft(run_dir: Path, default_timeouts: bool) -> dict[str, Any]:
    from runtime.env import Timeouts
    from runtime.local.config import LaunchConfig
    from runtime.local.launcher import launch

    timeouts = Timeouts(5.0, 60.0, 61.0, 62.0) if default_timeouts else Timeouts()
    s = launch(
        LaunchConfig(
            run_dir=run_dir,
            command=[sys.executable, str(ROOT / "examples" / "train_tiny.py")],
            replicas=3,
            ranks_per_replica=1,
            steps=STEPS,
            kill_replica=2,
            kill_at_step=KILL_AT,
            timeouts=timeouts,
            extra_env={"TINY_STEP_SLEEP_S": SLEEP},
            run_timeout_s=600,
        )
    )
    return {
        "ok": s.ok,
        "healthy_stall_s": s.max_healthy_stall_s,
        "rejoin_s": s.rejoin_s[0] if s.rejoin_s else None,
        "rejoin_after_load_s": s.rejoin_after_load_s[0] if s.rejoin_after_load_s else None,
        "rejoin_after_load_steps": (
            s.rejoin_after_load_s[0] / s.median_step_s if s.rejoin_after_load_s else None
        ),
        "median_step_s": s.median_step_s,
        "ettr": s.ettr,
        "wall_s": s.wall_s,
        "weights_agree": s.weights_agree,
        "ledger_ok": s.ledger_ok,
    }


def _commits(path: Path) -> tuple[list[float], list[float], list[int]]:
    events = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    commits = [e["t"] for e in events if e["event"] == "commit"]
    joined = [e["t"] for e in events if e["event"] == "joined"]
    steps = [e["step"] for e in events if e["event"] == "commit"]
    return commits, joined, steps


def synchronous(run_dir: Path) -> dict[str, Any]:
    from runtime.baselines import start

    env = {"FTHSDP_CHECKPOINT_EVERY_STEPS": str(CKPT_EVERY), "TINY_STEP_SLEEP_S": SLEEP}
    progress = run_dir / "progress" / "plain.jsonl"
    procs = start("plain", run_dir, 3, 1, STEPS, extra_env=env)
    t_kill = t_restart = None
    try:
        while t_kill is None:
            if progress.exists():
                _, _, steps = _commits(progress)
                if steps and steps[-1] >= KILL_AT:
                    os.killpg(procs[2].pid, signal.SIGKILL)
                    t_kill = time.time()
            time.sleep(0.05)
        # a synchronous job cannot continue without the rank: stop all, restart from disk
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        t_restart = time.time()
        procs = start("plain", run_dir, 3, 1, STEPS, extra_env=env, tag="_restart")
        for p in procs:
            p.wait(timeout=600)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    commits, joined, steps = _commits(progress)
    gaps = [b - a for a, b in itertools.pairwise(commits)]
    median = statistics.median(gaps)
    before = [t for t in commits if t <= t_kill]
    after = [t for t in commits if t > t_kill]
    span = commits[-1] - joined[0]
    redone = len(steps) - len(set(steps))
    return {
        "stall_s": after[0] - before[-1] - median,
        "restart_to_first_step_s": after[0] - t_restart,
        "steps_redone": redone,
        "median_step_s": median,
        "ettr": min(1.0, STEPS * median / span),
        "wall_s": span,
    }


def main() -> None:
    repeats = repeats_arg()
    tmp = Path(tempfile.mkdtemp(prefix="fthsdp-recovery-"))
    count = itertools.count()
    configs: dict[str, Any] = {
        "ft_hsdp": lambda: ft(tmp / f"ft-{next(count)}", default_timeouts=False),
        "ft_default": lambda: ft(tmp / f"ftd-{next(count)}", default_timeouts=True),
        "synchronous": lambda: synchronous(tmp / f"sync-{next(count)}"),
    }
    run = Run(
        "recovery",
        "Recovery from one failure",
        f"3 replicas × 1 rank of `examples/train_tiny.py` ({SLEEP} s of work per step), "
        f"{STEPS} steps; replica 2 killed with SIGKILL at step {KILL_AT} and restarted at once. "
        "FT-HSDP with fthsdp's default timeouts (heartbeat "
        f"{contract.DEFAULT_HEARTBEAT_TIMEOUT_S:g} s) and with torchft's (heartbeat 5 s, 60 s for "
        "the others), and a synchronous job "
        f"(static HSDP, checkpoint every {CKPT_EVERY} steps: kill → restart every rank from the "
        "last checkpoint). The three configurations run interleaved; the ETTR ratio is taken "
        "within one repeat.",
        repeats,
    )
    got = interleave(configs, repeats)
    failed = [r for r in got["ft_hsdp"] + got["ft_default"] if not r["ok"]]
    if failed:
        raise SystemExit(f"recovery: an FT-HSDP run failed: {failed[0]}")
    ft_rows, dflt, sync = got["ft_hsdp"], got["ft_default"], got["synchronous"]
    run.row(
        "healthy replicas' stall, FT-HSDP", [r["healthy_stall_s"] for r in ft_rows], "s", "< 5 s"
    )
    run.row(
        "healthy replicas' stall, FT-HSDP with torchft's timeouts",
        [r["healthy_stall_s"] for r in dflt],
        "s",
    )
    run.row("stall of every rank, synchronous", [r["stall_s"] for r in sync], "s")
    run.row(
        "restarted replica: relaunch → participating, FT-HSDP",
        [r["rejoin_s"] for r in ft_rows if r["rejoin_s"] is not None],
        "s",
    )
    run.row(
        "restarted replica: first quorum → participating, in steps",
        [r["rejoin_after_load_steps"] for r in ft_rows if r["rejoin_after_load_steps"] is not None],
        "steps",
        "≤ 1 step after load",
        1,
    )
    run.row("ETTR over the run, FT-HSDP", [r["ettr"] for r in ft_rows], "", digits=2)
    run.row(
        "ETTR over the run, FT-HSDP with torchft's timeouts",
        [r["ettr"] for r in dflt],
        "",
        digits=2,
    )
    run.row("ETTR over the run, synchronous", [r["ettr"] for r in sync], "", digits=2)
    run.row(
        "ETTR FT-HSDP / synchronous",
        [a["ettr"] / b["ettr"] for a, b in zip(ft_rows, sync, strict=True)],
        "x",
        "> 1",
    )
    run.row("steps redone by the synchronous job", [r["steps_redone"] for r in sync], "", digits=0)
    bad = [r for r in ft_rows + dflt if not (r["weights_agree"] and r["ledger_ok"])]
    run.notes.append(
        f"- Every FT-HSDP run ended with agreeing weights and a clean ledger: "
        f"{'yes' if not bad else f'no ({len(bad)} runs did not)'}."
    )
    run.notes.append(
        "- A restarted replica waits for its first quorum, loads the healthy peers' state before "
        "its first forward pass and trains its own slot in that step, so from first quorum to "
        "participating is one step of its own; relaunch → participating adds process start, "
        "imports and the quorum's join wait, which depend on the host's load."
    )
    run.extra["runs"] = got
    run.write()


if __name__ == "__main__":
    main()
