"""Does a short Lighthouse heartbeat timeout drop live replicas on a loaded Slurm cluster?

A 0.5 s heartbeat timeout brings the healthy replicas' stall after a crash under 1 s
(`benchmarks/survivor_stall.py`), but a live replica whose heartbeats arrive later than the
timeout is left out of a quorum too, and heals back a step later. On Slurm a worker's heartbeats
cross its supervisor's forwarder and the control job's gate (two Python hops), on nodes that
share this machine's two cores. This runs fault-free jobs on the dev cluster with CPU burners
beside them and counts what no kill explains: steps committed by fewer than every replica, steps
aborted, and heals after a replica's first join. Two heartbeat timeouts, interleaved.

    python benchmarks/heartbeat_drops.py [--repeat N] [--burners N] [--steps N] [--name NAME]

`--name` keeps a second set of figures beside the first (the same jobs under more burners).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from control_harness import cancel, fthsdp, write_spec  # noqa: E402

from benchmarks.harness import Run, interleave  # noqa: E402
from prolog_epilog import dev_health  # noqa: E402
from slurm import devcluster  # noqa: E402

HEARTBEATS_S = (2.0, 0.5)
REPLICAS = 3
#: Longest one run may take, start to finish, before it counts as failed.
RUN_LIMIT_S = 600.0


def events(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    out = {}
    for r in range(REPLICAS):
        path = run_dir / "progress" / f"r{r}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        out[r] = [json.loads(x) for x in lines if x.strip()]
    return out


def count(evs: dict[int, list[dict[str, Any]]]) -> dict[str, int]:
    """What a fault-free run should not have once every replica trained together: steps short
    of a replica, aborts, and heals after an incarnation's first join (it fell behind while
    alive)."""
    full = [
        e["t"]
        for es in evs.values()
        for e in es
        if e["event"] == "commit" and int(e.get("participants") or 0) == REPLICAS
    ]
    start = min(full, default=float("inf"))  # before it, replicas were still starting
    short = {
        e["step"]
        for es in evs.values()
        for e in es
        if e["event"] == "commit" and e["t"] > start and int(e.get("participants") or 0) < REPLICAS
    }
    aborts = sum(1 for es in evs.values() for e in es if e["event"] == "abort" and e["t"] > start)
    late_heals = 0
    for es in evs.values():
        joined: set[str] = set()
        for e in es:
            inc = str(e.get("incarnation"))
            if e["event"] == "joined":
                joined.add(inc)
            elif e["event"] == "healed" and inc in joined and int(e.get("step") or 0) > 1:
                late_heals += 1
    last = max((e["step"] for es in evs.values() for e in es if e["event"] == "commit"), default=-1)
    return {
        "steps_short_of_a_replica": len(short),
        "aborted_steps": aborts,
        "heals_after_join": late_heals,
        "last_step": last + 1,
    }


class LoadSampler:
    """The 1-minute load average, once every few seconds, in a thread: the load the runs saw,
    not only the load at the ends of the benchmark."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(every_s,), daemon=True)

    def _loop(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def one(root: Path, heartbeat_s: float, steps: int) -> dict[str, Any]:
    """One fault-free job set on the running cluster (`SLURM_CONF` names it)."""
    work = Path(tempfile.mkdtemp(prefix=f"hb{heartbeat_s:g}-", dir=root))
    work.chmod(0o755)
    spec, run_dir = write_spec(work, steps=steps, name=f"hb{int(heartbeat_s * 1000)}")
    line = f"heartbeat_timeout_s = {heartbeat_s:g}"
    text, n = re.subn(r"(?m)^heartbeat_timeout_s = .*$", line, spec.read_text())
    if n != 1:
        raise SystemExit(f"heartbeat_drops: {spec} has {n} heartbeat_timeout_s lines, not 1")
    spec.write_text(text)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TINY_STEP_SLEEP_S="0.1")
    fthsdp(env, "submit", str(spec))
    t0 = time.monotonic()
    try:
        while not (run_dir / "finished").exists():
            if time.monotonic() - t0 > RUN_LIMIT_S:
                return {"ok": False, **count(events(run_dir))}
            time.sleep(1)
        time.sleep(2)  # the last commits' lines
        return {"ok": True, "wall_s": round(time.monotonic() - t0, 1), **count(events(run_dir))}
    finally:
        cancel(env, run_dir)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--burners", type=int, default=2, help="busy loops beside the jobs")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--name", default="heartbeat_drops", help="the figures' name")
    args = parser.parse_args()
    if args.repeat < 1 or args.burners < 0 or args.steps < 10:
        raise SystemExit("heartbeat_drops: --repeat >= 1, --burners >= 0, --steps >= 10")
    root = Path(tempfile.mkdtemp(prefix="fthsdp-hb-drops-"))
    root.chmod(0o755)  # slurmctld (user slurm) reads the cluster's files under it
    base = devcluster.free_port_block(6, start=25000 + (os.getpid() % 100) * 10)
    cfg = dev_health.with_health(
        devcluster.DevClusterConfig(
            directory=root / "cluster", ctld_port=base, slurmd_base_port=base + 1
        )
    )
    run = Run(
        args.name,
        "Live replicas dropped by a short heartbeat timeout, loaded dev cluster",
        f"The dev cluster (4 nodes, health-gated), {REPLICAS} replicas x 1 rank of "
        f"`examples/train_tiny.py` (0.1 s of sleep per step) + the control job, submitted by "
        f"`fthsdp submit`; {args.steps} steps, no fault; {args.burners} busy loops beside the "
        "jobs on the 2 cores. Heartbeats cross the supervisor's forwarder and the control job's "
        "gate. Lighthouse heartbeat timeouts "
        f"{', '.join(f'{h:g} s' for h in HEARTBEATS_S)}, runs interleaved, one job set at a time.",
        args.repeat,
        script="benchmarks/heartbeat_drops.py",
    )
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(args.burners)
    ]
    try:
        with LoadSampler() as load, devcluster.running_cluster(cfg) as running:
            os.environ["SLURM_CONF"] = str(running.conf_path)
            configs = {
                f"heartbeat {hb:g} s": (lambda hb=hb: one(root, hb, args.steps))
                for hb in HEARTBEATS_S
            }
            got = interleave(configs, args.repeat)
    finally:
        for b in burners:
            with contextlib.suppress(ProcessLookupError):
                b.kill()
            b.wait()
    for name, runs in got.items():
        for key in ("steps_short_of_a_replica", "aborted_steps", "heals_after_join"):
            run.row(f"{name}: {key.replace('_', ' ')} per run", [r[key] for r in runs], digits=0)
        run.notes.append(
            f"- {name}: {sum(r['ok'] for r in runs)} of {len(runs)} runs finished all "
            f"{args.steps} steps."
        )
    if load.samples:
        run.notes.append(
            f"- 1-minute load average during the runs (every 5 s, {len(load.samples)} samples): "
            f"median {statistics.median(load.samples):.1f}, max {max(load.samples):.1f}."
        )
    run.extra["runs"] = got
    run.extra["loadavg_1min_samples"] = [round(x, 2) for x in load.samples]
    run.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
