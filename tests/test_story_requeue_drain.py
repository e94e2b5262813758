"""`fthsdp requeue RUN --replica K --drain NODE` drains only a node of replica K's own job.

On the real dev cluster, with two real one-node jobs standing in for a run's replicas: an
unknown node (an operator's typo) and the other replica's node are refused with exit 2 and
nothing is drained, both through a running coordinator and through the direct-Slurm fallback
(no coordinator).

Everything runs as a site's job user, `fthsdp-user`: the jobs, the coordinator and the
operator's `fthsdp requeue`, from the site install. What the replica's own node gets as that
user (no drain rights: a drain request in the job's comment, the job kept off the node) is
`tests/test_story_drain_request.py`; what root's Epilog then does with the request is
`tests/test_story_drain_requests.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from control_harness import ControlProcess
from user_harness import SiteUser

from slurm import devcluster
from slurm.backend import CommandBackend


def _cli(user: SiteUser, *args: str) -> subprocess.CompletedProcess[str]:
    r = user.fthsdp(*args)
    assert "Traceback" not in r.stdout + r.stderr
    return r


def _sbatch(user: SiteUser) -> str:
    r = user.run(
        [
            *("sbatch", "--parsable", "-N1", "--exclusive", "--requeue"),
            *("-o", "/dev/null", "--wrap", "sleep 600"),
        ],
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def _node_of(backend: CommandBackend, job: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for j in backend.jobs([job]):
            if j.base_id == job and j.state == "RUNNING" and j.nodes:
                return j.nodes
        time.sleep(0.5)
    raise AssertionError(f"job {job} never ran")


def _drained(backend: CommandBackend) -> list[str]:
    return sorted(n.name for n in backend.nodes() if n.drained or "DRAIN" in n.flags)


@pytest.fixture
def two_replicas(
    slurm_cluster: devcluster.DevClusterConfig, site_user: SiteUser
) -> Iterator[tuple[Path, SiteUser, list[str], list[str]]]:
    """Two one-node jobs of the job user standing in for replicas 0 and 1 of a run folder of
    theirs (spec.json, jobs.json); (run folder, user, job ids, their nodes)."""
    env = {**os.environ, "SLURM_CONF": str(slurm_cluster.conf_path)}
    user = site_user.with_env(FTHSDP_CONTROL_FINISH_GRACE_S="never")
    backend = CommandBackend(env=env)
    jobs = [_sbatch(user), _sbatch(user)]
    try:
        nodes = [_node_of(backend, job) for job in jobs]
        run = user.folder("run")
        user.write(
            run / "spec.json",
            json.dumps({"replicas": {"count": 2}, "train": {"min_replicas": 1}}),
        )
        replicas = [
            {"role": "replica", "job_id": job, "job_name": f"t-r{k}", "script": "r", "replica": k}
            for k, job in enumerate(jobs)
        ]
        record = {"name": "t", "run_dir": str(run), "submitted_at": 0.0, "control": None}
        user.write(run / "jobs.json", json.dumps({**record, "replicas": replicas}))
        yield run, user, jobs, nodes
    finally:
        subprocess.run(["scancel", *jobs], env=env, timeout=60, check=False)
        for node in slurm_cluster.node_names:
            subprocess.run(
                ["scontrol", "update", f"NodeName={node}", "State=RESUME"],
                env=env,
                capture_output=True,
                timeout=60,
                check=False,
            )


def _refusals(run: Path, user: SiteUser, other: str, backend: CommandBackend) -> None:
    for bad in ("nodeX", "node99", other):
        r = _cli(user, "requeue", str(run), "--replica", "0", "--drain", bad)
        assert r.returncode == 2, (bad, r.stdout, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert "--drain" in line or "refused by the coordinator" in line, line
        assert _drained(backend) == [], bad


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_requeue_refuses_a_node_not_the_replicas(
    two_replicas: tuple[Path, SiteUser, list[str], list[str]],
) -> None:
    run, user, _, nodes = two_replicas
    assert nodes[0] != nodes[1], nodes
    backend = CommandBackend(env={**os.environ, "SLURM_CONF": user.env["SLURM_CONF"]})

    # No coordinator: the direct-Slurm fallback.
    _refusals(run, user, nodes[1], backend)

    # A running coordinator answers the same.
    control = ControlProcess(run, user)
    try:
        control.start()
        _refusals(run, user, nodes[1], backend)
    finally:
        control.stop()
