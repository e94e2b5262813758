"""The coordinator's journal survives `kill -9`: no decision is lost and none is carried out twice.

The coordinator runs as a real process (`fthsdp control --no-lighthouse`) driving Slurm's command
names, which here are small stand-ins on PATH that keep job and node state in a JSON file and log
every call, so the test can count `scontrol requeue`s exactly.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from runtime.control.journal import Journal
from runtime.control.policy import (
    Event,
    PolicyConfig,
    ReportReceived,
    Requeue,
    RunState,
    Tick,
    step,
)
from runtime.control.report import ReplicaReport, read_secret, sign

FAKE_SLURM = r'''#!PYTHON
"""Stand-in for scontrol/squeue/sinfo: state in $FAKE_SLURM_STATE, calls in $FAKE_SLURM_LOG."""
import fcntl, json, os, sys, time
name = os.path.basename(sys.argv[0]); args = sys.argv[1:]
state_path = os.environ["FAKE_SLURM_STATE"]
with open(state_path + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    state = json.load(open(state_path))
    with open(os.environ["FAKE_SLURM_LOG"], "a") as log:
        log.write(" ".join([name, *args]) + "\n")
    if name == "squeue":
        ids = [a.split("=", 1)[1].split(",") for a in args if a.startswith("--jobs=")]
        want = set(ids[0]) if ids else set(state["jobs"])
        jobs = [dict(job_id=int(j), name="r", job_state=v["state"], nodes=v["nodes"],
                     restart_cnt=v["restarts"], state_reason="", het_job_id=0, het_job_offset=0)
                for j, v in state["jobs"].items() if j in want]
        print(json.dumps({"jobs": jobs}))
    elif name == "sinfo":
        print(json.dumps({"nodes": [dict(name=n, state=v["state"], state_flags=v["flags"],
                                         reason=v["reason"]) for n, v in state["nodes"].items()]}))
    elif name == "scontrol" and args[0] == "requeue":
        time.sleep(float(os.environ.get("FAKE_REQUEUE_SLEEP", "0")))
        job = state["jobs"][args[1]]; job["restarts"] += 1; job["state"] = "PENDING"
    elif name == "scontrol" and args[0] == "update" and args[1].startswith("NodeName="):
        node = state["nodes"][args[1].split("=", 1)[1]]
        node["flags"] = ["DRAIN"]; node["reason"] = args[3].split("=", 1)[1]
    json.dump(state, open(state_path + ".tmp", "w")); os.replace(state_path + ".tmp", state_path)
'''


def install_fake_slurm(root: Path, jobs: dict[str, str]) -> dict[str, str]:
    """Fake Slurm commands under root/bin; returns the environment that uses them."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    script = bin_dir / "fake_slurm"
    script.write_text(FAKE_SLURM.replace("#!PYTHON", "#!" + sys.executable))
    script.chmod(0o755)
    for name in ("scontrol", "squeue", "sinfo", "scancel", "sbatch"):
        (bin_dir / name).symlink_to(script)
    state = {
        "jobs": {j: {"state": "RUNNING", "nodes": node, "restarts": 0} for j, node in jobs.items()},
        "nodes": {
            f"node{i}": {"state": "allocated", "flags": [], "reason": ""} for i in range(1, 5)
        },
    }
    (root / "slurm.json").write_text(json.dumps(state))
    env = dict(os.environ)
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        FAKE_SLURM_STATE=str(root / "slurm.json"),
        FAKE_SLURM_LOG=str(root / "calls.log"),
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
    )
    return env


def calls(root: Path, prefix: str) -> list[str]:
    log = root / "calls.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [line for line in lines if line.startswith(prefix)]


