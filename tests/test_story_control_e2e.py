"""End to end on the dev cluster: only the failed replica is requeued; the others never stop.

3 replicas (one node each, 8 GRES GPUs, one CPU rank running `examples/train_tiny.py`) + the
control job + one spare node, on the session cluster switched to health gating
(`prolog_epilog.dev_health.health_settings`: simulated hardware, the project's Prolog/Epilog/
HealthCheckProgram, and a TaskProlog that points the ranks' watchdog at their node's hardware).
An Xid 79 injected into replica 1's node is seen by that replica's watchdog; the coordinator
drains the node with an `fthsdp:` reason and requeues replica 1's job exactly once; the job
passes the prolog on the spare node and rejoins, while replicas 0 and 2 keep their job ids and
restart count 0 and their committed step rises throughout. A second fault, `kill` (processes
die, no hardware sign), shows tier 1: relaunch in place, no requeue. Then the control plane's
process is killed (`kill -9`): its keeper restarts it in place, in the same job at the same
addresses, and no replica restarts. The run then finishes: the final weights of all replicas
agree and the ledger is exactly-once.

The run is a site user's: `fthsdp-user` submits it through the site install, and every process
of the live run (control job, trainers) runs as that user; root only runs the cluster, its
hooks and the fault injection. The coordinator cannot drain (a job user may not), so the Xid
node is drained by root's health hooks, which find the fault themselves.
"""

from __future__ import annotations

import os
import pwd
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from control_harness import (
    clean_up,
    control_info,
    fthsdp,
    health_gated,
    requeues_in_journal,
    wait_until,
    write_spec,
)
from user_harness import SiteUser, processes_of_run

from runtime.verdict import check_ledger, final_weights_agree
from slurm.backend import CommandBackend
from slurm.devcluster import DevClusterConfig

STEPS = 480


def caught_up(r: dict[int, dict[str, Any]]) -> bool:
    return (
        r[1]["state"] == "training"
        and (r[1]["step"] or 0) >= min(r[0]["step"] or 0, r[2]["step"] or 0) - 3
    )


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_only_the_failed_replica_is_requeued(
    slurm_cluster: DevClusterConfig, site_user: SiteUser
) -> None:
    with health_gated(slurm_cluster) as gated:
        _only_the_failed_replica_is_requeued(gated, site_user)


def assert_run_is_the_users(user: SiteUser, run_dir: Path, jobs: dict[int, str]) -> None:
    """Every process of the live run (its folder in the command line or environment) runs as
    the user, but Slurm's own step daemons and root's hooks; the trainers are among them."""
    uid = pwd.getpwnam(user.user).pw_uid
    found = processes_of_run([str(run_dir)])
    slurm_side = ("slurmstepd", "fthsdp-prolog", "fthsdp-epilog", "fthsdp-healthcheck")
    mine = {
        pid: (owner, cmd)
        for pid, (owner, cmd) in found.items()
        if not any(part in cmd.split(" ", 1)[0] for part in slurm_side)
    }
    as_root = {pid: cmd for pid, (owner, cmd) in mine.items() if owner != uid}
    assert not as_root, f"processes of the run not running as {user.user}: {as_root}"
    trainers = [cmd for _, cmd in mine.values() if "train_tiny.py" in cmd]
    assert len(trainers) >= len(jobs), (trainers, mine)


