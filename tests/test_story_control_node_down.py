"""End to end on the dev cluster: the node of the control job loses power, and a replica with it.

3 replicas (one node each, `examples/train_tiny.py`) + the control job on the health-gated
session cluster, submitted by the job user. Slurm puts the control job beside a replica (the
dev cluster has one spare node, and the control job asks for one CPU). Once every replica
trains, root powers that node off (`fthsdp cluster inject NODE --fault down`: its slurmd and
every process of its jobs die at once). Slurm finds the node down and requeues both jobs by
itself; nobody releases anything by hand.

What is asserted:

- the control plane comes back by itself: the surviving replicas' supervisors release the
  requeued control job from Slurm's requeue delay, and it rewrites `control.json` (new pid);
- the replicas on other nodes never restart: same job, restart count 0, no relaunch (the same
  worker processes, so the same torchft incarnation), and their steps keep rising after the
  control plane is back, never going back;
- the replica that shared the node is requeued by Slurm alone (no requeue of the coordinator's
  in the journal), comes back elsewhere and catches up;
- the run finishes every step with a clean ledger and agreeing weights, none rolled back.

It prints the control plane's downtime and the survivors' longest stall (the longest time
their committed step stood still).

`make test` runs it on the host's release (`one_release`, for the time budget); `make test-slurm`
runs it on any release.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

import pytest
from control_harness import (
    clean_up,
    control_info,
    control_node,
    fthsdp,
    heal_node,
    health_gated,
    node_state,
    requeues_in_journal,
    submit_until_training,
    wait_until,
    write_spec,
)
from user_harness import SiteUser

from runtime.verdict import check_ledger, final_weights_agree
from slurm.devcluster import DevClusterConfig

STEPS = 500
Trace = list[tuple[float, dict[int, dict[str, Any]]]]


def longest_stall(trace: Trace, k: int, since: float) -> float:
    """The longest time replica `k`'s step stood still in the trace after `since`."""
    points = [(t, reps[k]["step"] or 0) for t, reps in trace if t >= since and k in reps]
    longest, last_change = 0.0, points[0][0] if points else since
    for (_, a), (t, b) in itertools.pairwise(points):
        if b != a:
            longest = max(longest, t - last_change)
            last_change = t
    return longest


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.one_release
@pytest.mark.timeout(720)
def test_replicas_elsewhere_never_restart_when_the_control_node_loses_power(
    slurm_cluster: DevClusterConfig, site_user: SiteUser
) -> None:
    with health_gated(slurm_cluster) as gated:
        _control_node_down(gated, site_user)


def _control_node_down(gated: DevClusterConfig, user: SiteUser) -> None:
    env = user.with_env(TINY_STEP_SLEEP_S="0.1")
    spec, run_dir = write_spec(env, STEPS, name="ctldown")
    root_env = dict(os.environ)
    trace: Trace = []
    node: str | None = None
    try:
        before = submit_until_training(env, spec, run_dir, trace)
        jobs = {k: r["job_id"] for k, r in before.items()}
        first = control_info(run_dir)
        node = control_node(run_dir)
        struck = [k for k, r in before.items() if node in r["nodes"]]
        healthy = [k for k in before if k not in struck]
        assert healthy, f"every replica shares {node} with the control job: {before}"
        fthsdp(root_env, "cluster", "inject", "--dir", str(gated.directory), node,
               "--fault", "down")  # fmt: skip
        t_down = time.time()
        print(f"power lost on {node} (control job, replicas {struck})")

        deadline = time.monotonic() + 300
        while (second := control_info(run_dir)).get("pid") in (None, first["pid"]):
            assert time.monotonic() < deadline, f"the control plane did not come back: {second}"
            wait_until(env, run_dir, lambda _r: True, 60, "status", trace)
            time.sleep(1)
        t_back = time.time()
        at_back = {k: (r["step"] or 0) for k, r in trace[-1][1].items()}
        after = wait_until(
            env,
            run_dir,
            lambda r: (
                all(
                    x["state"] == "training" and (x["step"] or 0) >= at_back[k] + 30
                    for k, x in r.items()
                    if k in healthy
                )
                and all(r[k]["restarts"] >= 1 and r[k]["state"] == "training" for k in struck)
            ),
            300,
            "the survivors training past the control plane's return, the struck ones back",
            trace,
        )
        for k in healthy:
            assert after[k]["job_id"] == jobs[k]
            assert (after[k]["restarts"], after[k]["relaunches"]) == (0, 0), after[k]
            seen = [reps[k]["step"] or 0 for t, reps in trace if t >= t_down and k in reps]
            assert seen == sorted(seen), (k, seen)
        assert node_state(node).startswith("down")
        heal_node(gated, node)
        node = None
        final = wait_until(
            env,
            run_dir,
            lambda r: all(x["slurm_state"] == "COMPLETED" for x in r.values()),
            400,
            "the run finished",
            trace,
        )
        for k in healthy:
            assert (final[k]["job_id"], final[k]["restarts"]) == (jobs[k], 0), final[k]
        # Slurm requeued the struck jobs by itself; the coordinator requeued nothing.
        assert requeues_in_journal(run_dir, env) == []
        verdict = check_ledger(run_dir, STEPS)
        assert verdict.ok, verdict.problems[:5]
        assert verdict.rolled_back == 0, verdict.rolled_back
        assert final_weights_agree(run_dir, [0, 1, 2]), "the final weights differ"
        stalls = {k: round(longest_stall(trace, k, t_down), 1) for k in healthy}
        print(
            f"control node down: control plane back after {t_back - t_down:.1f}s; "
            f"survivors' longest stall {stalls}; replicas {struck} requeued by Slurm"
        )
    finally:
        if node is not None:
            heal_node(gated, node)
        clean_up(env, run_dir, gated, None)
