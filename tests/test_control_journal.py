"""The coordinator's journal survives `kill -9`: no decision is lost and none is carried out twice.

The coordinator runs as a real process (`fthsdp control --no-lighthouse`) driving Slurm's command
names, which here are small stand-ins on PATH that keep job and node state in a JSON file and log
every call, so the test can count `scontrol requeue`s exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from control_harness import (
    ControlProcess,
    action_status,
    calls,
    fatal,
    install_fake_slurm,
    post,
    wait_for,
)

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
from runtime.control.report import ReplicaReport, read_secret


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
        state, open_actions, _ = journal.rebuild(PolicyConfig(replicas=3, min_replicas=2))
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
    rebuilt, open_actions, _ = journal.rebuild(cfg, {0: "100", 1: "101"})
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
