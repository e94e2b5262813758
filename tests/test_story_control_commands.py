"""`fthsdp status --json`, `fthsdp requeue` and `fthsdp events` against a live coordinator process
(Slurm's commands replaced by the recording stand-ins of control_harness)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from control_harness import ControlProcess, calls, fatal, live_run, post, wait_for  # noqa: F401

from runtime.protocol import ReplicaReport
from slurm.rundir import read_secret


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