def wait_for(pred: Callable[[], object], timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class ControlProcess:
    def __init__(self, run_dir: Path, env: dict[str, str]) -> None:
        self.run_dir, self.env = run_dir, env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        control = self.run_dir / "control.json"
        control.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "fthsdp_cli", "control", "--run-dir", str(self.run_dir)]
        argv += ["--bind", "127.0.0.1", "--no-lighthouse"]
        log = open(self.run_dir / "control.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=log)
        log.close()
        wait_for(control.exists, what="control.json")
        return str(json.loads(control.read_text())["coordinator"])

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def post(url: str, secret: bytes, report: ReplicaReport) -> int:
    body = report.to_json()
    req = urllib.request.Request(
        url + "/v1/reports", data=body, method="POST", headers=sign(secret, body)
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return int(resp.status)


def fatal(k: int, job: str, node: str, seq: int = 9) -> ReplicaReport:
    return ReplicaReport(
        replica=k,
        incarnation=f"w{k}",
        seq=seq,
        kind="fatal",
        job_id=job,
        nodes=[node],
        failure="node",
        failed_node=node,
        last_error="Xid 79",
    )


def action_status(run_dir: Path, kind: str, job: str) -> list[str]:
    db = sqlite3.connect(run_dir / "control.sqlite")
    try:
        rows = db.execute("SELECT payload, status FROM actions WHERE type = ?", (kind,)).fetchall()
    finally:
        db.close()
    return [status for payload, status in rows if json.loads(payload).get("job_id") == job]


@pytest.fixture
def run(tmp_path: Path) -> Iterator[tuple[Path, Path, ControlProcess]]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    jobs = {"0": "100", "1": "101", "2": "102"}
    (run_dir / "run.json").write_text(json.dumps({"replicas": 3, "min_replicas": 2}))
    (run_dir / "jobs.json").write_text(json.dumps({"replicas": jobs}))
    env = install_fake_slurm(tmp_path, {"100": "node1", "101": "node2", "102": "node3"})
    env["FAKE_REQUEUE_SLEEP"] = "1.5"
    proc = ControlProcess(run_dir, env)
    try:
        yield run_dir, tmp_path, proc
    finally:
        proc.stop()


@pytest.mark.timeout(120)
def test_kill_9_loses_and_repeats_no_decision(run: tuple[Path, Path, ControlProcess]) -> None:
    run_dir, root, proc = run
    url = proc.start()
    secret = read_secret(run_dir / "secret")
    for k, job, node in ((0, "100", "node1"), (1, "101", "node2"), (2, "102", "node3")):
        status = ReplicaReport(replica=k, incarnation=f"w{k}", seq=1, job_id=job, nodes=[node])
        assert post(url, secret, status) == 200

    # 1. A node fault, carried out completely, then kill -9 and restart.
    assert post(url, secret, fatal(1, "101", "node2")) == 200
    wait_for(lambda: action_status(run_dir, "Release", "101") == ["done"], what="release 101")
    proc.kill9()
    url = proc.start()
    # The same failure reported again (the supervisor's copy) and the poll seeing Slurm's
    # restart count: no second requeue.
    assert post(url, secret, fatal(1, "101", "node2", seq=10)) == 200
    sup = fatal(1, "101", "node2", seq=0)
    sup.incarnation, sup.launch, sup.restarts = "supervisor:101.0.0", 0, 0
    assert post(url, secret, sup) == 200
    wait_for(lambda: len(calls(root, "squeue")) >= 2, what="a squeue poll after restart")

    # 2. kill -9 while the requeue of replica 0 is in flight (the fake scontrol takes 1.5 s).
    assert post(url, secret, fatal(0, "100", "node1")) == 200
    wait_for(lambda: action_status(run_dir, "Requeue", "100") == ["started"], what="started")
    proc.kill9()
    url = proc.start()
    wait_for(
        lambda: action_status(run_dir, "Release", "100") == ["done"], what="resumed release 100"
    )
    assert action_status(run_dir, "Requeue", "100") in (["done"], ["skipped"])

    # 3. After two crashes the coordinator still acts on a new failure, once.
    assert post(url, secret, fatal(2, "102", "node3")) == 200
    wait_for(lambda: action_status(run_dir, "Release", "102") == ["done"], what="release 102")

    assert calls(root, "scontrol requeue 101") == ["scontrol requeue 101"]
    assert calls(root, "scontrol requeue 100") == ["scontrol requeue 100"]
    assert calls(root, "scontrol requeue 102") == ["scontrol requeue 102"]
    drains = calls(root, "scontrol update NodeName")
    assert sorted(d.split()[2] for d in drains) == [
        "NodeName=node1",
        "NodeName=node2",
        "NodeName=node3",
    ]
    # One Requeue decision per failure in the journal, and the rebuilt state agrees.
    proc.stop()
    journal = Journal.in_run_dir(run_dir)
    try:
        decided = [s.action for s in journal.actions() if isinstance(s.action, Requeue)]
        assert sorted(a.job_id for a in decided) == ["100", "101", "102"]
        state, open_actions = journal.rebuild(PolicyConfig(replicas=3, min_replicas=2))
        assert open_actions == []
        assert {k: r.requeues for k, r in state.replicas.items()} == {0: 1, 1: 1, 2: 1}
        assert state.replicas[1].slurm_requeues == 0
    finally:
        journal.close()


def test_rebuild_replays_to_the_same_state(tmp_path: Path) -> None:
    cfg = PolicyConfig(replicas=2)
    journal = Journal.in_run_dir(tmp_path)
    state = RunState.new(cfg, {0: "100", 1: "101"})
    events: list[Event] = [
        ReportReceived(ReplicaReport(replica=0, incarnation="a", seq=1, job_id="100"), 1.0),
        ReportReceived(fatal(1, "101", "node2"), 2.0),
        Tick(100.0),
    ]
    for ev in events:
        state, actions = step(state, ev)
        journal.record(ev, actions, nonce=f"n{ev.at}")
    with pytest.raises(KeyError):
        journal.record(Tick(101.0), [], nonce="n1.0")
    rebuilt, open_actions = journal.rebuild(cfg, {0: "100", 1: "101"})
    assert rebuilt.to_dict() == state.to_dict()
    assert [type(s.action).__name__ for s in open_actions] == [
        "Drain",
        "Requeue",
        "Release",
        "Requeue",  # replica 0 fell silent; it named no node, so none is drained
        "Release",
    ]
    assert journal.nonce_seen("n2.0") and not journal.nonce_seen("zzz")
    journal.close()
