"""The coordinator under load: decisions wait for their group commit, a stalled journal sheds
reports with 503 before any signature is checked, and the per-report copies stay cheap and
complete (benchmarks/control_load.py measures the rates)."""

from __future__ import annotations

import asyncio
import copy
import sqlite3
from dataclasses import fields
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from control_harness import RecordingBackend

from runtime.control.http import start_coordinator
from runtime.control.policy import PolicyConfig, ReplicaState
from runtime.control.settings import CoordinatorConfig
from runtime.protocol import ReplicaReport, replica_key_id, sign
from slurm.rundir import read_secret


def _body(seq: int, **kw: Any) -> bytes:
    return ReplicaReport(replica=1, incarnation="i", seq=seq, job_id="101", **kw).to_json()


async def _stalled_journal(run_dir: Path) -> dict[str, Any]:
    backend = RecordingBackend({"100": "node1", "101": "node2"})
    cfg = CoordinatorConfig(
        run_dir=run_dir,
        policy=PolicyConfig(replicas=2),
        job_ids={0: "100", 1: "101"},
        poll_jobs=False,
        max_queue_s=0.5,
    )
    running = await start_coordinator(cfg, backend)
    coord = running.coordinator
    secret = read_secret(run_dir / "secret")
    url = running.url + "/v1/reports"
    out: dict[str, Any] = {}
    blocker = sqlite3.connect(run_dir / "control.sqlite", isolation_level=None)
    try:
        async with aiohttp.ClientSession() as http:

            async def post(body: bytes, signed: bool = True) -> tuple[int, str | None]:
                headers = sign(secret, replica_key_id(1), "POST", "/v1/reports", body)
                async with http.post(url, data=body, headers=headers if signed else {}) as r:
                    await r.read()
                    return r.status, r.headers.get("Retry-After")

            out["before"] = await post(_body(1, step=1))
            await coord.flush()
            events_before = len(coord.journal.events())
            # Another process holds the database's write lock: the writer's commit waits.
            blocker.execute("BEGIN EXCLUSIVE")
            out["status_while_stalled"] = await post(_body(2, step=2))  # not awaited
            fatal = asyncio.ensure_future(
                post(_body(3, kind="fatal", failure="node", failed_node="node2"))
            )
            await asyncio.sleep(0.2)
            out["fatal_answered_while_stalled"] = fatal.done()
            while coord.writer is not None and coord.writer.backlog_s() <= 0.5:
                await asyncio.sleep(0.05)
            out["shed_signed"] = await post(_body(4, step=4))
            out["shed_unsigned"] = await post(b"{}", signed=False)
            out["calls_while_stalled"] = list(backend.calls)
            blocker.execute("ROLLBACK")
            out["fatal"] = await asyncio.wait_for(fatal, 30)
            for _ in range(200):
                if len(backend.calls) >= 2:
                    break
                await asyncio.sleep(0.05)
            out["calls"] = [c[:2] for c in backend.calls]
            out["after"] = await post(_body(5, step=5))
            await coord.flush()
            out["new_events"] = len(coord.journal.events()) - events_before
            out["refusals"] = coord.refusals.snapshot()
    finally:
        blocker.close()
        await running.close()
    return out


@pytest.mark.timeout(120)
def test_decisions_wait_for_their_commit_and_a_stalled_journal_sheds_reports(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    out = asyncio.run(_stalled_journal(run_dir))
    assert out["before"] == (200, None)
    # A status report that decided nothing is acknowledged before its commit...
    assert out["status_while_stalled"] == (200, None)
    # ...a fatal report is answered, and acted on, only once its decision is on disk.
    assert out["fatal_answered_while_stalled"] is False
    assert out["calls_while_stalled"] == []
    assert out["fatal"] == (200, None)
    assert out["calls"][:2] == [("drain", "node2"), ("requeue", "101")]
    # Past the queue limit every report gets 503 with Retry-After, signed or not (nothing
    # is checked, queued or stored for it).
    assert out["shed_signed"][0] == 503 and int(out["shed_signed"][1]) >= 1
    assert out["shed_unsigned"][0] == 503
    assert out["refusals"]["503 /v1/reports"] == 2
    assert out["after"] == (200, None)
    # The stalled status report, the fatal one and the last one; none of the shed ones.
    assert out["new_events"] == 3


def test_replica_state_copy_shares_no_container() -> None:
    """Every event copies its replica's state by hand (`ReplicaState.__deepcopy__`): a field
    added later that holds a container must be copied there too, or old and new states would
    share it."""
    r = ReplicaState(replica=3)
    for f in fields(ReplicaState):
        value = getattr(r, f.name)
        if isinstance(value, list):
            setattr(r, f.name, ["x"])
        elif isinstance(value, dict):
            setattr(r, f.name, {"i": ["100", 0, 0, 1]})
    r.phase_since = 5.0
    new = copy.deepcopy(r)
    assert new == r
    for f in fields(ReplicaState):
        value = getattr(r, f.name)
        if isinstance(value, list | dict | set):
            assert getattr(new, f.name) is not value, f.name
    new.incarnations["i"][3] = 2
    assert r.incarnations["i"][3] == 1


async def _compacting(run_dir: Path) -> dict[str, Any]:
    backend = RecordingBackend({"100": "node1", "101": "node2"})
    cfg = CoordinatorConfig(
        run_dir=run_dir,
        policy=PolicyConfig(replicas=2),
        job_ids={0: "100", 1: "101"},
        poll_jobs=False,
        compact_every=5,
    )
    running = await start_coordinator(cfg, backend)
    coord = running.coordinator
    secret = read_secret(run_dir / "secret")
    try:
        async with aiohttp.ClientSession() as http:
            for seq in range(1, 13):
                body = _body(seq, step=seq)
                headers = sign(secret, replica_key_id(1), "POST", "/v1/reports", body)
                async with http.post(running.url + "/v1/reports", data=body, headers=headers) as r:
                    assert r.status == 200
        await coord.flush()
        state = coord.state.to_dict()
        snapshot = coord.journal.snapshot()
        events = len(coord.journal.events())
    finally:
        await running.close()
    return {"state": state, "snapshot": snapshot, "events": events}


@pytest.mark.timeout(60)
def test_compaction_through_the_group_writer_keeps_the_state(tmp_path: Path) -> None:
    """The coordinator's snapshots go through the writer thread (serialised there, behind the
    events they cover): the journal shrinks and a restart replays to the same state."""
    from runtime.control.journal.store import Journal

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    out = asyncio.run(_compacting(run_dir))
    assert out["snapshot"] is not None and out["snapshot"][0] >= 10
    assert out["events"] < 5  # 13 events in all (a start and 12 reports), compacted
    journal = Journal.in_run_dir(run_dir)
    try:
        state, _, _ = journal.rebuild(PolicyConfig(replicas=2), {0: "100", 1: "101"})
    finally:
        journal.close()
    assert state.to_dict() == out["state"]
