"""The coordinator's journal survives `kill -9`: no decision is lost and none is carried out twice.

The coordinator runs as a real process (`fthsdp control --no-lighthouse`) driving Slurm's command
names, which here are small stand-ins on PATH that keep job and node state in a JSON file and log
every call, so the test can count `scontrol requeue`s exactly.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
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

from runtime.control.journal.store import Journal
from runtime.control.policy import (
    Event,
    PolicyConfig,
    ReportReceived,
    Requeue,
    RunState,
    Tick,
    step,
)
from runtime.protocol import ReplicaReport
from slurm.rundir import read_secret


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


@pytest.mark.slow
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


# -- snapshots and compaction ----------------------------------------------------------------

REPLICAS = 50
JOB_IDS = {k: str(1000 + k) for k in range(REPLICAS)}


def _traffic(n: int) -> Iterator[Event]:
    """Status reports from every replica in turn, with a node fault and a process fault now
    and then (decisions that must survive any compaction)."""
    for i in range(n):
        k = i % REPLICAS
        at = 1000.0 + i * 0.1
        if i % 9973 == 5000:
            report = ReplicaReport(
                replica=k,
                incarnation=f"n{i}",
                seq=1,
                kind="fatal",
                job_id=JOB_IDS[k],
                failure="node",
                failed_node="node1",
            )
            yield ReportReceived(report, at)
        elif i % 7919 == 3000:
            report = ReplicaReport(
                replica=k,
                incarnation=f"p{i}",
                seq=1,
                kind="fatal",
                job_id=JOB_IDS[k],
                failure="process",
                exit_code=10,
            )
            yield ReportReceived(report, at)
        else:
            report = ReplicaReport(
                replica=k, incarnation=f"w{k}", seq=i + 1, job_id=JOB_IDS[k], step=i // REPLICAS
            )
            yield ReportReceived(report, at)


def _load(path: Path, n: int) -> RunState:
    """Fill a journal as the coordinator would (fast: no fsync); the state it leads to."""
    cfg = PolicyConfig(replicas=REPLICAS)
    journal = Journal(path, durable=False)
    state = RunState.new(cfg, JOB_IDS)
    for i, ev in enumerate(_traffic(n)):
        state, actions = step(state, ev)
        journal.record(ev, actions, nonce=f"{i:032x}", now=ev.at)
    journal.close()
    return state


def _decisions(path: Path) -> list[tuple[object, ...]]:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT id, event_seq, type, payload FROM actions ORDER BY id").fetchall()
    finally:
        db.close()


def test_compaction_keeps_state_and_decisions_and_bounds_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "control.sqlite"
    expected = _load(path, 20_000)
    decisions = _decisions(path)
    assert any(d[2] == "Requeue" for d in decisions) and any(d[2] == "Directive" for d in decisions)
    journal = Journal(path)
    try:
        state, _, last = journal.rebuild(PolicyConfig(replicas=REPLICAS), JOB_IDS)
        assert state.to_dict() == expected.to_dict()
        dropped = journal.compact(state, last, now=1000.0 + 20_000 * 0.1)
        assert dropped > 19_000
        again, _, _ = journal.rebuild(PolicyConfig(replicas=REPLICAS), JOB_IDS)
        assert again.to_dict() == expected.to_dict()
        # What is left: events that decided something, and nonces of the last 2 x 300 s.
        assert len(journal.events()) < 20
        nonces = sqlite3.connect(path).execute("SELECT COUNT(*) FROM nonces").fetchone()[0]
        assert nonces == pytest.approx(600 / 0.1, abs=2)
    finally:
        journal.close()
    assert _decisions(path) == decisions


_COMPACT_CHILD = """
import sys
from pathlib import Path
from runtime.control.journal.store import Journal
from runtime.control.policy import PolicyConfig
journal = Journal(Path(sys.argv[1]))
n = int(sys.argv[2])
state, _, last = journal.rebuild(PolicyConfig(replicas=n), {k: str(1000 + k) for k in range(n)})
print("compacting", flush=True)
journal.compact(state, last)
print("done", flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill_9_during_compaction_loses_no_decision(tmp_path: Path) -> None:
    """A real child process compacts a 120,000-event journal and is SIGKILLed at a few
    delays after it starts; whatever the moment, the journal opens, every decision is there
    and the replayed state is the one before the compaction."""
    source = tmp_path / "source.sqlite"
    expected = _load(source, 120_000)
    decisions = _decisions(source)
    interrupted = 0
    for trial, delay in enumerate((0.0, 0.02, 0.08, 0.2, 0.5)):
        path = tmp_path / f"trial{trial}.sqlite"
        path.write_bytes(source.read_bytes())
        child = subprocess.Popen(
            [sys.executable, "-c", _COMPACT_CHILD, str(path), str(REPLICAS)],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent)),
        )
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "compacting"
            time.sleep(delay)
            child.send_signal(signal.SIGKILL)
            rest = child.stdout.read()
        finally:
            child.kill()
            child.wait(30)
        if "done" not in rest:
            interrupted += 1
        journal = Journal(path)
        try:
            journal.check()
            state, _, _ = journal.rebuild(PolicyConfig(replicas=REPLICAS), JOB_IDS)
            assert state.to_dict() == expected.to_dict()
        finally:
            journal.close()
        assert _decisions(path) == decisions
    assert interrupted >= 1, "no kill landed inside a compaction"


