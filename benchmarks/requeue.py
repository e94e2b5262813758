"""Per-replica requeue on the dev cluster: time from a node fault to the replacement participating.

Runs on a fresh local dev cluster with health gating (`cluster up --health`: simulated hardware,
the project's Prolog/Epilog/HealthCheckProgram; root, slurm-wlm, munge): 3 replicas x 1 CPU rank
of `examples/train_tiny.py` + the control job + a spare node. An Xid 79 is injected into replica
1's node; the phases come from the coordinator's journal:

- detect: injection -> the leader's fatal report (the watchdog saw the Xid);
- drain+requeue: report -> Slurm's requeue and release done;
- allocate+prolog: -> squeue shows the job RUNNING again (on the spare node);
- start+load: -> the new incarnation's first report;
- catch-up: -> its step is level with the healthy replicas'.

The healthy replicas' stall is the longest time either of them went without a higher step in
its reports during the outage, minus its normal reporting interval. The baseline is the
same fault handled by requeuing every replica's job (all restart), measured the same way.
The two scenarios run interleaved, `--repeat` times (default 5), each on a fresh cluster; medians
and ranges go to benchmarks/figures/requeue.json (and benchmarks/results/).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from control_harness import cancel, fthsdp, replicas, write_spec  # noqa: E402

from benchmarks.harness import Run, interleave, repeats_arg  # noqa: E402
from prolog_epilog import dev_health  # noqa: E402
from runtime.control.journal.store import Journal  # noqa: E402
from slurm import devcluster  # noqa: E402
from slurm.backend import make_backend  # noqa: E402


def _reports(run_dir: Path) -> list[tuple[float, dict[str, Any]]]:
    journal = Journal.in_run_dir(run_dir)
    try:
        out = []
        for _, ev in journal.events():
            if type(ev).__name__ == "ReportReceived":
                out.append((ev.at, ev.report.__dict__))  # type: ignore[union-attr]
            elif type(ev).__name__ == "JobObserved":
                out.append((ev.at, {"observed": ev.__dict__}))
        return out
    finally:
        journal.close()


def _attempts(run_dir: Path, kind: str) -> list[float]:
    import sqlite3

    db = sqlite3.connect(run_dir / "control.sqlite")
    try:
        rows = db.execute(
            "SELECT t.at FROM attempts t JOIN actions a ON a.id = t.action_id"
            " WHERE a.type = ? AND t.outcome = 'done' ORDER BY t.at",
            (kind,),
        ).fetchall()
    finally:
        db.close()
    return [float(r[0]) for r in rows]


def _stall(events: list[tuple[float, dict[str, Any]]], k: int, t0: float, t1: float) -> float:
    """Longest time replica k's reported step did not rise in [t0, t1], minus its usual gap."""
    pts = [(t, e["step"]) for t, e in events if e.get("replica") == k and e.get("kind") == "status"]
    rises = [t for (t, s), (_, prev) in zip(pts[1:], pts, strict=False) if s > prev]
    normal = sorted(b - a for a, b in itertools.pairwise(rises))
    usual = normal[len(normal) // 2] if normal else 0.0
    window = [t for t in rises if t0 <= t <= t1] or [t0]
    gaps = [b - a for a, b in zip([t0, *window], [*window, t1], strict=False)]
    return max(0.0, max(gaps) - usual)


def run_scenario(cfg: devcluster.DevClusterConfig, work: Path, whole_job: bool) -> dict[str, Any]:
    # Long enough never to finish during the measurement; cancelled at the end.
    spec, run_dir = write_spec(work, steps=100000, name="bench")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TINY_STEP_SLEEP_S="0.1")
    backend = make_backend()
    fthsdp(env, "submit", str(spec))
    try:
        deadline = time.monotonic() + 240
        while True:
            reps = replicas(env, run_dir)
            if all(r["state"] == "training" and (r["step"] or 0) >= 30 for r in reps.values()):
                break
            assert time.monotonic() < deadline, reps
            time.sleep(1)
        jobs = {k: r["job_id"] for k, r in reps.items()}
        victim = reps[1]["nodes"][0]
        t_fault = time.time()
        if whole_job:
            # Baseline: the fault takes the whole job down; every replica is requeued.
            backend.drain(victim, "fthsdp: bench: whole-job baseline")
            for job in jobs.values():
                backend.requeue(job)
            for job in jobs.values():
                while [j for j in backend.jobs([job]) if j.state != "PENDING"]:
                    time.sleep(0.2)
                backend.release(job)
        else:
            fthsdp(
                env, "cluster", "inject", victim, "--fault", "xid79", "--dir", str(cfg.directory)
            )
        deadline = time.monotonic() + 300
        must_restart = {0, 1, 2} if whole_job else {1}
        went_down: set[int] = set()
        while True:
            reps = replicas(env, run_dir)
            went_down |= {k for k in must_restart if reps[k]["state"] != "training"}
            level = min(reps[0]["step"] or 0, reps[2]["step"] or 0)
            if (
                went_down == must_restart
                and all(reps[k]["state"] == "training" for k in must_restart)
                and reps[1]["step"] >= level - 1
            ):
                break
            assert time.monotonic() < deadline, reps
            time.sleep(0.5)
        t_caught_up = time.time()
        events = _reports(run_dir)
        out: dict[str, Any] = {"whole_job": whole_job, "fault_to_participating_s": 0.0}
        fatal = [t for t, e in events if e.get("replica") == 1 and e.get("kind") == "fatal"]
        running = [
            t
            for t, e in events
            if "observed" in e
            and e["observed"]["replica"] == 1
            and e["observed"]["restarts"] == 1
            and e["observed"]["state"] == "RUNNING"
        ]
        new_reports = [
            t
            for t, e in events
            if e.get("replica") == 1 and e.get("kind") == "status" and t > t_fault
            and (running and t >= running[0])
        ]  # fmt: skip
        released = [t for t in _attempts(run_dir, "Release") if t > t_fault]
        t_detect = fatal[0] if fatal else t_fault
        t_release = released[0] if released else t_detect
        t_running = running[0] if running else t_release
        t_first = new_reports[0] if new_reports else t_running
        out.update(
            detect_s=round(t_detect - t_fault, 2),
            drain_requeue_s=round(t_release - t_detect, 2),
            allocate_prolog_s=round(t_running - t_release, 2),
            start_load_s=round(t_first - t_running, 2),
            catch_up_s=round(t_caught_up - t_first, 2),
            fault_to_participating_s=round(t_caught_up - t_fault, 2),
            healthy_stall_s=round(max(_stall(events, k, t_fault, t_caught_up) for k in (0, 2)), 2),
        )
        return out
    finally:
        cancel(env, run_dir)


