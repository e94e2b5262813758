"""`fthsdp cluster inject NODE --fault down` is a power loss: the node's slurmd and every process
of its jobs die at once, slurmctld finds the node down by itself and requeues its job; `heal`
boots it and Slurm takes it back. The other nodes and their jobs are untouched."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm import devcluster
from slurm.devcluster.controller import unregistered
from slurm.devcluster.daemons import live_daemons
from slurm.devcluster.power import node_processes, socket_inodes

ROOT = Path(__file__).resolve().parent.parent


def test_socket_inodes_reads_the_unix_table() -> None:
    table = (
        "Num       RefCount Protocol Flags    Type St Inode Path\n"
        "0000000004675d21: 00000002 00000000 00010000 0001 01 2051094 /c/spool/node3/node3_4.0\n"
        "00000000a5a2662e: 00000002 00000000 00010000 0001 01 2051123 /c/spool/node2/node2_3.0\n"
        "00000000a5a2662f: 00000002 00000000 00010000 0001 01 2051124 /c/spool/node22/x\n"
        "00000000a5a26630: 00000003 00000000 00000000 0001 03 2051125\n"
    )
    assert socket_inodes(table, Path("/c/spool/node2")) == {2051123}


SLURMDS = {"slurmctld": 1, "munged": 2, "slurmd node1": 3, "slurmd node2": 4}


@pytest.mark.parametrize(
    ("states", "daemons", "waiting"),
    [
        ({"node1": "idle", "node2": "alloc", "node3": "down*"}, SLURMDS, []),
        ({"node1": "unk", "node2": "idle"}, SLURMDS, ["node1"]),
        ({"node1": "unk*", "node2": "mix"}, SLURMDS, ["node1"]),
        ({"node1": "idle"}, SLURMDS, ["node2"]),  # not listed yet: not registered
        # node3's slurmd is off (a powered-off node): Slurm's view of it is not waited for.
        ({"node1": "idle", "node2": "idle", "node3": "unk*"}, SLURMDS, []),
        ({"node1": "drain", "node2": "comp"}, SLURMDS, []),
    ],
)
def test_a_restarted_controller_waits_for_each_running_slurmd_to_register(
    states: dict[str, str], daemons: dict[str, int], waiting: list[str]
) -> None:
    assert unregistered(states, daemons) == waiting


def _cli(cfg: devcluster.DevClusterConfig, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fthsdp_cli", "cluster", *args, "--dir", str(cfg.directory)],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
        check=False,
    )


def _wait(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


def _sbatch(cfg: devcluster.DevClusterConfig, node: str) -> str:
    r = subprocess.run(
        ["sbatch", "--parsable", "--requeue", "-w", node, "-o", "/dev/null", "--wrap", "sleep 600"],
        env=cfg.env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return r.stdout.strip().split(";")[0]


def _job(cfg: devcluster.DevClusterConfig, job: str) -> tuple[str, str, str]:
    r = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T %N %r"],
        env=cfg.env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    parts = [*r.stdout.split(), "", "", ""][:3]
    return parts[0], parts[1], parts[2]


@pytest.mark.slurm
@pytest.mark.timeout(240)
def test_down_is_a_power_loss_that_slurm_notices_and_heal_boots_the_node(
    slurm_cluster: devcluster.DevClusterConfig,
) -> None:
    cfg = slurm_cluster
    jobs = [_sbatch(cfg, "node2"), _sbatch(cfg, "node3")]
    try:
        _wait(lambda: all(_job(cfg, j)[0] == "RUNNING" for j in jobs), 60, "both jobs running")
        _wait(lambda: len(node_processes(cfg, "node2")) >= 3, 30, "node2's job processes")
        others = {n: p for n, p in live_daemons(cfg).items() if n != "slurmd node2"}
        victims = node_processes(cfg, "node2")
        steps = [
            p for p in victims if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"slurmstepd")
        ]
        assert steps, f"no slurmstepd among node2's processes {victims}"
        r = _cli(cfg, "inject", "node2", "--fault", "down")
        assert r.returncode == 0, r.stderr
        assert "node2: powered off" in r.stdout
        for pid in victims:
            _wait(lambda pid=pid: not _alive(pid), 10, f"pid {pid} to die")
        assert node_processes(cfg, "node2") == []
        assert {n: p for n, p in live_daemons(cfg).items() if n != "slurmd node2"} == others
        assert _job(cfg, jobs[1])[:2] == ("RUNNING", "node3")
        # Nothing on node2 lived to tell slurmctld that its job died.
        assert _job(cfg, jobs[0])[0] == "RUNNING"
        # Nobody told slurmctld: it finds the node unresponsive and takes the job off it.
        _wait(lambda: "*" in devcluster.node_states(cfg).get("node2", ""), 90, "node2 down*")
        _wait(lambda: _job(cfg, jobs[0])[0] != "RUNNING", 90, "node2's job to leave it")
        r = _cli(cfg, "heal", "node2")
        assert r.returncode == 0, r.stderr
        assert "node2: booted" in r.stdout
        _wait(
            lambda: devcluster.node_states(cfg).get("node2") in ("idle", "mix", "alloc"),
            90,
            "node2 back in service",
        )
    finally:
        subprocess.run(["scancel", *jobs], env=cfg.env(), timeout=30, check=False)
        if "slurmd node2" not in live_daemons(cfg):
            from slurm.devcluster.power import power_on

            power_on(cfg, "node2")
        _wait(
            lambda: devcluster.node_states(cfg).get("node2") in ("idle", "mix", "alloc"),
            120,
            "node2 back for the next test",
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slurm
@pytest.mark.timeout(240)
def test_controller_stop_and_start_keeps_slurms_state_and_the_running_jobs(
    slurm_cluster: devcluster.DevClusterConfig,
) -> None:
    """`cluster controller stop`: no Slurm command answers, the job's processes keep running;
    `start`: slurmctld is back on its saved state, the job still RUNNING with its id and node."""
    cfg = slurm_cluster
    job = _sbatch(cfg, "node3")
    try:
        _wait(lambda: _job(cfg, job)[0] == "RUNNING", 60, "the job running")
        _wait(lambda: len(node_processes(cfg, "node3")) >= 3, 30, "node3's job processes")
        procs = node_processes(cfg, "node3")
        r = _cli(cfg, "controller", "stop")
        assert r.returncode == 0, r.stderr
        assert "slurmctld stopped" in r.stdout
        assert "slurmctld" not in live_daemons(cfg)
        assert _job(cfg, job) == ("", "", "")  # squeue cannot answer
        assert devcluster.node_states(cfg) == {}
        assert all(_alive(p) for p in procs)
        r = _cli(cfg, "controller", "start")
        assert r.returncode == 0, r.stderr
        assert "slurmctld answers" in r.stdout
        assert _job(cfg, job)[:2] == ("RUNNING", "node3")
        # Every node is registered again when `start` returns: work can be placed at once.
        states = devcluster.node_states(cfg)
        assert not [n for n, st in states.items() if st.startswith("unk")], states
        assert all(_alive(p) for p in procs)
    finally:
        from slurm.devcluster import controller

        controller.start(cfg)
        subprocess.run(["scancel", job], env=cfg.env(), timeout=30, check=False)
