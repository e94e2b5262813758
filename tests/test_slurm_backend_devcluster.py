"""The Slurm backend against the real dev cluster, on every release of the matrix: requeue +
release can move a job off a node without draining it (the straggler's "exclude" eviction mode)
and let it back once the node is in service;
drain and resume touch only fthsdp's own drains and one node at a time; finished jobs stay
visible."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from slurm.backend import CommandBackend, JobInfo, NodeInfo, NodeNameError, drain_reason
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
        # The node is in service: a release that may forget it clears the job's ExcNodeList.
        backend.requeue(job_id)
        backend.release(job_id, forget=[first.nodes])
        third = _wait_running(backend, job_id)
        assert third.restarts == 2
        assert third.excluded == "", third
    finally:
        backend.cancel([job_id])


def _scontrol(*args: str) -> None:
    subprocess.run(["scontrol", *args], check=True, capture_output=True, timeout=30)


def _wait_state(backend: CommandBackend, name: str, drained: bool, timeout: float = 30) -> NodeInfo:
    deadline = time.monotonic() + timeout
    while True:
        node = backend.node(name)
        if node.drained == drained or time.monotonic() > deadline:
            return node
        time.sleep(0.3)


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_drain_and_resume_touch_only_our_own_drains(slurm_cluster: DevClusterConfig) -> None:
    """On the running Slurm: an admin's drain is never changed, a hostlist is never expanded,
    and resume puts back only what fthsdp drained."""
    backend = CommandBackend()
    version = subprocess.run(
        ["scontrol", "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout.split()[1]
    assert str(backend.version()) == version
    nodes = {n.name: n for n in backend.nodes()}
    assert {"node1", "node2", "node3", "node4"} <= set(nodes)
    assert all(n.address for n in nodes.values()), nodes  # the rendezvous relies on it
    admin = "admin: fan swap"
    try:
        _scontrol("update", "NodeName=node3", "State=DRAIN", f"Reason={admin}")
        assert _wait_state(backend, "node3", True).reason == admin
        assert backend.drain("node3", drain_reason("ecc", "GPU2")) is False
        assert backend.resume("node3") is False
        after = backend.node("node3")
        assert (after.drained, after.reason) == (True, admin)

        for bad in ("node[3-4]", "node3,node4", "node3 node4"):
            with pytest.raises(NodeNameError):
                backend.drain(bad, drain_reason("ecc", "GPU2"))
            with pytest.raises(NodeNameError):
                backend.resume(bad)
        assert backend.node("node3").reason == admin
        assert not backend.node("node4").drained

        ours = drain_reason("ecc", "GPU2 uncorrectable")
        assert backend.drain("node4", ours) is True
        assert _wait_state(backend, "node4", True).reason == ours
        assert backend.resume("node4") is True
        assert not _wait_state(backend, "node4", False).drained
        assert backend.node("node3").reason == admin
    finally:
        for name in ("node3", "node4"):
            if backend.node(name).drained:
                _scontrol("update", f"NodeName={name}", "State=RESUME")
            _wait_state(backend, name, False)


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_a_cancelled_job_is_still_seen(slurm_cluster: DevClusterConfig, tmp_path: Path) -> None:
    """24.11 drops a finished job from plain `squeue --json` at once; `jobs` still shows it."""
    script = tmp_path / "sleep.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --output={tmp_path}/out-%j.txt\nsleep 300\n")
    backend = CommandBackend()
    job_id = backend.submit(script, ["--job-name=cancel-check", "--nodes=1"])
    try:
        _wait_running(backend, job_id)
    finally:
        backend.cancel([job_id])
    deadline = time.monotonic() + 30
    while True:
        states = {j.job_id: j.state for j in backend.jobs([job_id])}
        if states.get(job_id) == "CANCELLED" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert states == {job_id: "CANCELLED"}
    time.sleep(2)
    assert {j.job_id: j.state for j in backend.jobs([job_id])} == {job_id: "CANCELLED"}


@pytest.mark.slurm
@pytest.mark.timeout(60)
def test_rendezvous_address_comes_from_slurm(slurm_cluster: DevClusterConfig) -> None:
    """The worker's MASTER_ADDR for a node name that does not resolve: Slurm's NodeAddr."""
    from runtime import rendezvous

    assert rendezvous._slurm_node_address("node1") == "127.0.0.1"
    expected = "node1" if rendezvous.resolves("node1") else "127.0.0.1"
    assert rendezvous.node_address("node1") == expected
    with pytest.raises(rendezvous.RendezvousError, match="no record of node node9"):
        rendezvous._slurm_node_address("node9")
