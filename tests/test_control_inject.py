"""`fthsdp cluster inject|heal` touch only the cluster they were given.

Several dev clusters can share a host and each has a `node1`: a `kill` must match processes by
the cluster's own `SLURM_CONF`, an unknown node or a cluster whose hooks read no simulated
hardware is refused (exit 2), and `--gpus` comes from the cluster. The two-cluster test starts a
second real cluster beside the session's and runs a harmless `sleep` step on node1 of each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from fthsdp_cli.main import cli
from prolog_epilog import dev_health
from runtime.control.inject import is_replica_task, node_faults
from slurm import devcluster

ROOT = Path(__file__).resolve().parent.parent
CONF = Path("/c/a/etc/slurm.conf")
TASK = {
    "SLURM_CONF": str(CONF),
    "SLURMD_NODENAME": "node1",
    "FTHSDP_LAUNCH": "0",
    "SLURM_PROCID": "0",
}


@pytest.mark.parametrize(
    ("change", "comm", "node", "expected"),
    [
        ({}, "python", "node1", True),
        ({}, "python", "node2", False),
        ({"SLURM_CONF": "/c/b/etc/slurm.conf"}, "python", "node1", False),  # another cluster
        ({"SLURM_CONF": None}, "python", "node1", False),  # no cluster named: never
        ({"FTHSDP_LAUNCH": None}, "python", "node1", False),  # not a replica's step
        ({"SLURM_PROCID": None}, "python", "node1", False),
        ({}, "srun", "node1", False),
        ({}, "slurmstepd", "node1", False),
        ({"SLURM_CONF": "/c/a/etc/../etc/slurm.conf"}, "python", "node1", True),
    ],
)
def test_replica_task_is_matched_by_cluster_and_node(
    change: dict[str, str | None], comm: str, node: str, expected: bool
) -> None:
    env = {k: v for k, v in {**TASK, **change}.items() if v is not None}
    assert is_replica_task(env, comm, node, CONF) is expected


def _saved_cluster(directory: Path, health: bool) -> devcluster.DevClusterConfig:
    cfg = devcluster.DevClusterConfig(directory=directory, nodes=2, gpus_per_node=4)
    if health:
        cfg = dev_health.with_health(cfg)
    directory.chmod(0o700)
    (directory / devcluster.CONFIG_FILE).write_text(cfg.to_json())
    return cfg


@pytest.mark.parametrize(
    ("health", "args", "says"),
    [
        (True, ["inject", "node9", "--fault", "xid79"], "node1, node2"),
        (True, ["heal", "node9"], "node1, node2"),
        (True, ["inject", "node9", "--fault", "kill"], "node1, node2"),
        (False, ["inject", "node1", "--fault", "xid79"], "fthsdp cluster up --health"),
        (False, ["inject", "node1", "--fault", "slow=2"], "fthsdp cluster up --health"),
        (False, ["heal", "node1"], "nothing to heal"),
        (False, ["inject", "node9", "--fault", "down"], "node1, node2"),
        (True, ["inject", "node1", "--fault", "ecc", "--gpus", "8"], "4 GPUs per node"),
        (True, ["inject", "node1", "--fault", "ecc", "--gpus", "0"], "--gpus"),
        (True, ["inject", "node1", "--fault", "bogus"], "--fault"),
    ],
)
def test_inject_refuses_what_the_cluster_cannot_take(
    tmp_path: Path, health: bool, args: list[str], says: str
) -> None:
    _saved_cluster(tmp_path, health)
    r = CliRunner().invoke(cli, ["cluster", *args, "--dir", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert says in r.output and "Traceback" not in r.output
    assert not (tmp_path / "hardware" / "node9").exists()
    assert node_faults(tmp_path / "hardware", "node1") == []


def test_inject_takes_the_gpu_count_from_the_cluster(tmp_path: Path) -> None:
    cfg = _saved_cluster(tmp_path, health=True)
    args = ["--dir", str(tmp_path)]
    r = CliRunner().invoke(cli, ["cluster", "inject", "node2", "--fault", "xid79", *args])
    assert r.exit_code == 0, r.output
    assert "xid79" in r.output
    hardware = dev_health.hardware_dir(cfg)
    assert node_faults(hardware, "node2") == ["xid79"]
    # GPU 3 of 4 fell off the bus: three left (eight GPUs would leave seven)
    assert _gpu_rows(hardware / "node2") == 3
    r = CliRunner().invoke(cli, ["cluster", "heal", "node2", *args])
    assert r.exit_code == 0, r.output
    assert _gpu_rows(hardware / "node2") == 4


def _gpu_rows(node_dir: Path) -> int:
    lines = (node_dir / "smi" / "query_gpu.csv").read_text().splitlines()
    return len([line for line in lines if line.strip() and not line.startswith("index")])


def _sleep_step(cfg: devcluster.DevClusterConfig) -> subprocess.Popen[bytes]:
    """A harmless replica-like step on node1: `sleep` with the variables a replica's task has."""
    env = {**os.environ, "SLURM_CONF": str(cfg.conf_path), "FTHSDP_LAUNCH": "0"}
    return subprocess.Popen(
        ["srun", "-N1", "-w", "node1", "--export=ALL", "sleep", "300"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _task_pids(cfg: devcluster.DevClusterConfig) -> list[int]:
    from runtime.control.inject import replica_processes

    return list(replica_processes("node1", cfg.conf_path))


def _wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _inject(cfg: devcluster.DevClusterConfig, fault: str) -> subprocess.CompletedProcess[str]:
    args = ["cluster", "inject", "node1", "--fault", fault, "--dir", str(cfg.directory)]
    return subprocess.run(
        [sys.executable, "-m", "fthsdp_cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


@pytest.fixture
def second_cluster(site_dir: Path) -> Iterator[devcluster.DevClusterConfig]:
    base = devcluster.free_port_block(3, start=23000 + (os.getpid() % 200) * 10)
    directory = site_dir / "second"
    cfg = devcluster.DevClusterConfig(
        directory=directory, nodes=2, ctld_port=base, slurmd_base_port=base + 1
    )
    with devcluster.running_cluster(cfg) as running:
        yield running


@pytest.mark.slurm
@pytest.mark.timeout(240)
def test_kill_leaves_another_cluster_on_the_host_alone(
    slurm_cluster: devcluster.DevClusterConfig, second_cluster: devcluster.DevClusterConfig
) -> None:
    steps = [_sleep_step(slurm_cluster), _sleep_step(second_cluster)]
    try:
        _wait(lambda: _task_pids(slurm_cluster) and _task_pids(second_cluster), 90, "both steps")
        (theirs,) = _task_pids(second_cluster)
        (mine,) = _task_pids(slurm_cluster)
        r = _inject(slurm_cluster, "kill")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["node1:", "killed", "1", "replica", "processes", str(mine)]
        _wait(lambda: not _task_pids(slurm_cluster), 30, "the killed step to go")
        assert _task_pids(second_cluster) == [theirs]
        os.kill(theirs, 0)  # still alive
        r = _inject(slurm_cluster, "xid79")
        assert r.returncode == 2 and "fthsdp cluster up --health" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    finally:
        for step in steps:
            step.terminate()
        for step in steps:
            try:
                step.wait(timeout=30)
            except subprocess.TimeoutExpired:
                step.kill()
                step.wait(timeout=10)