# -- group commit ----------------------------------------------------------------------------

_GROUP_CHILD = """
import asyncio, sys
from pathlib import Path
from runtime.control.journal.store import Journal
from runtime.control.journal.writer import GroupWriter, transient
from runtime.control.policy import PolicyConfig, RunState, step
sys.path.insert(0, sys.argv[2])
from test_control_journal import JOB_IDS, REPLICAS, _traffic

async def main() -> None:
    journal = Journal(Path(sys.argv[1]))
    writer = GroupWriter(journal)
    state = RunState.new(PolicyConfig(replicas=REPLICAS), JOB_IDS)
    for i, ev in enumerate(_traffic(10**9)):
        state, actions = step(state, ev)
        durable = not transient(ev, actions)
        seq, _, done = writer.record(ev, actions, nonce=f"{i:032x}", durable=durable)
        if done is not None:
            await done
            print("durable", seq, flush=True)
        elif i % 50 == 0:
            await asyncio.sleep(0)  # let commits land, as the coordinator's loop does

asyncio.run(main())
"""


@pytest.mark.timeout(300)
def test_kill_9_under_group_commit_keeps_a_prefix_with_every_acknowledged_decision(
    tmp_path: Path,
) -> None:
    """A real child process writes reports through the group writer (status reports not
    awaited, decisions awaited) and is SIGKILLed mid-stream: the journal holds events 1..N
    without a gap (a prefix of what was applied), every decision it acknowledged is there,
    and replaying it gives the state the same events give."""
    path = tmp_path / "control.sqlite"
    here = str(Path(__file__).resolve().parent)
    child = subprocess.Popen(
        [sys.executable, "-c", _GROUP_CHILD, str(path), here],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(Path(here).parent)),
    )
    acked: list[int] = []
    try:
        assert child.stdout is not None
        while len(acked) < 4:
            line = child.stdout.readline()
            assert line.startswith("durable "), line
            acked.append(int(line.split()[1]))
        child.send_signal(signal.SIGKILL)
        for line in child.stdout:
            acked.append(int(line.split()[1]))  # acknowledged before the kill landed
    finally:
        child.kill()
        child.wait(30)
    journal = Journal(path)
    try:
        journal.check()
        events = journal.events()
        seqs = [seq for seq, _ in events]
        assert seqs == list(range(1, len(seqs) + 1))
        assert set(acked) <= set(seqs)
        state, _, last = journal.rebuild(PolicyConfig(replicas=REPLICAS), JOB_IDS)
        expected = RunState.new(PolicyConfig(replicas=REPLICAS), JOB_IDS)
        for ev in list(_traffic(last)):
            expected, _ = step(expected, ev)
        assert state.to_dict() == expected.to_dict()
    finally:
        journal.close()


def test_group_writer_batches_ids_nonces_and_refuses_after_a_failed_commit(
    tmp_path: Path,
) -> None:
    """Ids are handed out in queue order and commits are grouped; a nonce is a replay while
    queued and after its commit; a commit that fails (a table gone) fails its waiters, and
    every later write is refused with `JournalUnavailable`, never committed after the gap."""
    from runtime.control.journal.writer import GroupWriter, JournalUnavailable, transient

    path = tmp_path / "control.sqlite"

    async def scenario() -> dict[str, object]:
        journal = Journal(path)
        writer = GroupWriter(journal)
        out: dict[str, object] = {}
        with pytest.raises(RuntimeError):
            journal.record(Tick(1.0), [])  # the writer owns the ids now
        state = RunState.new(PolicyConfig(replicas=REPLICAS), JOB_IDS)
        seqs, futures = [], []
        for i, ev in enumerate(_traffic(5200)):
            state, actions = step(state, ev)
            seq, stored, done = writer.record(
                ev, actions, nonce=f"{i:032x}", durable=not transient(ev, actions)
            )
            seqs.append(seq)
            if done is not None:
                futures.append((done, stored))
        with pytest.raises(KeyError):
            writer.record(Tick(2.0), [], nonce=f"{5100:032x}")  # queued, not committed yet
        await asyncio.gather(*(f for f, _ in futures))
        await writer.flush()
        with pytest.raises(KeyError):
            writer.record(Tick(2.0), [], nonce=f"{5:032x}")  # committed
        out["seqs"] = seqs
        out["commits"] = writer.commits
        out["decided"] = [s.id for _, stored in futures for s in stored]
        # A real failure: the attempts table vanishes under the writer.
        other = sqlite3.connect(path)
        other.execute("DROP TABLE attempts")
        other.commit()
        other.close()
        first = writer.attempt(1, "started")
        with pytest.raises(JournalUnavailable):
            await first
        with pytest.raises(JournalUnavailable):
            writer.record(Tick(3.0), [])
        out["rows_after"] = journal.last_seq()
        await writer.close()
        journal.close()
        return out

    out = asyncio.run(scenario())
    assert out["seqs"] == list(range(1, 5201))
    assert isinstance(out["commits"], int) and out["commits"] < 5200  # grouped
    decided = out["decided"]
    assert isinstance(decided, list) and decided == list(range(1, len(decided) + 1))
    assert out["rows_after"] == 5200
    journal = Journal(path)
    try:
        _, _, last = journal.rebuild(PolicyConfig(replicas=REPLICAS), JOB_IDS)
        assert last == 5200
        assert [s.id for s in journal.actions()] == decided
    finally:
        journal.close()
