"""A replica whose node lost power is requeued by Slurm, not by the coordinator, and keeps its GPUs.

On the dev cluster, a GPU job requeued by its owner while its node is powered off (before
slurmctld has marked it DOWN) stays COMPLETING there. Once the node is DOWN, 22.05 starts it
elsewhere with no GRES (`JOB_GRES=(null)`, every srun refused "Invalid generic resource (gres)
specification") and counts the new node's GPUs as used for good; 24.11 and 26.05 requeue it once
more, held back ~120 s. Here the job user's coordinator executor is handed that Requeue the
moment the node dies: it must wait, leave the requeue to Slurm, and the job's next run must
start promptly with its GPUs (srun works).
"""

from __future__ import annotations

import json
import time

import pytest
from control_harness import wait_for
from user_harness import SiteUser

from slurm.backend import CommandBackend
from slurm.devcluster import DevClusterConfig
from slurm.devcluster.power import power_off, power_on

EXECUTOR = """
import asyncio, json, sys, time
from runtime.control.executor import SlurmExecutor
from runtime.control.journal.schema import StoredAction
from runtime.control.policy import Release, Requeue
from slurm.backend import CommandBackend

job, node, heard = sys.argv[1], sys.argv[2], float(sys.argv[3])
attempts = []

async def record(action_id, outcome, detail):
    attempts.append([action_id, outcome, detail])

async def main():
    ex = SlurmExecutor(CommandBackend(), retries=3, backoff_s=0.5)
    for k, action in enumerate([Requeue(0, job, 0, heard), Release(0, job, 0.0, (node,))]):
        await ex.carry_out(StoredAction(k, 1, action, "decided", 0), False, record)

asyncio.run(asyncio.wait_for(main(), 150))
print(json.dumps(attempts))
"""


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_a_job_on_a_dead_node_is_left_to_slurm_and_keeps_its_gpus(
    slurm_cluster: DevClusterConfig, site_user: SiteUser
) -> None:
    folder = site_user.folder("dead-node")
    log = folder / "runs.txt"
    script = folder / "job.sh"
    site_user.write(
        script,
        "#!/bin/bash\n"
        f'echo "run ${{SLURM_RESTART_COUNT:-0}} on $SLURMD_NODENAME" >> {log}\n'
        f"if srun -n1 true; then echo srun-ok >> {log}; else echo srun-failed >> {log}; fi\n"
        "sleep 300\n",
    )
    sub = site_user.run(
        ["sbatch", "--parsable", "--requeue", "--nodes=1", "--gres=gpu:8",
         "--job-name=dead-node", f"--output={folder}/out-%j.txt", str(script)],
        cwd=folder,
    )  # fmt: skip
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    backend = CommandBackend()
    node = None
    try:
        wait_for(lambda: log.exists() and "srun-ok" in log.read_text(), 90, "the first srun")
        (first,) = [j for j in backend.jobs([job_id]) if j.job_id == job_id]
        node = first.nodes
        heard = time.time()
        assert power_off(slurm_cluster, node)
        done = site_user.run(
            [str(site_user.python), "-c", EXECUTOR, job_id, node, str(heard)],
            timeout=200,
            cwd=folder,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        attempts = json.loads(done.stdout)
        requeue = [a for a in attempts if a[0] == 0]
        assert any(o == "retry" and d.startswith("waiting: ") for _, o, d in requeue), attempts
        assert requeue[-1][1] == "skipped" and "already requeued" in requeue[-1][2], attempts
        assert [a[1] for a in attempts if a[0] == 1][-1] == "done", attempts

        wait_for(lambda: log.read_text().count("srun-") >= 2, 90, "the requeued run's srun")
        runs = log.read_text().splitlines()
        assert runs[0] == f"run 0 on {node}" and runs[1] == "srun-ok", runs
        assert runs[2].startswith("run 1 on ") and node not in runs[2], runs
        assert runs[3] == "srun-ok", f"the requeued run got no GPUs: {runs}"
    finally:
        backend.cancel([job_id])
        if node is not None:
            power_on(slurm_cluster, node)
            wait_for(lambda: all(n.in_service for n in backend.nodes([node])), 120, f"{node} back")


PROBE = """
import json, sys
from slurm.backend import CommandBackend
b = CommandBackend()
parts = [j for j in b.jobs([sys.argv[1]]) if j.base_id == sys.argv[1]]
print(json.dumps([[j.het_offset, j.nodes, b.step_runs(sys.argv[1], j.nodes, 30, j.het_offset)]
                  for j in parts]
                 + [["gone", parts[0].nodes, b.step_runs("999999", parts[0].nodes, 30)]]))
"""


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_a_step_of_each_het_component_proves_its_node_alive(
    slurm_cluster: DevClusterConfig, site_user: SiteUser
) -> None:
    """The executor's proof that a silent replica's nodes are alive: its owner runs a one-task
    step in each het component (as a replica job is built) beside the component's own steps,
    which hold every CPU and GPU; a job that is not there proves nothing."""
    folder = site_user.folder("probe")
    script = folder / "job.sh"
    started = folder / "started"
    site_user.write(
        script,
        "#!/bin/bash\n"
        "#SBATCH --nodes=1 --gres=gpu:8 --exclusive\n"
        "#SBATCH hetjob\n"
        "#SBATCH --nodes=1 --gres=gpu:8 --exclusive\n"
        f"srun --het-group=0,1 --exact bash -c 'touch {started}.$SLURM_PROCID; sleep 300' &\n"
        "wait\n",
    )
    sub = site_user.run(
        ["sbatch", "--parsable", "--job-name=probe", f"--output={folder}/out-%j.txt", str(script)],
        cwd=folder,
    )
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0].split("+")[0]
    try:
        wait_for(lambda: len(list(folder.glob("started.*"))) == 2, 90, "both components' step")
        probe = site_user.run([str(site_user.python), "-c", PROBE, job_id], timeout=120, cwd=folder)
        assert probe.returncode == 0, probe.stderr[-2000:]
        found = json.loads(probe.stdout)
        assert [(p[0], p[2]) for p in found] == [(0, True), (1, True), ("gone", False)], found
        assert found[0][1] != found[1][1], found
    finally:
        CommandBackend().cancel([job_id])
