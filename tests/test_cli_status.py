"""`fthsdp status` and `fthsdp events` read well: at 80 columns, in pipes, and in words.

Pure tables for the pieces (`settle_replicas`, `quorum_line`, `straggler_line`, `event_text`),
the whole status drawn at 80 columns (names fold, nothing is cut with an ellipsis), and a dev
cluster whose slurmctld is stopped: `status` says Slurm failed and exits 3.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import user_harness
from rich.console import Console

from fthsdp_cli.commands.status import (
    event_text,
    quorum_line,
    render_status,
    settle_replicas,
    straggler_line,
)
from slurm import devcluster

ROOT = Path(__file__).resolve().parent.parent
FAILURE = (
    "xid: node3: GPU 7 fell off the bus (Xid 79) at 12:00:01; drained node3 and requeued job "
    "14 onto healthy nodes"
)


def _replica(k: int, state: str, slurm: str, nodes: list[str], **kw: Any) -> dict[str, Any]:
    row = {
        "replica": k,
        "job_id": str(13 + k),
        "state": state,
        "slurm_state": slurm,
        "nodes": nodes,
        "step": 200,
        "restarts": 0,
        "relaunches": 0,
        "last_failure": None,
    }
    return {**row, **kw}


STATUS: dict[str, Any] = {
    "name": "demo-with-a-longer-name",
    "run_dir": "/work/main/runs/demo-with-a-longer-name",
    "jobs": [
        {"role": "control", "replica": None, "job_id": "12", "state": "RUNNING", "nodes": ["n8"]},
        {"role": "replica", "replica": 0, "job_id": "13", "state": "COMPLETED", "nodes": ["a"]},
        {
            "role": "replica",
            "replica": 1,
            "job_id": "14",
            "state": "RUNNING",
            "nodes": ["node[3-4]", "node7"],
        },
    ],
    "replicas": [
        _replica(0, "training", "COMPLETED", ["node[1-2]"]),
        _replica(1, "healing", "RUNNING", ["node[3-4]", "node7"], last_failure=FAILURE),
    ],
    "drained": [{"node": "node3", "reason": "fthsdp: xid: Xid 79"}],
    "coordinator": "http://127.0.0.1:40000",
    "quorum_id": -1,
    "participants": 0,
    "cursor": None,
    "stragglers": [
        {
            "replica": 1,
            "state": "suspect",
            "factor": 1.52,
            "slow_node": "node3",
            "steps": 12,
            "action": None,
            "why": None,
        }
    ],
}


@pytest.mark.parametrize(
    ("slurm", "phase", "shown"),
    [
        ("COMPLETED", "training", "done"),
        ("COMPLETED", "done", "done"),
        ("FAILED", "training", "failed"),
        ("CANCELLED", "healing", "cancelled"),
        ("TIMEOUT", "training", "timed out"),
        ("RUNNING", "training", "training"),
        ("PENDING", "pending", "pending"),
        ("COMPLETED", "out", "out"),
    ],
)
def test_an_ended_job_is_not_shown_training(slurm: str, phase: str, shown: str) -> None:
    status = {"jobs": [], "replicas": [_replica(0, phase, slurm, ["node1"])]}
    settle_replicas(status)
    assert status["replicas"][0]["state"] == shown


@pytest.mark.parametrize(
    ("components", "nodes", "helper"),
    [
        (["node[1-2]", "node7"], ["node[1-2]"], ["node7"]),
        (["node1"], ["node1"], []),
        (["", ""], [], []),
        ([], ["node1"], []),  # no squeue record: the coordinator's nodes stay
    ],
)
def test_the_helper_component_is_kept_apart(
    components: list[str], nodes: list[str], helper: list[str]
) -> None:
    status = {
        "jobs": [{"role": "replica", "replica": 0, "nodes": components}],
        "replicas": [_replica(0, "training", "RUNNING", [c for c in components if c] or ["node1"])],
    }
    settle_replicas(status)
    row = status["replicas"][0]
    assert (row["nodes"], row["helper_nodes"]) == (nodes, helper)


@pytest.mark.parametrize(
    ("coordinator", "quorum", "line"),
    [
        (None, None, "coordinator: not reachable (Slurm's view only)"),
        ("http://h:1", -1, "coordinator http://h:1: no quorum yet"),
        ("http://h:1", None, "coordinator http://h:1: no quorum yet"),
        ("http://h:1", 4, "coordinator http://h:1: quorum 4 of 3 replicas, data cursor 17"),
    ],
)
def test_quorum_line(coordinator: str | None, quorum: int | None, line: str) -> None:
    status = {"coordinator": coordinator, "quorum_id": quorum, "participants": 3, "cursor": 17}
    assert quorum_line(status) == line


def test_straggler_lines_say_what_suspect_means() -> None:
    suspect = STATUS["stragglers"][0]
    assert straggler_line(suspect) == (
        "replica 1: slow, 1.5x the others' step time on node3 for 12 steps; watched, no action "
        "unless it lasts"
    )
    evicted = {**suspect, "state": "straggler", "factor": 3.0, "steps": 60, "action": "requeue"}
    evicted["why"] = "pays off"
    assert straggler_line(evicted) == (
        "replica 1: straggler (3.0x the others' step time on node3 for 60 steps) -> requeue "
        "(pays off)"
    )


@pytest.mark.parametrize(
    ("kind", "text", "line"),
    [
        ("CoordinatorStarted", "CoordinatorStarted", "CoordinatorStarted"),
        ("CoordinatorStarted", "", "CoordinatorStarted"),
        ("Requeue", "job 14 on node3", "Requeue: job 14 on node3"),
    ],
)
def test_event_text(kind: str, text: str, line: str) -> None:
    assert event_text(kind, text) == line


def test_status_fits_80_columns_without_cutting_names() -> None:
    status = copy.deepcopy(STATUS)
    settle_replicas(status)
    console = Console(width=80, record=True, color_system=None)
    console.print(render_status(status))
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in text and "..." not in text
    flat = " ".join(text.split())
    for word in ("requeued", "relaunched", "node[3-4]", "(helper:", "node7)", FAILURE):
        assert word in flat, word
    assert "no quorum yet" in flat and "cursor None" not in flat and "quorum -1" not in flat
    row0 = next(line for line in lines if line.strip().startswith("0 "))
    assert "done" in row0 and "training" not in row0


@pytest.fixture
def stopped_cluster(site_dir: Path) -> Iterator[devcluster.DevClusterConfig]:
    base = devcluster.free_port_block(3, start=25000 + (os.getpid() % 200) * 10)
    cfg = devcluster.DevClusterConfig(
        directory=site_dir / "cluster", nodes=2, ctld_port=base, slurmd_base_port=base + 1
    )
    with devcluster.running_cluster(cfg) as running:
        devcluster.down(running)
        yield running


@pytest.mark.slurm
@pytest.mark.timeout(240)
def test_status_with_slurmctld_down_says_so_and_exits_3(
    tmp_path: Path, stopped_cluster: devcluster.DevClusterConfig
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    job = {"role": "replica", "job_id": "2", "job_name": "t-r00", "script": "r", "replica": 0}
    control = {"role": "control", "job_id": "1", "job_name": "t-control", "script": "c"}
    record = {"name": "t", "run_dir": str(run), "submitted_at": 1.0}
    (run / "jobs.json").write_text(json.dumps({**record, "control": control, "replicas": [job]}))
    env = {**os.environ, "SLURM_CONF": str(stopped_cluster.conf_path)}
    env.pop("FTHSDP_DEBUG", None)
    for args in (["status", str(run)], ["status", str(run), "--json"]):
        r = subprocess.run(
            [sys.executable, "-m", "fthsdp_cli", *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            env=env,
        )
        assert r.returncode == 3, (r.stdout, r.stderr)
        assert r.stdout == "" and "gone" not in r.stderr and "Traceback" not in r.stderr
        *waits, line = r.stderr.strip().splitlines()
        assert line.startswith("Error: Slurm command 'squeue")
        assert "slurmctld is not answering" in line
        assert all(w.startswith("fthsdp: waiting") for w in waits), r.stderr


@pytest.fixture
def sleeping_run(site_user: user_harness.SiteUser) -> Iterator[Path]:
    """A run dir of the job user's whose one replica is their real `sleep` job on the session's
    dev cluster."""
    r = site_user.run(["sbatch", "--parsable", "-N1", "-o", "/dev/null", "--wrap", "sleep 300"])
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    try:
        run = site_user.folder("run")
        rep = {"role": "replica", "job_id": job, "job_name": "t-r00", "script": "r", "replica": 0}
        record = {"name": "t", "run_dir": str(run), "submitted_at": 1.0, "control": None}
        site_user.write(run / "jobs.json", json.dumps({**record, "replicas": [rep]}))
        yield run
    finally:
        site_user.run(["scancel", job], timeout=60)


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_watch_json_into_a_pipe_is_json_lines_only(
    site_user: user_harness.SiteUser, sleeping_run: Path
) -> None:
    """`fthsdp status --watch --json` as the job user, on their own job, until their SIGINT."""
    args = ["status", str(sleeping_run), "--watch", "--json", "--interval", "0.5"]
    proc = subprocess.Popen(
        user_harness.user_argv(site_user.user, [str(site_user.prefix / "bin" / "fthsdp"), *args]),
        env=site_user.env,
        cwd=site_user.home,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        snapshots = [json.loads(proc.stdout.readline()) for _ in range(3)]
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    for line in rest.splitlines():  # whatever came after: JSON too, no table
        json.loads(line)
    assert rest == "" or rest.endswith("\n")
    for snap in snapshots:
        (row,) = snap["jobs"]
        assert row["reason"] is None or row["reason"] != "None", row
        assert snap["replicas"][0]["replica"] == 0
        assert snap["coordinator"] is None
