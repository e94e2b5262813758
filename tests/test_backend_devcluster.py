"""The Slurm backend against the real dev cluster: requeue + release can move a job off a node
without draining it (the straggler's "exclude" eviction mode)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from slurm.backend import CommandBackend, JobInfo
from slurm.devcluster import DevClusterConfig


def _wait_running(backend: CommandBackend, job_id: str, timeout: float = 60) -> JobInfo:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = [j for j in backend.jobs([job_id]) if j.job_id == job_id]
        if jobs and jobs[0].state.upper() == "RUNNING":
            return jobs[0]
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} not running after {timeout}s: {backend.jobs([job_id])}")


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_release_with_exclude_moves_the_job_and_drains_nothing(
    slurm_cluster: DevClusterConfig, tmp_path: Path
) -> None:
    script = tmp_path / "sleep.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --output={tmp_path}/out-%j.txt\nsleep 300\n")
    backend = CommandBackend()
    job_id = backend.submit(script, ["--requeue", "--job-name=exclude-check", "--nodes=1"])
    try:
        first = _wait_running(backend, job_id)
        backend.requeue(job_id)
        backend.release(job_id, exclude=[first.nodes])
        second = _wait_running(backend, job_id)
        assert second.restarts == 1
        assert second.nodes != first.nodes
        assert first.nodes in second.excluded
        (node,) = backend.nodes([first.nodes])
        assert not node.drained, node
    finally:
        backend.cancel([job_id])
