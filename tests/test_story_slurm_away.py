"""End to end on the dev cluster: slurmctld goes away for a while, and a node fails meanwhile.

The run of `test_story_control_e2e.py` (3 one-node replicas of `examples/train_tiny.py` + the
control job, health gated, submitted by the job user through the site install). Once every
replica trains, root stops slurmctld (`fthsdp cluster controller stop`: it saves its state and
exits, as for an upgrade) and injects an Xid 79 into replica 2's node. For `OUTAGE_S` no Slurm
command answers. Then slurmctld starts again on its saved state.

What must hold: the leader's fatal report is taken during the outage with its own cause (an
Xid, not a silence verdict), checked against the allocation Slurm gave before it went away; its
drain and requeue wait until Slurm answers and are then carried out once; replica 2 comes back
on another node and catches up; replicas 0 and 1 keep their jobs, never restart, and their step
rises through the outage; `fthsdp status` answers throughout.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
from control_harness import (
    clean_up,
    fthsdp,
    health_gated,
    journal_summary,
    requeued_and_caught_up,
    wait_until,
    write_spec,
)
from user_harness import SiteUser

from slurm.devcluster import DevClusterConfig
from slurm.devcluster import controller as ctld

STEPS = 1500
#: How long slurmctld stays away: well past the coordinator's report timeout (a silent replica
#: would be judged in that time) and the leader's fatal report.
OUTAGE_S = 45.0

Trace = list[tuple[float, dict[int, dict[str, Any]]]]


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.one_release
@pytest.mark.timeout(600)
def test_a_node_fault_while_slurmctld_is_away_is_acted_on_once_it_is_back(
    slurm_cluster: DevClusterConfig, site_user: SiteUser
) -> None:
    with health_gated(slurm_cluster) as gated:
        _fault_while_slurm_is_away(gated, site_user)


def _status(env: SiteUser, run_dir: Any) -> dict[str, Any]:
    r = env.fthsdp("status", str(run_dir), "--json", timeout=60)
    assert r.returncode == 0, f"status failed with Slurm away: {r.stderr.strip()}"
    data: dict[str, Any] = json.loads(r.stdout)
    return data


def _fault_while_slurm_is_away(gated: DevClusterConfig, site_user: SiteUser) -> None:
    env = site_user.with_env(TINY_STEP_SLEEP_S="0.1")
    spec, run_dir = write_spec(env, STEPS, name="away")
    root_env = dict(os.environ)  # the operator's side: the outage and the fault
    trace: Trace = []
    victim: str | None = None
    try:
        fthsdp(env, "submit", str(spec))
        before = wait_until(
            env,
            run_dir,
            lambda r: all(x["state"] == "training" and (x["step"] or 0) >= 20 for x in r.values()),
            240,
            "all replicas training at step 20",
            trace,
        )
        jobs = {k: r["job_id"] for k, r in before.items()}
        victim = before[2]["nodes"][0]
        assert ctld.stop(gated) is not None
        t_away = time.monotonic()
        try:
            fthsdp(root_env, "cluster", "inject", victim, "--fault", "xid79", "--dir",
                   str(gated.directory))  # fmt: skip
            # While Slurm is away: status answers, the fault is known with its cause, and the
            # healthy replicas keep training.
            seen: list[dict[str, Any]] = []
            while time.monotonic() - t_away < OUTAGE_S:
                view = _status(env, run_dir)
                reps = {r["replica"]: r for r in view["replicas"]}
                seen.append(reps)
                trace.append((time.time(), reps))
                time.sleep(2)
            known = [r[2] for r in seen if r[2]["state"] != "training"]
            assert known, f"replica 2's fault never reached the coordinator: {seen[-1][2]}"
            last = str(known[-1].get("last_failure"))
            assert "silent" not in last and "xid" in last.lower(), known[-1]
            for k in (0, 1):
                steps = [r[k]["step"] or 0 for r in seen]
                assert steps[-1] > steps[0] and steps == sorted(steps), steps
        finally:
            ctld.start(gated)
        after = wait_until(
            env,
            run_dir,
            requeued_and_caught_up(2),
            300,
            "replica 2 requeued and caught up after the outage",
            trace,
        )
        assert after[2]["job_id"] == jobs[2] and after[2]["nodes"][0] != victim, after[2]
        for k in (0, 1):
            assert after[k]["job_id"] == jobs[k], after[k]
            assert after[k]["restarts"] == 0 and after[k]["relaunches"] == 0, after[k]
        summary = journal_summary(run_dir, env)
        # One requeue, carried out once Slurm answered, or found moot then (Slurm had put the
        # job back in the queue itself when the job's end reached it).
        ((job, status),) = summary["requeues"]
        assert job == jobs[2] and status in ("done", "skipped"), summary
        assert not [d for d in summary["drains"] if "silent" in d[2]], summary
        assert [d[0] for d in summary["drains"]] == [victim], summary
        print(f"slurm away: {json.dumps(summary)}")
    finally:
        ctld.start(gated)
        clean_up(env, run_dir, gated, victim)
