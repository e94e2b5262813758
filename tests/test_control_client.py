"""`runtime.control.client`: the status merge of the coordinator's view and Slurm's, as a table,
and the journal's lines escaped for a terminal."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from fthsdp_cli.main import cli
from runtime.control.client import escaped, merge_status
from runtime.control.journal.schema import JOURNAL_FILE
from runtime.control.journal.store import Journal
from runtime.control.policy import ReportReceived
from runtime.protocol import ReplicaReport
from slurm.backend import NodeInfo


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
    # Slurm restarted replica 0's job before the coordinator polled it: not "training" at 42
    base["jobs"][1]["restarts"] = 1
    behind = merge_status(base, coord, nodes)
    first = behind["replicas"][0]
    assert (first["state"], first["restarts"]) == ("starting", 1)
    base["jobs"][1]["restarts"] = 0
    without = merge_status(base, None, [])
    # No coordinator (its job requeued, its node down): Slurm's word for a running job, never
    # "starting" for one that may have trained for hours.
    assert [r["state"] for r in without["replicas"]] == ["running", "pending"]
    assert [r["step"] for r in without["replicas"]] == [None, None]
    assert without["coordinator"] is None


def test_events_escapes_what_a_report_carried(tmp_path: Path) -> None:
    # A leader's last_error reaches the journal as it was sent; `fthsdp events` shows it
    # escaped, so no terminal acts on it, in both its text and its JSON lines.
    journal = Journal(tmp_path / JOURNAL_FILE)
    hostile = "\x1b]0;owned\x07\x1b[2J\u202egpu\nlost\x9b31m"
    rep = ReplicaReport(
        replica=1, incarnation="i", seq=1, kind="fatal", job_id="101", failure="node",
        failed_node="node2", last_error=hostile,
    )  # fmt: skip
    try:
        journal.record(ReportReceived(rep, 5.0), [], nonce="ab" * 12)
    finally:
        journal.close()
    for args in ([], ["--json"]):
        r = CliRunner().invoke(cli, ["events", str(tmp_path), *args])
        assert r.exit_code == 0, r.output
        assert all(c == "\n" or " " <= c <= "~" for c in r.output), repr(r.output)
        assert "owned" in r.output and "\\x1b" in r.output
    assert escaped(hostile) == "\\x1b]0;owned\\x07\\x1b[2J\\u202egpu\\nlost\\x9b31m"
