"""End to end on the dev cluster: a torchft trainer fthsdp did not write gets per-group requeue.

3 replica groups of `examples/torchft_trainer.py` (torchft's Manager, DDP and Optimizer wrapper on
gloo; it knows nothing of fthsdp) under `[train] mode = "torchft"`, one node each, + the control
job (its Lighthouse is the trainers' `TORCHFT_LIGHTHOUSE`) + one spare node, on the session
cluster switched to health gating. The trainer reports nothing: each replica supervisor reads its
group's step from rank 0's `step: N` lines and reports it. An Xid 79 injected into group 1's node
is seen by that group's supervisor (the node watchdog on its node); the coordinator drains the
node and requeues group 1's job alone; groups 0 and 2 keep their jobs and keep stepping through
the outage; group 1 comes back on the spare node and heals from a peer through torchft's
checkpoint transport: its first step after the requeue is the peers' step, not 1.

The run is the job user's (`fthsdp-user`, through the site install); the node is drained by
root's health hooks, which find the Xid themselves (a job user's coordinator may not drain).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from control_harness import (
    ROOT,
    clean_up,
    fthsdp,
    health_gated,
    requeues_in_journal,
    submit_until_training,
    wait_until,
)
from user_harness import SiteUser

from slurm.backend import CommandBackend
from slurm.devcluster import DevClusterConfig

SPEC = """
[job]
name = "byo"
run_dir = "{run_dir}"
time = "00:20:00"
partition = "gpu"

[job.env]
OMP_NUM_THREADS = "1"
RUST_LOG = "warn"

[replicas]
count = 3
nodes = 1
gpus_per_node = 8
tasks_per_node = 1
cpus_per_task = 1
mem = "2G"

[control]
cpus = 1
mem = "1G"
python = "{python}"

[train]
mode = "torchft"
command = "{python} {root}/examples/torchft_trainer.py --steps 100000 --step-sleep 0.2"
progress_regex = 'step: (?P<step>\\d+)  loss:'
straggler_mode = "report"
min_replicas = 2
heartbeat_timeout_s = 2
allreduce_timeout_s = 10
quorum_timeout_s = 20
join_timeout_s = 30

[health]
checks = ["xid", "ecc"]
"""
STEP_LINE = re.compile(r"^0: step: (\d+)  loss:")


def log_tail(run_dir: Path, group: int, job_id: str, lines: int = 60) -> str:
    """The end of a group's replica job log, for a failure message."""
    path = run_dir / "logs" / f"replica-{group:02d}-{job_id}.out"
    text = path.read_text(errors="replace") if path.exists() else f"(no {path})"
    return "\n".join(text.splitlines()[-lines:])


def logged_steps(run_dir: Path, job_id: str, group: int = 1) -> list[int]:
    """Group rank 0's step lines in the replica job's log (both runs of a requeued job append).

    The trainer flushes a line after every iteration, so the log is the group's true step; the
    status table's step is the last one its supervisor reported, which lags under load."""
    path = run_dir / "logs" / f"replica-{group:02d}-{job_id}.out"
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return [int(m.group(1)) for m in map(STEP_LINE.match, lines) if m]


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_foreign_trainer_group_is_requeued_alone_and_heals(
    slurm_cluster: DevClusterConfig, site_user: SiteUser
) -> None:
    with health_gated(slurm_cluster) as gated:
        _foreign_group_requeued_alone(gated, site_user)


def _foreign_group_requeued_alone(gated: DevClusterConfig, env: SiteUser) -> None:
    run_dir = env.home / "run"
    spec = env.home / "spec.toml"
    env.write(spec, SPEC.format(run_dir=run_dir, python=env.python, root=ROOT))
    root_env = dict(os.environ)  # the operator's side: injecting the fault
    trace: list[tuple[float, dict[int, dict[str, Any]]]] = []
    drained: str | None = None
    try:
        before = submit_until_training(env, spec, run_dir, trace, min_step=20)
        jobs = {k: r["job_id"] for k, r in before.items()}
        victim = before[1]["nodes"][0]
        inject = ["cluster", "inject", victim, "--fault", "xid79", "--dir", str(gated.directory)]
        fthsdp(root_env, *inject)
        drained = victim
        t_fault = time.time()
        peers_at_fault = {k: (logged_steps(run_dir, jobs[k], k) or [0])[-1] for k in (0, 2)}
        requeued = wait_until(
            env, run_dir, lambda r: r[1]["restarts"] == 1, 120, "group 1 requeued", trace
        )
        # The first run's step is dead by now (stopped before the fatal report was sent).
        old_run = logged_steps(run_dir, jobs[1])
        peers_then = min(requeued[0]["step"] or 0, requeued[2]["step"] or 0)

        def stepping_again(r: dict[int, dict[str, Any]]) -> bool:
            return len(logged_steps(run_dir, jobs[1])) >= len(old_run) + 20

        t_requeued = time.time()
        after = wait_until(env, run_dir, stepping_again, 240, "group 1 stepping again", trace)
        t_back = time.time()
        # Group 1 moved off the bad node, which the coordinator drained with its reason.
        assert after[1]["nodes"][0] != victim
        (info,) = CommandBackend().nodes([victim])
        assert info.drained_by_us and info.reason.startswith("fthsdp: xid:"), info
        assert requeues_in_journal(run_dir, env) == [(jobs[1], "done")]
        # The others kept their jobs, never restarted, and stepped through the outage: each of
        # group 1's steps since it came back was committed with them, so their logs are at least
        # as far (one iteration's print may not have landed yet).
        new_run = logged_steps(run_dir, jobs[1])[len(old_run) :]
        for k in (0, 2):
            assert after[k]["job_id"] == jobs[k]
            assert after[k]["restarts"] == 0 and after[k]["relaunches"] == 0, (
                after[k],
                log_tail(run_dir, k, jobs[k]),
            )
            steps = [reps[k]["step"] or 0 for t, reps in trace if t_fault <= t <= t_back]
            assert steps == sorted(steps), steps
            peer_run = logged_steps(run_dir, jobs[k], k)
            assert peer_run == sorted(peer_run), peer_run[-30:]
            assert peer_run[-1] > peers_at_fault[k], (peers_at_fault[k], peer_run[-5:])
            assert peer_run[-1] >= new_run[-1] - 1, (k, peer_run[-5:], new_run[-5:])
        # Healed from a peer: the requeued run's first step is the peers' step, past where
        # group 1 stopped. The trainer keeps no state on disk, so a new process could only have
        # started again from step 1 (how far the peers got meanwhile is the machine's pace).
        assert new_run[0] >= peers_then, (old_run[-5:], peers_then, new_run[:5])
        assert new_run[0] > old_run[-1], (old_run[-5:], new_run[:5])
        assert new_run == sorted(new_run), new_run
        print(
            f"\nxid -> requeue seen {t_requeued - t_fault:.1f}s; -> 20 new steps "
            f"{t_back - t_fault:.1f}s; group 1 stopped at {old_run[-1]}, resumed at "
            f"{new_run[0]} (peers at {peers_then} when it was requeued)"
        )
        # `fthsdp status` shows every group's step.
        table = fthsdp(env, "status", str(run_dir))
        for k, r in after.items():
            assert (r["step"] or 0) > 0, (k, r)
        for k in range(3):
            row = rf"(?m)^\s*{k}\s+{after[k]['job_id']}\s+node\d\s+[1-9][0-9]*\s+training\s"
            assert re.search(row, table), table
    finally:
        clean_up(env, run_dir, gated, drained)
