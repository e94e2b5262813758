"""Mass silence on a real coordinator: when every leader stops reporting at once, nothing is
drained or requeued; the outage is journaled, shown in `/v1/state` and `/metrics`, and clears
when reports come back; one replica silent on its own afterwards is still requeued."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from control_harness import RecordingBackend

from runtime.control.http import start_coordinator
from runtime.control.policy import Note, PolicyConfig
from runtime.control.settings import CoordinatorConfig
from runtime.protocol import ReplicaReport, replica_key_id, sign
from slurm.rundir import read_secret

TIMEOUT_S = 1.0


async def _until(pred: Callable[[], object], what: str, limit_s: float = 20.0) -> None:
    deadline = time.monotonic() + limit_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def _scenario(run_dir: Path) -> dict[str, Any]:
    backend = RecordingBackend({"100": "node1", "101": "node2", "102": "node3"})
    cfg = CoordinatorConfig(
        run_dir=run_dir,
        policy=PolicyConfig(replicas=3, min_replicas=1, report_timeout_s=TIMEOUT_S),
        job_ids={0: "100", 1: "101", 2: "102"},
        poll_jobs=False,
        tick_s=0.1,
    )
    running = await start_coordinator(cfg, backend)
    coord = running.coordinator
    coord.executor.detect_s = 0.0  # no slurmctld here to be given time to see a dead node
    secret = read_secret(run_dir / "secret")
    seq = dict.fromkeys(range(3), 0)
    reporting: set[int] = set()
    out: dict[str, Any] = {}

    async def leaders(http: aiohttp.ClientSession) -> None:
        while True:
            for k in sorted(reporting):
                seq[k] += 1
                body = ReplicaReport(
                    replica=k, incarnation=f"i{k}", seq=seq[k], job_id=str(100 + k), step=seq[k]
                ).to_json()
                headers = sign(secret, replica_key_id(k), "POST", "/v1/reports", body)
                async with http.post(running.url + "/v1/reports", data=body, headers=headers) as r:
                    assert r.status == 200, r.status
            await asyncio.sleep(0.1)

    async def metric(name: str) -> float | None:
        async with http.get(running.url + "/metrics") as r:
            for line in (await r.text()).splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        return None

    def phases() -> list[str]:
        return [r.phase for _, r in sorted(coord.state.replicas.items())]

    try:
        async with aiohttp.ClientSession() as http:
            task = asyncio.ensure_future(leaders(http))
            try:
                reporting.update(range(3))
                await _until(lambda: phases() == ["training"] * 3, "all training")
                reporting.clear()  # every leader falls silent at once
                await _until(lambda: coord.state.outage is not None, "the outage")
                since = float(coord.state.outage["since"])  # type: ignore[index]
                out["outage"] = dict(coord.state.outage)  # type: ignore[arg-type]
                out["metric during"] = await metric("fthsdp_control_mass_silence")
                # Several report timeouts into the outage: still nothing decided.
                await _until(lambda: coord.clock() > since + 3 * TIMEOUT_S, "3 timeouts")
                out["calls during"] = list(backend.calls)
                out["phases during"] = phases()
                out["view"] = coord.state_view()["outage"]
                reporting.update(range(3))
                await _until(lambda: coord.state.outage is None, "the outage to end")
                out["metric after"] = await metric("fthsdp_control_mass_silence")
                reporting.discard(2)  # now one replica alone falls silent: its own fault
                await _until(lambda: ("requeue", "102") in backend.calls, "replica 2 requeued")
                out["calls after"] = list(backend.calls)
                out["outage after"] = coord.state.outage
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        out["notes"] = [
            a.text
            for s in coord.journal.actions()
            if isinstance((a := s.action), Note) and a.text.startswith("control plane")
        ]
    finally:
        await running.close()
    return out


@pytest.mark.timeout(90)
def test_every_leader_silent_at_once_drains_nothing(tmp_path: Path) -> None:
    out = asyncio.run(_scenario(tmp_path))
    assert out["outage"]["silent"] == [0, 1, 2] and out["outage"]["watched"] == 3
    assert out["view"] == out["outage"]
    assert out["calls during"] == []
    assert out["phases during"] == ["training"] * 3
    assert out["metric during"] == 1.0
    assert out["metric after"] == 0.0
    assert len(out["notes"]) == 2, out["notes"]
    assert "3 of 3 replicas silent at once" in out["notes"][0]
    assert "reports are back" in out["notes"][1]
    assert out["outage after"] is None
    assert out["calls after"][0][:2] == ("drain", "node3")
    assert ("requeue", "102") in out["calls after"]
    assert not [c for c in out["calls after"] if c[1] in ("node1", "node2", "100", "101")]