def _only_the_failed_replica_is_requeued(gated: DevClusterConfig, site_user: SiteUser) -> None:
    env = site_user.with_env(TINY_STEP_SLEEP_S="0.1")
    spec, run_dir = write_spec(env, STEPS)
    root_env = dict(os.environ)  # the operator's side: injecting faults into the cluster
    backend = CommandBackend()
    trace: list[tuple[float, dict[int, dict[str, Any]]]] = []
    drained: str | None = None
    try:
        fthsdp(env, "submit", str(spec))
        submitted = time.monotonic()
        training = wait_until(
            env,
            run_dir,
            lambda r: all(x["state"] == "training" for x in r.values()),
            120,
            "all replicas training",
            trace,
        )
        assert_run_is_the_users(site_user, run_dir, {k: r["job_id"] for k, r in training.items()})
        before = wait_until(
            env,
            run_dir,
            lambda r: all(x["state"] == "training" and (x["step"] or 0) >= 20 for x in r.values()),
            max(1.0, 120 - (time.monotonic() - submitted)),
            "all replicas training at step 20",
            trace,
        )
        jobs = {k: r["job_id"] for k, r in before.items()}
        victim = before[1]["nodes"][0]
        inject = ["cluster", "inject", "--dir", str(gated.directory)]
        fthsdp(root_env, *inject, victim, "--fault", "xid79")
        drained = victim
        t_fault = time.time()
        after = wait_until(
            env,
            run_dir,
            lambda r: r[1]["restarts"] == 1 and caught_up(r),
            120,
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
            # Never four status samples (>= 6 s on this machine) in a row without progress.
            runs = zip(steps, steps[1:], steps[2:], steps[3:], strict=False)
            assert all(len(set(run)) > 1 for run in runs), steps
        (info,) = backend.nodes([victim])
        # Drained by a root hook's xid check, or by the coordinator, whose kind for a leader's
        # node fault is its own (`fault`) with the watchdog's reason as the detail.
        drained_as = ("fthsdp: xid:", "fthsdp: fault: xid:")
        assert info.drained_by_us and info.reason.startswith(drained_as), info
        assert requeues_in_journal(run_dir, env) == [(jobs[1], "done")]

        # Tier 1: the replica's processes die with no hardware sign -> relaunch in place.
        new_node = after[1]["nodes"][0]
        assert after[1]["step"] < STEPS - 60, "too late in the run for the tier-1 scenario"
        fthsdp(root_env, *inject, new_node, "--fault", "kill")
        relaunched = wait_until(
            env,
            run_dir,
            lambda r: r[1]["relaunches"] >= 1 and caught_up(r),
            90,
            "replica 1 relaunched in place",
            trace,
        )
        assert relaunched[1]["job_id"] == jobs[1] and relaunched[1]["restarts"] == 1
        assert relaunched[1]["nodes"] == after[1]["nodes"]

        # Tier 0: the control plane's process is killed (the OOM killer, an operator's kill -9).
        # Its keeper restarts it in place: same job, same addresses, no replica restarted.
        first = control_info(run_dir)
        assert relaunched[1]["step"] < STEPS - 90, "too late in the run for the tier-0 scenario"
        os.kill(int(first["pid"]), signal.SIGKILL)
        deadline = time.monotonic() + 90
        while (second := control_info(run_dir)).get("pid") in (None, first["pid"]):
            assert time.monotonic() < deadline, f"the control plane was not restarted: {second}"
            time.sleep(0.5)
        for key in ("job_id", "lighthouse", "coordinator"):
            assert second[key] == first[key], (key, first, second)
        at = {k: r["step"] or 0 for k, r in relaunched.items()}
        back = wait_until(
            env,
            run_dir,
            lambda r: all(x["state"] == "training" and (x["step"] or 0) >= at[k] + 20
                          for k, x in r.items()),
            120,
            "every replica training past the control plane's restart in place",
            trace,
        )  # fmt: skip
        for k in range(3):
            assert back[k]["job_id"] == jobs[k]
            assert back[k]["restarts"] == relaunched[k]["restarts"], (k, back[k])
            assert back[k]["relaunches"] == relaunched[k]["relaunches"], (k, back[k])

        # The run finishes: every replica's job completes, nobody else ever restarted.
        final = wait_until(
            env,
            run_dir,
            lambda r: all(x["slurm_state"] == "COMPLETED" for x in r.values()),
            150,
            "the run to finish",
            trace,
        )
        assert final[0]["restarts"] == final[2]["restarts"] == 0
        assert [final[k]["job_id"] for k in range(3)] == [jobs[k] for k in range(3)]
        assert requeues_in_journal(run_dir, env) == [(jobs[1], "done")]
        assert final_weights_agree(run_dir, [0, 1, 2])
        ledger = check_ledger(run_dir, STEPS)
        assert ledger.ok, ledger.problems
    finally:
        clean_up(env, run_dir, gated, drained)