PHASES = (
    "detect_s",
    "drain_requeue_s",
    "allocate_prolog_s",
    "start_load_s",
    "catch_up_s",
    "fault_to_participating_s",
    "healthy_stall_s",
)


LABELS = {
    "detect_s": "detect (in-job watchdog)",
    "drain_requeue_s": "drain + requeue",
    "allocate_prolog_s": "allocate + prolog",
    "start_load_s": "start + load",
    "catch_up_s": "catch-up",
    "fault_to_participating_s": "**fault → replacement participating**",
    "healthy_stall_s": "**healthy replicas' stall**",
}
TARGETS = {"fault_to_participating_s": "≤ 30 s", "healthy_stall_s": "< 5 s"}


def one(whole_job: bool) -> dict[str, Any]:
    """One scenario on a fresh health-gated dev cluster."""
    with tempfile.TemporaryDirectory(prefix="fthsdp-bench-") as tmp:
        work = Path(tmp)
        base = devcluster.free_port_block(6, start=24000 + (os.getpid() % 100) * 10)
        cfg = dev_health.with_health(
            devcluster.DevClusterConfig(
                directory=work / "cluster", ctld_port=base, slurmd_base_port=base + 1
            )
        )
        with devcluster.running_cluster(cfg) as running:
            os.environ["SLURM_CONF"] = str(running.conf_path)
            out = run_scenario(running, work, whole_job)
    print("whole_job" if whole_job else "per_replica", json.dumps(out), flush=True)
    return out


def main() -> None:
    repeats = repeats_arg()
    run = Run(
        "requeue",
        "Per-replica requeue on Slurm",
        "The dev cluster (4 nodes, health-gated: the project's Prolog on every allocation), "
        "3 replicas × 1 rank of `examples/train_tiny.py` + control job + one spare node, a fresh "
        "cluster per run. An Xid 79 is injected into replica 1's node; the per-replica path "
        "(watchdog → coordinator → drain + `scontrol requeue` of that job → prolog on the spare "
        "node → start → heal) against a whole-job requeue baseline (every replica requeued), "
        "interleaved. The baseline skips detection (counted 0) and restarts from step 0.",
        repeats,
    )
    got = interleave({"per_replica": lambda: one(False), "whole_job": lambda: one(True)}, repeats)
    for phase in PHASES:
        run.row(
            f"{LABELS[phase]}, per-replica",
            [r[phase] for r in got["per_replica"]],
            "s",
            TARGETS.get(phase),
            2,
        )
        run.row(
            f"{LABELS[phase]}, whole-job baseline",
            [r[phase] for r in got["whole_job"]],
            "s",
            digits=2,
        )
    run.row(
        "healthy stall, per-replica / whole-job",
        [
            a["healthy_stall_s"] / b["healthy_stall_s"]
            for a, b in zip(got["per_replica"], got["whole_job"], strict=True)
            if b["healthy_stall_s"] > 0
        ],
        "x",
    )
    run.extra["runs"] = got
    run.write()


if __name__ == "__main__":
    main()
