"""Slurm away is not a fault of the replicas: a fatal report that arrives while slurmctld cannot
be reached is taken with its own cause, checked against the allocation Slurm gave at its last
answer, and its drain and requeue wait until Slurm answers again.

Before, the report was refused (`503 cannot read job ... from Slurm`) and the replica, whose
leader had exited, was later judged silent: the wrong cause, decided on the coordinator's own
clock. A report naming a node outside that last known allocation is still refused, and a job
Slurm never answered for is still not trusted (503).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from control_harness import RecordingBackend

from runtime.control.http import start_coordinator
from runtime.control.policy import PolicyConfig
from runtime.control.settings import CoordinatorConfig
from runtime.protocol import ReplicaReport, replica_key_id, sign
from slurm.records import JobInfo, SlurmCommandError
from slurm.rundir import read_secret

AWAY = "squeue: error: Unable to contact slurm controller (connect failure)"


class AwaySlurm(RecordingBackend):
    """The recording backend, with slurmctld unreachable while `away` is set."""

    away = False

    def _check(self, what: str) -> None:
        if self.away:
            raise SlurmCommandError([what], 1, AWAY)

    def jobs(self, job_ids: Iterable[str] = (), name: str | None = None) -> list[JobInfo]:
        self._check("squeue")
        return super().jobs(job_ids, name)

    def drain(self, node: str, reason: str) -> bool:
        self._check("scontrol")
        return super().drain(node, reason)

    def set_comment(self, job_id: str, text: str) -> None:
        self._check("scontrol")
        super().set_comment(job_id, text)

    def requeue(self, job_id: str) -> None:
        self._check("scontrol")
        super().requeue(job_id)

    def release(
        self, job_id: str, exclude: Iterable[str] = (), *, forget: Sequence[str] = ()
    ) -> None:
        self._check("scontrol")
        super().release(job_id, list(exclude))


def _report(replica: int, seq: int, job_id: str, **kw: Any) -> bytes:
    return ReplicaReport(replica=replica, incarnation="i", seq=seq, job_id=job_id, **kw).to_json()


async def _scenario(run_dir: Path) -> dict[str, Any]:
    backend = AwaySlurm({"100": "node1", "101": "node2", "102": "node3"})
    cfg = CoordinatorConfig(
        run_dir=run_dir,
        policy=PolicyConfig(replicas=3, report_timeout_s=5.0),
        job_ids={0: "100", 1: "101", 2: "102"},
        poll_jobs=False,
        action_backoff_s=0.2,
        action_backoff_max_s=0.5,
    )
    running = await start_coordinator(cfg, backend)
    secret = read_secret(run_dir / "secret")
    out: dict[str, Any] = {}
    try:
        async with aiohttp.ClientSession() as http:

            async def post(replica: int, body: bytes) -> int:
                headers = sign(secret, replica_key_id(replica), "POST", "/v1/reports", body)
                url = running.url + "/v1/reports"
                async with http.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    return resp.status

            # Slurm answers once for replicas 1 and 2's jobs (a status report asks once).
            out["status"] = [await post(k, _report(k, 1, f"10{k}", step=3)) for k in (1, 2)]
            backend.away = True
            fatal = {"kind": "fatal", "failure": "node", "failed_node": "node2"}
            out["elsewhere"] = await post(2, _report(2, 2, "102", **dict(fatal)))
            out["never_answered"] = await post(0, _report(0, 2, "100", **dict(fatal)))
            out["fatal"] = await post(1, _report(1, 2, "101", **fatal))
            await asyncio.sleep(1.0)  # the executor meets an unreachable Slurm a few times
            out["calls_while_away"] = list(backend.calls)
            out["phase_while_away"] = running.coordinator.state.replicas[1].phase
            backend.away = False
            for _ in range(200):
                if any(c[0] == "requeue" for c in backend.calls):
                    break
                await asyncio.sleep(0.05)
            out["calls"] = list(backend.calls)
            out["cause"] = running.coordinator.state.replicas[1].last_failure
    finally:
        await running.close()
    return out


@pytest.mark.timeout(60)
def test_a_fatal_report_while_slurm_is_away_is_taken_and_acted_on_once_it_answers(
    tmp_path: Path,
) -> None:
    res = asyncio.run(_scenario(tmp_path))
    assert res["status"] == [200, 200]
    # Replica 2 names a node outside its job's last known allocation: refused as ever.
    assert res["elsewhere"] == 403
    # Replica 0's job was never answered for by Slurm: nothing to check the report against.
    assert res["never_answered"] == 503
    assert res["fatal"] == 200
    assert res["calls_while_away"] == []  # nothing counted as done while Slurm is away
    assert res["phase_while_away"] != "training"
    calls = [c for c in res["calls"] if c[0] in ("drain", "comment", "requeue")]
    assert calls[0][:2] in (("drain", "node2"), ("comment", "101")), calls
    assert ("requeue", "101") in calls, calls
    assert "silent" not in str(res["calls"])
    assert "node" in str(res["cause"]), res["cause"]
