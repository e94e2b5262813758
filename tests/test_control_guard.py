"""The connection guard on a real coordinator over loopback: it counts what aiohttp counts.

A connection is past its header only once aiohttp has parsed a request from it (not when
`\\r\\n\\r\\n` shows up in its bytes: aiohttp skips leading blank lines), stays evictable until its
request is authenticated, has a body deadline, and one source address holds at most
`per_peer_connections` unauthenticated connections. The attacker speaks from 127.0.0.2-4, the
leaders from 127.0.0.1 (all of 127/8 reaches a socket bound to 127.0.0.1 on Linux).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from control_harness import RecordingBackend, two_replica_config

from runtime.control.guard import GuardConfig
from runtime.control.http import start_coordinator
from runtime.control.settings import CoordinatorConfig
from runtime.protocol import ReplicaReport, replica_key_id, sign
from slurm.rundir import read_secret

HALF = b"POST /v1/reports HTTP/1.1\r\nHost: x\r\nX-Pad: "
#: A header's end first, then half a header: aiohttp skips the blank lines, no request yet.
BYPASS = b"\r\n\r\n" + HALF
#: A whole header (signed-looking, so the handler waits for the body) whose body never comes.
NO_BODY = (
    b"POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n"
    b"X-Fthsdp-Key: replica-0\r\nX-Fthsdp-Timestamp: %d\r\nX-Fthsdp-Nonce: 0123456789abcdef\r\n"
    b"X-Fthsdp-Signature: " + b"0" * 64 + b"\r\n\r\n"
)


def _no_body() -> bytes:
    return NO_BODY.replace(b"%d", str(int(time.time())).encode())


def _config(run_dir: Path, guard: GuardConfig) -> CoordinatorConfig:
    return two_replica_config(run_dir, guard=guard)


async def _open(port: int, payload: bytes, source: str) -> asyncio.StreamReader:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    writer.write(payload)
    await writer.drain()
    _HELD.append(writer)
    return reader


_HELD: list[asyncio.StreamWriter] = []


async def _closed(reader: asyncio.StreamReader, within_s: float) -> bool:
    """True if the coordinator closed the connection within `within_s` seconds."""
    try:
        await asyncio.wait_for(reader.read(), within_s)
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


async def _report(url: str, secret: bytes, replica: int, seq: int) -> int:
    body = ReplicaReport(
        replica=replica, incarnation=f"l{replica}", seq=seq, job_id=str(100 + replica)
    ).to_json()
    headers = sign(secret, replica_key_id(replica), "POST", "/v1/reports", body)
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        http.post(url + "/v1/reports", data=body, headers=headers) as resp,
    ):
        return resp.status


def _drop_held() -> None:
    for w in _HELD:
        with contextlib.suppress(Exception):
            w.close()
    _HELD.clear()


async def _deadlines(run_dir: Path) -> dict[str, Any]:
    guard = GuardConfig(header_timeout_s=0.5, body_timeout_s=0.5)
    running = await start_coordinator(_config(run_dir, guard), RecordingBackend())
    port = int(running.url.rsplit(":", 1)[1])
    try:
        bypass = await _open(port, BYPASS, "127.0.0.2")
        no_body = await _open(port, _no_body(), "127.0.0.2")
        # Well past both deadlines (0.5 s; the guard's own body deadline adds 1 s of grace).
        closed = await asyncio.gather(_closed(bypass, 10), _closed(no_body, 10))
        return {"closed": closed, "refusals": running.coordinator.refusals.snapshot()}
    finally:
        _drop_held()
        await running.close()


@pytest.mark.timeout(60)
def test_a_header_end_before_half_a_header_is_still_dropped_at_the_deadline(
    tmp_path: Path,
) -> None:
    out = asyncio.run(_deadlines(tmp_path))
    assert out["closed"] == [True, True]
    assert out["refusals"].get("header timeout") == 1, out["refusals"]
    # The body-less request got the handler's 408; aiohttp would then linger reading a body
    # for 10 s more, and the guard's own body deadline drops the connection instead.
    assert out["refusals"].get("408 /v1/reports") == 1
    assert out["refusals"].get("body timeout") == 1


async def _held_past_the_cap(run_dir: Path) -> dict[str, Any]:
    # Deadlines far away: only eviction can make room.
    guard = GuardConfig(
        max_connections=16,
        per_peer_connections=8,
        header_timeout_s=60.0,
        body_timeout_s=60.0,
    )
    running = await start_coordinator(_config(run_dir, guard), RecordingBackend())
    secret = read_secret(run_dir / "secret")
    port = int(running.url.rsplit(":", 1)[1])
    out: dict[str, Any] = {}
    try:
        readers = []
        # cap + 1 = 17 sockets from 3 addresses, each under its own cap of 8, of the two kinds
        # that looked past their header to a guard counting `\r\n\r\n`.
        for i in range(17):
            payload = (BYPASS, _no_body())[i % 2]
            readers.append(await _open(port, payload, f"127.0.0.{2 + i % 3}"))
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        statuses = []
        for seq in range(1, 4):
            for replica in (0, 1):
                statuses.append(await _report(running.url, secret, replica, seq))
        out["statuses"] = statuses
        out["seconds"] = time.monotonic() - t0
        out["refusals"] = running.coordinator.refusals.snapshot()
        out["events"] = len(running.coordinator.journal.events())
    finally:
        _drop_held()
        await running.close()
    return out


@pytest.mark.timeout(60)
def test_leaders_get_through_while_an_attacker_holds_cap_plus_one_sockets(tmp_path: Path) -> None:
    out = asyncio.run(_held_past_the_cap(tmp_path))
    assert out["statuses"] == [200] * 6, out
    assert out["seconds"] < 5.0
    # Room was made by evicting the attacker's connections (one when the 17th came, one per
    # report after that), never by refusing a leader's.
    assert out["refusals"].get("evicted at the connection cap", 0) >= 1, out["refusals"]
    assert "connection cap" not in out["refusals"]


async def _one_peer(run_dir: Path) -> dict[str, Any]:
    guard = GuardConfig(max_connections=64, per_peer_connections=8, header_timeout_s=60.0)
    running = await start_coordinator(_config(run_dir, guard), RecordingBackend())
    secret = read_secret(run_dir / "secret")
    port = int(running.url.rsplit(":", 1)[1])
    out: dict[str, Any] = {}
    try:
        readers = [await _open(port, (HALF, BYPASS)[i % 2], "127.0.0.2") for i in range(20)]
        closed = await asyncio.gather(*(_closed(r, 2.0) for r in readers))
        out["closed"] = closed
        out["report"] = await _report(running.url, secret, 0, 1)
        out["refusals"] = running.coordinator.refusals.snapshot()
    finally:
        _drop_held()
        await running.close()
    return out


@pytest.mark.timeout(60)
def test_one_address_holds_at_most_its_cap(tmp_path: Path) -> None:
    out = asyncio.run(_one_peer(tmp_path))
    # The 12 oldest were evicted as newer ones came; the 8 newest are still held.
    assert out["closed"] == [True] * 12 + [False] * 8
    assert out["refusals"].get("evicted at the per-peer cap") == 12
    assert out["report"] == 200
