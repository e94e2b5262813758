"""The coordinator end to end (HTTP, journal, policy, fake Slurm): a replica 2x slow from its
first step is detected,
evicted once through the tier-2 path with the straggler drain reason, shown in the state view,
and exported on /metrics; a restarted coordinator remembers the eviction."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from control_harness import RecordingBackend  # the fake Slurm that records calls
from prometheus_client.parser import text_string_to_metric_families

from runtime.control.http import start_coordinator
from runtime.control.policy import PolicyConfig
from runtime.control.settings import CoordinatorConfig
from runtime.control.straggler.detect import StragglerConfig
from runtime.protocol import CONTROL_KEY, ReplicaReport, replica_key_id, sign
from slurm.rundir import read_secret

JOBS = {0: "100", 1: "101", 2: "102"}
#: Each replica's two nodes, as Slurm lists them (the coordinator takes nodes from Slurm).
ALLOCATIONS = {"100": "node[1-2]", "101": "node[3-4]", "102": "node[5-6]"}


def _config(run_dir: Path) -> CoordinatorConfig:
    return CoordinatorConfig(
        run_dir=run_dir,
        policy=PolicyConfig(replicas=3, min_replicas=2, report_timeout_s=600.0),
        job_ids=JOBS,
        poll_jobs=False,
        total_steps=100_000,
        # The default warm-up hold (60 s) is for training again after a recovery: the run's
        # first start is none, so a replica slow from its first step is judged at once.
        straggler=StragglerConfig(),
    )


async def _scenario(run_dir: Path) -> dict[str, Any]:
    backend = RecordingBackend(ALLOCATIONS)
    running = await start_coordinator(_config(run_dir), backend)
    secret = read_secret(run_dir / "secret")
    out: dict[str, Any] = {}
    try:
        async with aiohttp.ClientSession() as http:
            seq = 0
            for step in range(1, 81):
                for r in range(3):
                    seq += 1
                    compute = 0.4 if r == 1 else 0.2  # slow from its first step
                    body = ReplicaReport(
                        replica=r,
                        incarnation=f"inc{r}",
                        seq=seq,
                        job_id=JOBS[r],
                        nodes=[f"node{2 * r + 1}", f"node{2 * r + 2}"],
                        step=step,
                        participants=3,
                        quorum_id=1,
                        step_time_s=0.45,
                        compute_s=compute,
                        allreduce_wait_s=0.45 - compute,
                        rank_compute_s=[0.2, 0.2, compute, 0.2],
                    ).to_json()
                    key = replica_key_id(r)
                    headers = sign(secret, key, "POST", "/v1/reports", body)
                    async with http.post(
                        running.url + "/v1/reports", data=body, headers=headers
                    ) as resp:
                        assert resp.status == 200, await resp.text()
            for _ in range(50):  # the Slurm actions run in the background
                if ("release", "101") in backend.calls:
                    break
                await asyncio.sleep(0.05)
            headers = sign(secret, CONTROL_KEY, "GET", "/v1/state")
            async with http.get(running.url + "/v1/state", headers=headers) as resp:
                out["state"] = await resp.json()
            async with http.get(running.url + "/metrics") as resp:
                out["metrics"] = await resp.text()
    finally:
        await running.close()
    out["calls"] = backend.calls
    again = await start_coordinator(_config(run_dir), RecordingBackend())
    try:
        out["evictions_after_restart"] = again.coordinator.stragglers.monitor.evictions
    finally:
        await again.close()
    return out


@pytest.mark.timeout(120)
def test_slow_replica_is_evicted_once_with_the_straggler_reason(tmp_path: Path) -> None:
    out = asyncio.run(_scenario(tmp_path))
    calls = out["calls"]
    drains = [c for c in calls if c[0] == "drain"]
    assert drains == [("drain", "node4", "fthsdp: straggler: node4 2.0x")]
    assert [c for c in calls if c[0] == "requeue"] == [("requeue", "101")]
    assert ("release", "101") in calls
    assert not any(c[1] in ("100", "102") for c in calls if c[0] in ("requeue", "release"))

    state = out["state"]
    rows = {r["replica"]: r for r in state["replicas"]}
    assert rows[1]["phase"] == "requeued"
    assert rows[1]["last_failure"] == "straggler: node4 2.0x"
    assert rows[1]["straggler"] == "straggler"
    assert rows[0]["straggler"] == "ok" and rows[2]["straggler"] == "ok"
    assert rows[1]["compute_s"] == 0.4 and rows[0]["allreduce_wait_s"] == pytest.approx(0.25)
    assert state["evictions"] == 1
    assert state["requeues_by_reason"]["straggler"] == 1
    assert state["requeues_by_reason"]["fault"] == 0
    assert {"node": "node4", "reason": "fthsdp: straggler: node4 2.0x"} in state["drained"]
    (decision,) = state["straggler_decisions"]
    assert decision["action"] == "evict" and decision["replica"] == 1
    assert state["ettr"] is not None and 0.0 < state["ettr"] <= 1.0

    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(out["metrics"])
        for s in f.samples
    }
    assert samples[("fthsdp_run_straggler_evictions_total", ())] == 1
    key = ("fthsdp_replica_straggler", (("replica", "1"), ("verdict", "straggler")))
    assert samples[key] == 1
    assert samples[("fthsdp_replica_compute_seconds", (("replica", "1"),))] == 0.4
    assert samples[("fthsdp_run_participants", ())] == 3
    assert samples[("fthsdp_run_drained_nodes", ())] == 1
    assert samples[("fthsdp_run_requeues_total", (("reason", "straggler"),))] == 1

    assert out["evictions_after_restart"] == 1
