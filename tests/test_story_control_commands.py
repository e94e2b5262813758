"""`fthsdp status --json`, `fthsdp requeue` and `fthsdp events` against a live coordinator process
(Slurm's commands replaced by the recording stand-ins of test_control_journal), and the
status merge as a table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from control_harness import ControlProcess, calls, fatal, live_run, post, wait_for  # noqa: F401

from runtime.control.client import merge_status
from runtime.protocol import ReplicaReport
from slurm.backend import NodeInfo
from slurm.rundir import read_secret


def test_merge_status_prefers_the_coordinator_and_lists_our_drains() -> None:
    base = {
        "name": "r",
        "run_dir": "/x",
        "jobs": [
            {"role": "control", "replica": None, "job_id": "9", "state": "RUNNING"},
            {"role": "replica", "replica": 0, "job_id": "10", "state": "RUNNING",
             "nodes": ["node1"], "restarts": 0},
            {"role": "replica", "replica": 1, "job_id": "11", "state": "PENDING",
             "nodes": [""], "restarts": 1},
        ],
    }  # fmt: skip
    crep = {
        "phase": "training", "job_id": "10", "nodes": ["node1"], "step": 42, "restarts": 0,
        "relaunches": 1, "requeues": 0, "slurm_requeues": 0, "last_failure": "process: x",
    }  # fmt: skip
    coord = {
        "url": "http://h:1",
        "replicas": [
            {**crep, "replica": 0},
            {**crep, "replica": 1, "job_id": "11", "phase": "starting", "step": 7, "requeues": 1},
        ],
        "drained": [{"node": "node2", "reason": "fthsdp: xid: 79"}],
        "quorum_id": 5,
        "participants": 1,
        "cursor": 84,
    }
    nodes = [
        NodeInfo("node3", "drained", ("DRAIN",), "fthsdp: ecc: 2"),
        NodeInfo("node4", "drained", ("DRAIN",), "admin: fan"),
    ]
    out = merge_status(base, coord, nodes)
    assert [(r["replica"], r["state"], r["step"], r["restarts"]) for r in out["replicas"]] == [
        (0, "training", 42, 0),
        (1, "pending", 7, 1),
    ]
    assert out["drained"] == [
        {"node": "node2", "reason": "fthsdp: xid: 79"},
        {"node": "node3", "reason": "fthsdp: ecc: 2"},
    ]
    assert (out["quorum_id"], out["cursor"]) == (5, 84)
    without = merge_status(base, None, [])
    assert [r["state"] for r in without["replicas"]] == ["starting", "pending"]
    assert without["coordinator"] is None


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fthsdp_cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.timeout(120)
def test_status_requeue_events(
    live_run: tuple[Path, Path, dict[str, str], ControlProcess],  # noqa: F811
) -> None:
    run_dir, root, env, proc = live_run
    url = proc.start()
    secret = read_secret(run_dir / "secret")
    rep = ReplicaReport(replica=0, incarnation="a", seq=1, job_id="100", nodes=["node1"], step=5)
    assert post(url, secret, rep) == 200
    assert post(url, secret, fatal(1, "101", "node2")) == 200
    wait_for(lambda: calls(root, "scontrol requeue 101"), what="requeue of 101")

    r = cli(env, "status", str(run_dir), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    rows = {row["replica"]: row for row in data["replicas"]}
    assert (rows[0]["job_id"], rows[0]["state"], rows[0]["step"]) == ("100", "training", 5)
    assert rows[1]["state"] in ("requeued", "pending")
    assert {"node": "node2", "reason": "fthsdp: fault: Xid 79"} in data["drained"]
    assert data["coordinator"] == url

    r = cli(env, "requeue", str(run_dir), "--replica", "0", "--drain", "node1", "--reason", "fan")
    assert r.returncode == 0, r.stderr
    assert "via coordinator" in r.stdout
    wait_for(lambda: calls(root, "scontrol requeue 100"), what="requeue of 100")
    assert any("Reason=fthsdp: manual: fan" in c for c in calls(root, "scontrol update NodeName"))

    r = cli(env, "requeue", str(run_dir), "--replica", "5")
    assert r.returncode == 2 and "replica" in r.stderr

    r = cli(env, "events", str(run_dir))
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "fatal report" in text and "decide Requeue" in text and "operator requeue" in text
    assert "slurm Requeue" in text

    # With the coordinator gone, requeue still works, straight through Slurm.
    proc.stop()
    r = cli(env, "requeue", str(run_dir), "--replica", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["via"] == "slurm"
    assert len(calls(root, "scontrol requeue 101")) == 2
