"""`fthsdp requeue RUN --replica K --drain NODE` drains only a node of replica K's own job.

On the real dev cluster, with two real one-node jobs standing in for a run's replicas: an
unknown node (an operator's typo) and the other replica's node are refused with exit 2 and
nothing is drained, both through a running coordinator and through the direct-Slurm fallback
(no coordinator); the replica's own node is drained and the job requeued.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from control_harness import ControlProcess

from slurm import devcluster
from slurm.backend import CommandBackend

ROOT = Path(__file__).resolve().parent.parent


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "fthsdp_cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert "Traceback" not in r.stdout + r.stderr
    return r


def _sbatch(env: dict[str, str]) -> str:
    r = subprocess.run(
        [
            *("sbatch", "--parsable", "-N1", "--exclusive", "--requeue"),
            *("-o", "/dev/null", "--wrap", "sleep 600"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
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
    slurm_cluster: devcluster.DevClusterConfig, tmp_path: Path
) -> Iterator[tuple[Path, dict[str, str], list[str], list[str]]]:
    env = {**os.environ, "SLURM_CONF": str(slurm_cluster.conf_path)}
    env["FTHSDP_CONTROL_FINISH_GRACE_S"] = "never"
    env.pop("FTHSDP_DEBUG", None)
    backend = CommandBackend(env=env)
    jobs = [_sbatch(env), _sbatch(env)]
    try:
        nodes = [_node_of(backend, job) for job in jobs]
        run = tmp_path / "run"
        run.mkdir(mode=0o700)
        (run / "spec.json").write_text(
            json.dumps({"replicas": {"count": 2}, "train": {"min_replicas": 1}})
        )
        replicas = [
            {"role": "replica", "job_id": job, "job_name": f"t-r{k}", "script": "r", "replica": k}
            for k, job in enumerate(jobs)
        ]
        record = {"name": "t", "run_dir": str(run), "submitted_at": 0.0, "control": None}
        (run / "jobs.json").write_text(json.dumps({**record, "replicas": replicas}))
        yield run, env, jobs, nodes
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


def _refusals(run: Path, env: dict[str, str], other: str, backend: CommandBackend) -> None:
    for bad in ("nodeX", "node99", other):
        r = _cli(env, "requeue", str(run), "--replica", "0", "--drain", bad)
        assert r.returncode == 2, (bad, r.stdout, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert "--drain" in line or "refused by the coordinator" in line, line
        assert _drained(backend) == [], bad


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_requeue_drains_only_the_replicas_own_node(
    two_replicas: tuple[Path, dict[str, str], list[str], list[str]],
) -> None:
    run, env, _, nodes = two_replicas
    assert nodes[0] != nodes[1], nodes
    backend = CommandBackend(env=env)

    # No coordinator: the direct-Slurm fallback.
    _refusals(run, env, nodes[1], backend)

    # A running coordinator answers the same.
    control = ControlProcess(run, env)
    try:
        control.start()
        _refusals(run, env, nodes[1], backend)
        r = _cli(env, "requeue", str(run), "--replica", "0", "--drain", nodes[0], "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["via"] == "coordinator"
        deadline = time.monotonic() + 60
        while _drained(backend) != [nodes[0]]:
            assert time.monotonic() < deadline, _drained(backend)
            time.sleep(0.5)
        (info,) = backend.nodes([nodes[0]])
        assert info.reason.startswith("fthsdp: manual:"), info
    finally:
        control.stop()
