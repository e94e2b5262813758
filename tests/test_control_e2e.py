"""End to end on the dev cluster: only the failed replica is requeued; the others never stop.

3 replicas (one node each, 8 GRES GPUs, one CPU rank running `examples/train_tiny.py`) + the
control job + one spare node. An Xid 79 injected into replica 1's node is seen by that replica's
watchdog; the coordinator drains the node with an `fthsdp:` reason and requeues replica 1's job
exactly once; the job restarts on the spare node and rejoins, while replicas 0 and 2 keep their
job ids and restart count 0 and their committed step rises throughout. A second fault, `kill`
(processes die, no hardware sign), shows tier 1: relaunch in place, no requeue.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from control_harness import ROOT, clean_up, fthsdp, requeued_and_caught_up, wait_until, write_run

from runtime.control.journal import Journal
from runtime.control.policy import Requeue
from slurm.backend import CommandBackend
from slurm.devcluster import DevClusterConfig


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_only_the_failed_replica_is_requeued(
    slurm_cluster: DevClusterConfig, tmp_path: Path
) -> None:
    spec, run_dir, hw = write_run(tmp_path, slurm_cluster.node_names)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TINY_STEP_SLEEP_S="0.1")
    backend = CommandBackend()
    trace: list[tuple[float, dict[int, dict[str, Any]]]] = []
    drained: str | None = None
    try:
        fthsdp(env, "submit", str(spec))
        before = wait_until(
            env,
            run_dir,
            lambda r: all(x["state"] == "training" and (x["step"] or 0) >= 20 for x in r.values()),
            240,
            "all replicas training",
            trace,
        )
        jobs = {k: r["job_id"] for k, r in before.items()}
        victim = before[1]["nodes"][0]
        fthsdp(env, "cluster", "inject", victim, "--fault", "xid79", "--hardware-root", str(hw))
        drained = victim
        t_fault = time.time()
        after = wait_until(
            env,
            run_dir,
            requeued_and_caught_up(1),
            300,
            "replica 1 requeued and caught up",
            trace,
        )
        t_rejoined = time.time()
        # Replica 1 moved off the bad node; the others never restarted.
        assert after[1]["nodes"][0] != victim
        for k in (0, 2):
            assert after[k]["job_id"] == jobs[k]
            assert after[k]["restarts"] == 0
            assert after[k]["relaunches"] == 0
        # ... and their step rose throughout the outage.
        during = [reps for t, reps in trace if t_fault <= t <= t_rejoined]
        for k in (0, 2):
            steps = [reps[k]["step"] for reps in during]
            assert steps == sorted(steps) and steps[-1] > steps[0], steps
            # Never three samples (~6 s) in a row without progress.
            triples = zip(steps, steps[1:], steps[2:], strict=False)
            assert all(len({a, b, c}) > 1 for a, b, c in triples), steps
        (info,) = backend.nodes([victim])
        assert info.drained_by_us and info.reason.startswith("fthsdp: xid:"), info
        journal = Journal.in_run_dir(run_dir)
        try:
            requeues = [
                (s.action.job_id, s.status)
                for s in journal.actions()
                if isinstance(s.action, Requeue)
            ]
        finally:
            journal.close()
        assert requeues == [(jobs[1], "done")]

        # Tier 1: the replica's processes die with no hardware sign -> relaunch in place.
        new_node = after[1]["nodes"][0]
        fthsdp(env, "cluster", "inject", new_node, "--fault", "kill")
        final = wait_until(
            env,
            run_dir,
            lambda r: (
                r[1]["relaunches"] == 1
                and r[1]["state"] == "training"
                and (r[1]["step"] or 0) >= min(r[0]["step"], r[2]["step"]) - 3
            ),
            120,
            "replica 1 relaunched in place",
            trace,
        )
        assert final[1]["job_id"] == jobs[1] and final[1]["restarts"] == 1
        assert final[1]["nodes"] == after[1]["nodes"]
        assert final[0]["restarts"] == final[2]["restarts"] == 0
        journal = Journal.in_run_dir(run_dir)
        try:
            assert len([s for s in journal.actions() if isinstance(s.action, Requeue)]) == 1
        finally:
            journal.close()
    finally:
        clean_up(env, run_dir, hw, drained)
