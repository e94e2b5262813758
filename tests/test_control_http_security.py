"""The coordinator refuses what is not an authentic, fresh, well-formed report of a known replica
signed with that replica's own key, counts the refusal in memory (no journal row), and changes
nothing; its secret is private and it binds where told."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from control_harness import RecordingBackend

from runtime.control.auth import ensure_secret
from runtime.control.http import own_address, start_coordinator
from runtime.control.policy import PolicyConfig
from runtime.control.settings import CoordinatorConfig
from runtime.protocol import (
    CONTROL_KEY,
    MAX_REPORT_BYTES,
    NONCE_HEADER,
    SIGNATURE_HEADER,
    ReplicaReport,
    replica_key_id,
    sign,
)
from slurm.errors import EnvironmentProblem
from slurm.rundir import read_secret


def _report(replica: int = 1, seq: int = 1, **kw: Any) -> bytes:
    kw.setdefault("job_id", "101")
    return ReplicaReport(replica=replica, incarnation="i", seq=seq, **kw).to_json()


def _signed(secret: bytes, body: bytes, replica: int = 1, **kw: Any) -> dict[str, str]:
    return sign(secret, replica_key_id(replica), "POST", "/v1/reports", body, **kw)


async def _scenario(run_dir: Path) -> dict[str, Any]:
    backend = RecordingBackend({"100": "node1", "101": "node2"})
    cfg = CoordinatorConfig(
        run_dir=run_dir,
        policy=PolicyConfig(replicas=2),
        job_ids={0: "100", 1: "101"},
        poll_jobs=False,
    )
    running = await start_coordinator(cfg, backend)
    secret = read_secret(run_dir / "secret")
    url = running.url + "/v1/reports"
    results: dict[str, Any] = {"url": running.url}
    try:
        async with aiohttp.ClientSession() as http:

            async def post(body: bytes, headers: dict[str, str], path: str = url) -> int:
                async with http.post(path, data=body, headers=headers) as resp:
                    await resp.read()
                    return resp.status

            async def state() -> Any:
                headers = sign(secret, CONTROL_KEY, "GET", "/v1/state")
                async with http.get(running.url + "/v1/state", headers=headers) as resp:
                    data = await resp.json()
                data.pop("coordinator_started_at")
                data.pop("refusals")
                return data

            before = await state()
            fatal = _report(kind="fatal", failure="node", failed_node="node2")
            good = _signed(secret, fatal)
            forged = dict(good, **{SIGNATURE_HEADER: "0" * 64})
            other_key = sign(b"not-the-secret", replica_key_id(1), "POST", "/v1/reports", fatal)
            stale = _signed(secret, fatal, now=1_000_000.0)
            big = b"{" + b" " * (MAX_REPORT_BYTES + 10) + b"}"
            unknown = _report(replica=7, kind="fatal", failure="node")
            other_job = _report(job_id="55", kind="fatal", failure="node")
            cases = {
                "unsigned": (fatal, {"Content-Type": "application/json"}),
                "forged": (fatal, forged),
                "wrong key": (fatal, other_key),
                "stale": (fatal, stale),
                "tampered body": (fatal.replace(b"node2", b"node3"), good),
                "oversized": (big, _signed(secret, big)),
                "not json": (b"{not json", None),
                "json list": (b"[1]", None),
                "unknown field": (b'{"replica":1,"seq":1,"incarnation":"i","x":1}', None),
                "wrong type": (b'{"replica":"1","seq":1,"incarnation":"i"}', None),
                "unknown replica": (unknown, _signed(secret, unknown, replica=7)),
                "job of another run": (other_job, None),
                "another replica's key": (fatal, _signed(secret, fatal, replica=0)),
                "control key": (fatal, sign(secret, CONTROL_KEY, "POST", "/v1/reports", fatal)),
                "signed for another path": (
                    fatal,
                    sign(secret, replica_key_id(1), "POST", "/v1/requeue", fatal),
                ),
            }
            statuses = {}
            for name, (body, headers) in cases.items():
                statuses[name] = await post(body, headers or _signed(secret, body))
            results["statuses"] = statuses
            results["unchanged"] = (await state()) == before
            results["calls_after_refusals"] = list(backend.calls)
            results["accepted"] = await post(fatal, good)
            results["replayed"] = await post(fatal, good)
            replay_new_sig = _signed(secret, fatal)
            replay_new_sig[NONCE_HEADER] = good[NONCE_HEADER]
            results["replayed_nonce"] = await post(fatal, replay_new_sig)
            # A signed report re-posted to the operator's endpoint is refused.
            results["report_to_requeue"] = await post(fatal, good, running.url + "/v1/requeue")
            for _ in range(50):
                if len(backend.calls) >= 3:
                    break
                await asyncio.sleep(0.05)
            results["calls"] = list(backend.calls)
            path = "/v1/replicas/1/directive?job=101"
            asked = sign(secret, replica_key_id(1), "GET", path)
            async with http.get(running.url + path, headers=asked) as resp:
                results["directive"] = await resp.json()
            async with http.get(running.url + path) as resp:
                results["unsigned_directive"] = resp.status
            async with http.get(running.url + "/v1/state") as resp:
                results["unsigned_state"] = resp.status
        results["refusals"] = running.coordinator.refusals.snapshot()
        results["rejections"] = running.coordinator.journal.rejections()
    finally:
        await running.close()
    return results


@pytest.mark.timeout(60)
def test_refusals_change_nothing_and_are_not_journaled(tmp_path: Path) -> None:
    res = asyncio.run(_scenario(tmp_path))
    statuses = res["statuses"]
    assert all(400 <= s < 500 for s in statuses.values()), statuses
    assert statuses["unsigned"] == 401
    assert statuses["forged"] == statuses["wrong key"] == statuses["stale"] == 401
    assert statuses["tampered body"] == statuses["signed for another path"] == 401
    assert statuses["oversized"] == 413
    assert statuses["unknown replica"] == 404
    assert statuses["job of another run"] == 409
    assert statuses["another replica's key"] == statuses["control key"] == 403
    assert statuses["not json"] == statuses["unknown field"] == statuses["wrong type"] == 400
    assert res["unchanged"]
    assert res["calls_after_refusals"] == []
    # Refusals are counted in memory, never written to the journal.
    assert res["rejections"] == []
    assert sum(res["refusals"].values()) == len(statuses) + 5  # + replays, unsigned reads
    # The authentic report acts once; replaying it (as-is or with a fresh signature over the
    # same nonce) is refused.
    assert res["accepted"] == 200
    assert res["replayed"] == 409
    assert res["replayed_nonce"] == 401  # a reused nonce under a new MAC does not verify
    assert res["report_to_requeue"] == 401
    assert res["calls"] == [
        ("drain", "node2", "fthsdp: fault: exit None"),
        ("requeue", "101"),
        ("release", "101"),
    ]
    assert res["directive"] == {"directive": "requeue", "delay_s": 0.0, "restarts": 0, "launch": 0}
    assert res["unsigned_directive"] == 401
    assert res["unsigned_state"] == 401


def test_secret_is_private(tmp_path: Path) -> None:
    ensure_secret(tmp_path)
    mode = stat.S_IMODE((tmp_path / "secret").stat().st_mode)
    assert mode == 0o600
    os.chmod(tmp_path / "secret", 0o644)
    with pytest.raises(EnvironmentProblem, match="0600"):
        ensure_secret(tmp_path)


@pytest.mark.timeout(30)
def test_binds_only_where_told(tmp_path: Path) -> None:
    async def run() -> list[Any]:
        cfg = CoordinatorConfig(
            run_dir=tmp_path, policy=PolicyConfig(replicas=1), host="127.0.0.1", poll_jobs=False
        )
        running = await start_coordinator(cfg, RecordingBackend())
        try:
            return list(running.runner.addresses)
        finally:
            await running.close()

    addresses = asyncio.run(run())
    assert [a[0] for a in addresses] == ["127.0.0.1"]
    assert own_address() not in ("0.0.0.0", "::", "")


def test_control_file_is_written_atomically(tmp_path: Path) -> None:
    from slurm.rundir import write_control_file

    write_control_file(tmp_path, {"coordinator": "http://a:1"})
    write_control_file(tmp_path, {"coordinator": "http://b:2"})
    assert json.loads((tmp_path / "control.json").read_text()) == {"coordinator": "http://b:2"}
    assert [p.name for p in tmp_path.iterdir()] == ["control.json"]


def test_the_leader_fits_its_report_to_what_the_coordinator_accepts() -> None:
    from runtime.report_sender import fit_report_fields

    fields = fit_report_fields(
        {"last_error": "e" * 5000, "evidence": ["x" * 900] * 40, "failed_node": "host.example.org"}
    )
    report = ReplicaReport(replica=0, incarnation="i", seq=1, job_id="5", kind="fatal", **fields)
    data = json.loads(report.to_json())
    assert ReplicaReport.from_dict(data).failed_node == "host.example.org"
    bad = fit_report_fields({"failed_node": "node[1-2]"})
    assert bad["failed_node"] is None
    assert len(fields["evidence"]) == 16 and len(fields["last_error"]) == 2000
